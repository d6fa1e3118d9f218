"""`autopar validate`: predicted vs measured throughput on published training runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table

from autopar.cli.common import dump_json
from autopar.cli.render import console
from autopar.validation import DEFAULT_CSV, validate


def run(args: argparse.Namespace) -> int:
    rep = validate(Path(args.csv))
    if args.json:
        print(dump_json({"mape": rep.mape, "max_abs_error": rep.max_abs_error, "predicted_oom": rep.predicted_oom,
                         "rows": [{"id": r.case.row_id, "measured_tokens_per_s_per_gpu": r.case.measured_tokens,
                                   "measured_from": r.case.measured_from, "predicted": r.predicted_tokens,
                                   "error": r.error, "fits": r.fits, "memory_gib": r.memory_gib,
                                   "assumptions": r.case.assumptions} for r in rep.rows],
                         "skipped": rep.skipped}))
        return 0
    out = console()
    t = Table(title=f"Predicted vs measured tokens/s/GPU — {args.csv}", title_justify="left")
    for c in ("row", "layout", "measured", "from", "predicted", "error", "mem GiB", "fits", "assumed"):
        t.add_column(c, justify="right" if c in ("measured", "predicted", "error", "mem GiB") else "left")
    for r in rep.rows:
        t.add_row(r.case.row_id, r.case.layout.short(), f"{r.case.measured_tokens:,.0f}", r.case.measured_from,
                  f"{r.predicted_tokens:,.0f}", f"{r.error:+.1%}", f"{r.memory_gib:.1f}/{r.hbm_gib:.0f}",
                  "yes" if r.fits else "[red]OOM[/red]", "; ".join(r.case.assumptions))
    out.print(t)
    for rid, why in rep.skipped:
        out.print(f"skipped {rid}: {why}")
    out.print(f"[bold]{len(rep.rows)} rows: mean absolute error {rep.mape:.1%}, max {rep.max_abs_error:.1%}; "
              f"predicted OOM for {len(rep.predicted_oom)} layouts that ran[/bold]")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="compare predictions with published measured runs",
                       description="Estimate every row of a published-runs CSV and print predicted vs measured "
                                   "tokens/s/GPU with the per-row error, the mean absolute error and the max.")
    p.add_argument("--csv", default=str(DEFAULT_CSV), help=f"runs file (default: {DEFAULT_CSV.name} shipped in data/)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)
