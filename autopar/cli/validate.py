"""`autopar validate`: predicted vs measured throughput on published training runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.markup import escape

from autopar.cli.common import dump_json
from autopar.cli.render import console, fitted_table
from autopar.errors import AutoparInputError
from autopar.measure.validation import DEFAULT_CSV, summarize_skipped, validate


def run_fit(args: argparse.Namespace) -> int:
    from datetime import date

    from autopar.measure.calibration import (cross_validate_sources, efficiency_for, fit, has_calibrated_block,
                                             rows_from_cases, source_of, stack_efficiency, write_efficiency,
                                             write_stack_efficiency)
    from autopar.measure.intervals import holdout_coverage
    from autopar.specs.loaders import load_hardware, zoo_dir, zoo_names
    from autopar.measure.validation import is_holdout_csv, load_cases
    err = console(stderr=True)
    if is_holdout_csv(_csv_path(args)):
        raise AutoparInputError(f"--fit: {args.csv} is the out-of-sample check (earlier Megatron-Bridge releases, "
                                "never fitted); fit to published_runs.csv (the default --csv) and predict this file with "
                                "'autopar validate --csv' alone")
    if args.write:   # checked before the fit
        from autopar.fileio import check_output_dir
        check_output_dir(args.out, "--out")
    cases, skipped = load_cases(_csv_path(args))
    if not cases:
        raise AutoparInputError(f"{args.csv}: no usable row to fit ({len(skipped)} skipped"
                                + (f"; first: {skipped[0][0]}: {skipped[0][1]}" if skipped else "") + ")")
    rep = fit(cases, loss=args.loss, progress=lambda m: err.print(f"[dim]… {m}[/dim]"))
    out = console()
    # Each constant with its bounds and the rows it moves; a constant at a bound is flagged with the bound's reason
    # (kernel speeds are measured, not fitted). The error figures are in-sample.
    out.print(rep.format(), markup=False, highlight=False)
    if rep.pinned:
        out.print("[yellow]constants at a bound (see README 'Accuracy'):[/yellow] "
                  + ", ".join(c.name for c in rep.pinned))
    for st in sorted({c.stack for c in cases}):
        own = stack_efficiency(rep, st)
        if own:
            out.print(f"stack {st}: its own constants " + ", ".join(f"{k} {v:g}" for k, v in own.items()))
    if args.cv:
        from autopar.measure.record import Comparison, pair_order
        held = cross_validate_sources(cases, loss=args.loss, progress=lambda m: err.print(f"[dim]… {m}[/dim]"))
        cv = held.by_group(rows_from_cases(cases))
        mean = sum(cv.values()) / len(cv)
        out.print("held-out source (fit on the others) mean absolute error: "
                  + ", ".join(f"{k} {v:.1%}" for k, v in cv.items()) + f"; mean over sources {mean:.1%}")
        kept = [c for c in cases if c.row_id in held.predicted]
        rk = pair_order([Comparison(label=c.row_id, predicted=held.predicted[c.row_id], measured=c.measured_tokens)
                         for c in kept], [source_of(c) for c in kept])
        out.print(f"held-out within-source ranking: {rk.share:.1%} ({rk.right} of {rk.pairs} pairs ordered as "
                  f"measured, {rk.ties} predicted ties counted wrong)")
        for rid, why in held.skipped.items():
            out.print(f"  not predictable out of sample: {rid} ({why})")
        runs = _held_out_runs(cases, held)
        _print_coverage(out, *holdout_coverage(runs), "these held-out errors")
    if args.write:
        import shutil
        from autopar.specs.loaders import installed_zoo_dir
        d = Path(args.out)
        if installed_zoo_dir("hardware") and d.resolve() == installed_zoo_dir("hardware").resolve():
            raise AutoparInputError(f"--out {d} is autopar's installed hardware folder; write elsewhere and pass the "
                                    "files with --hardware PATH")
        d.mkdir(parents=True, exist_ok=True)
        note = (f"fitted {date.today()} on {Path(args.csv).name} ({len(cases)} rows): mean absolute error "
                f"{rep.mae_before:.2%} -> {rep.mae_after:.2%}")
        for name in sorted(zoo_names("hardware")):
            hw = load_hardware(name)
            if not has_calibrated_block(zoo_dir("hardware") / f"{name}.yaml"):
                # e.g. report_accel_128: not a GPU running Megatron-class software, so the published runs'
                # overlaps and per-layer overhead say nothing about it
                out.print(f"left {name} as it is: its file has no calibrated block to refresh")
                continue
            target = d / f"{name}.yaml"
            if target.resolve() != (zoo_dir("hardware") / f"{name}.yaml").resolve():
                shutil.copyfile(zoo_dir("hardware") / f"{name}.yaml", target)
            write_efficiency(target, efficiency_for(rep, hw), note)
            out.print(f"wrote the calibrated constants of {name} to {target}")
        # A stack's own constants go beside the hardware files: into the repository's stacks/ when --out is the
        # repository's hardware/ folder (a source checkout), else into DIR/stacks/ (a copy of the stack file), so
        # --out never rewrites a file outside DIR.
        in_repo = d.resolve() == zoo_dir("hardware").resolve() and not installed_zoo_dir("stacks")
        for st in sorted({c.stack for c in cases}):
            own = stack_efficiency(rep, st)
            if not own:
                continue
            target = zoo_dir("stacks") / f"{st}.yaml" if in_repo else d / "stacks" / f"{st}.yaml"
            if not in_repo:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(zoo_dir("stacks") / f"{st}.yaml", target)
            write_stack_efficiency(target, own, note)
            out.print(f"wrote stack {st}'s own constants to {target}")
    if args.cv and args.write_intervals:   # after --write: the stored predictions are of the files as written
        _write_intervals(args, runs, out)
    return 0


def _held_out_runs(cases, held) -> list:
    """Every case predicted out of sample, as :class:`autopar.measure.intervals.HeldOutRun` (its held-out error; its
    in-sample prediction is filled in by :func:`_write_intervals`)."""
    from autopar.measure.calibration import source_of
    from autopar.measure.intervals import HeldOutRun, regime_of
    return [HeldOutRun(c.row_id, source_of(c), regime_of(c.model, c.hardware, c.stack),
                       held.predicted[c.row_id] / c.measured_tokens - 1, 0.0)
            for c in cases if c.row_id in held.predicted]


def _write_intervals(args: argparse.Namespace, runs: list, out) -> None:
    """data/error_bars.yaml from the held-out errors (throughput), each run's prediction by the model as its files
    stand now (read again, after any --write into them: :func:`autopar.measure.intervals.stale_runs` compares
    against it), and the memory errors of the runs whose source prints peak memory (no fitted constant moves
    memory, so those are out of sample as they are)."""
    from dataclasses import replace

    from autopar.measure.intervals import write
    from autopar.measure.published_memory import margins_by_stack, predict_rows
    from autopar.measure.validation import evaluate, load_cases
    from autopar.specs.loaders import installed_zoo_dir, zoo_dir
    if installed_zoo_dir("data"):
        raise AutoparInputError("--write-intervals writes data/error_bars.yaml of a source checkout; this autopar is "
                                "installed from a wheel")
    cases, _ = load_cases(_csv_path(args))
    now = {r.case.row_id: r for r in evaluate(cases)}
    runs = [replace(r, predicted=now[r.row_id].predicted) for r in runs if r.row_id in now]
    peaks = predict_rows()        # every published run that prints its peak memory, in both files
    mem = [(r.regime, r.error) for r in peaks]
    path = zoo_dir("data") / "error_bars.yaml"
    write(path, runs, mem, f"held-out (leave-one-source-out) errors of {len(runs)} runs of {Path(args.csv).name}; "
                           f"memory: {len(mem)} published runs that print peak memory", margins_by_stack(peaks))
    out.print(f"wrote {path} ({len(runs)} held-out throughput errors, {len(mem)} memory errors)")


def _csv_path(args: argparse.Namespace) -> Path:
    if not args.csv.strip():
        raise AutoparInputError("--csv: empty path; give a runs CSV file")
    return Path(args.csv)


def run(args: argparse.Namespace) -> int:
    if args.write and not (args.fit and args.out):
        raise AutoparInputError("--write needs --fit and --out DIR (the folder to write the hardware YAML files to)")
    if args.fit:
        return run_fit(args)
    if args.memory:
        return run_memory(args)
    rep = validate(_csv_path(args))
    if args.json:
        rk = rep.ranking
        print(dump_json({"interval_coverage": _coverage(rep, _csv_path(args)),
                         "mape": rep.mape, "max_abs_error": rep.max_abs_error, "predicted_oom": rep.predicted_oom,
                         "ranking": {"share": rk.share, "right": rk.right, "pairs": rk.pairs, "ties": rk.ties,
                                     "skipped_measured_ties": rk.skipped},
                         "rows": [{"id": r.case.row_id, "measured_tokens_per_s_per_gpu": r.case.measured_tokens,
                                   "measured_from": r.case.measured_from, "predicted": r.predicted_tokens,
                                   "error": r.error, "fits": r.fits, "memory_gib": r.memory_gib,
                                   "assumptions": r.case.assumptions} for r in rep.rows],
                         "breakdown": {k: {g: {"rows": n, "mean_abs_error": mae, "mean_error": b}
                                           for g, (n, mae, b) in v.items()} for k, v in rep.breakdown().items()},
                         "skipped": rep.skipped}))
        return 0
    out = console()
    # the table through the shared width logic (cli/render.fitted_table): at 80 columns the text columns wrap and
    # the least needed columns are dropped, named below it; a column added here needs only its header and cells
    headers = ["row", "layout", "measured", "from", "predicted", "error", "mem GiB", "fits", "assumed"]
    rows = [[r.case.row_id, r.case.layout.short(), f"{r.case.measured_tokens:,.0f}", r.case.measured_from,
             f"{r.predicted_tokens:,.0f}", f"{r.error:+.1%}", f"{r.memory_gib:.1f}/{r.hbm_gib:.0f}",
             "yes" if r.fits else "OOM", "; ".join(r.case.assumptions)] for r in rep.rows]
    out.print(*fitted_table(out.width, f"Predicted vs measured tokens/s/GPU — {args.csv}", headers, rows,
                            left=("row", "layout", "from", "fits", "assumed"),
                            optional=("mem GiB", "fits", "from", "assumed"), wrap_at=20))
    for line in summarize_skipped(rep.skipped):     # repeated reasons as one line each
        out.print(escape(line))
    for grouping, groups in rep.breakdown().items():
        out.print(*fitted_table(out.width, f"Error by {grouping}",
                                [grouping, "rows", "mean |error|", "bias"],
                                [[name, str(n), f"{mae:.1%}", f"{bias:+.1%}"]
                                 for name, (n, mae, bias) in groups.items()],
                                left=(grouping,)))
    out.print("[dim]bias: mean signed error of the group's rows, + = predicted faster than measured[/dim]")
    _print_stored_coverage(rep, out, _csv_path(args))
    rk = rep.ranking
    out.print(f"[bold]{len(rep.rows)} rows: mean absolute error {rep.mape:.2%}, max {rep.max_abs_error:.1%}; "
              f"within-source ranking {rk.share:.1%} ({rk.right} of {rk.pairs} pairs ordered as measured, "
              f"{rk.ties} predicted ties counted wrong); predicted OOM for {len(rep.predicted_oom)} layouts that "
              f"ran[/bold]")
    out.print(f"[dim]ranking: pairs of runs of one source whose measurements differ by 1% or more "
              f"({rk.skipped} closer pairs left out); a pair predicted equal counts as wrong[/dim]")
    return 0


def _coverage(rep, path: Path) -> dict | None:
    """The stored intervals' out-of-sample coverage (:func:`autopar.measure.intervals.holdout_coverage` over the
    held-out errors in data/error_bars.yaml) and how many of this report's runs moved since the file was written;
    None without the file. A runs file other than the one the bands were built from (``path``: the hold-out check,
    a team's own runs) is checked only on the runs the bands hold: its other runs are not new to the bands."""
    from autopar.measure.intervals import SHARE, _table, holdout_coverage, stale_runs, stored_runs
    try:
        runs = stored_runs()
        written = _table().get("written")
    except AutoparInputError:
        return None
    inside, total = holdout_coverage(runs)
    fit_set = path.exists() and DEFAULT_CSV.exists() and path.samefile(DEFAULT_CSV)
    held = {r.row_id for r in runs}
    moved, worst = stale_runs({r.case.row_id: r.predicted for r in rep.rows if fit_set or r.case.row_id in held})
    return {"inside": inside, "runs": total, "share": inside / total if total else None, "stated": SHARE,
            "method": "leave-one-source-out: each run's held-out error against the band built without its source",
            "written": written, "stale_runs": len(moved), "stale_largest_move": worst if moved else 0.0}


def _print_coverage(out, inside: int, total: int, where: str) -> None:
    from autopar.measure.intervals import SHARE, coverage_within
    if not total:
        out.print(f"interval coverage: no held-out run in {where}")
        return
    share = inside / total
    ok = coverage_within(inside, total)
    style = "" if ok else "[yellow]"
    out.print(f"{style}interval coverage, out of sample: {inside} of {total} published runs ({share:.0%}) inside the "
              f"{SHARE:.0%} band built without their own source ({where}; within 5 points of {SHARE:.0%}: "
              f"{'yes' if ok else 'no'}){'' if ok else '[/yellow]'}")


def _print_stored_coverage(rep, out, path: Path) -> None:
    """The out-of-sample coverage of data/error_bars.yaml, and a note when the model moved since it was written."""
    cov = _coverage(rep, path)
    if cov is None:
        out.print("interval coverage: no data/error_bars.yaml (autopar validate --fit --cv --write-intervals)")
        return
    _print_coverage(out, cov["inside"], cov["runs"], f"data/error_bars.yaml of {cov['written']}")
    if cov["stale_runs"]:
        out.print(f"[yellow]note: {cov['stale_runs']} of {len(rep.rows)} runs' predictions moved (by up to "
                  f"{min(cov['stale_largest_move'], 9.99):.1%}) or are new since data/error_bars.yaml was written: "
                  "its bands and coverage are of the earlier model; regenerate them with "
                  "autopar validate --fit --cv --write-intervals[/yellow]")


def run_memory(args: argparse.Namespace) -> int:
    """Published runs that print their peak memory (the memory_gib cells of data/published_runs.csv and
    data/published_memory.csv): predicted vs measured."""
    from rich.table import Table

    from autopar.measure.published_memory import memory_csvs, predict_rows
    rows = predict_rows()
    under = [r for r in rows if r.predicted_gib < r.measured_gib]
    if args.json:
        print(dump_json({"rows": [{"id": r.row_id, "source": r.source, "layout": r.layout,
                                   "measured_peak_gib": r.measured_gib, "predicted_gib": r.predicted_gib}
                                  for r in rows], "under_predicted": [r.row_id for r in under]}))
        return 0
    out = console()
    t = Table(title="Predicted vs measured peak memory per GPU — " + ", ".join(p.name for p in memory_csvs()),
              title_justify="left")
    for c in ("row", "layout", "measured GiB", "predicted GiB*", "predicted/measured"):
        t.add_column(c, justify="left" if c in ("row", "layout") else "right")
    for r in rows:
        t.add_row(r.row_id, r.layout, f"{r.measured_gib:.1f}", f"{r.predicted_gib:.1f}",
                  ("[red]" if r.ratio < 1 else "") + f"{r.ratio:.2f}" + ("[/red]" if r.ratio < 1 else ""))
    out.print(t)
    out.print(f"[bold]{len(rows)} rows: {len(under)} predicted below their measured peak[/bold]")
    out.print("* the allocator's share, as the sources print it (torchtitan: the caching allocator's peak reserved "
              "memory): the prediction less the chip's reserve_gib, which stands for the CUDA context and NCCL "
              "buffers outside it (autopar/measure/published_memory.py)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="compare predictions with published measured runs",
                       description="Estimate every row of a published-runs CSV and print predicted vs measured "
                                   "tokens/s/GPU with the per-row error, the mean absolute error and the max.")
    p.add_argument("--csv", default=str(DEFAULT_CSV), help=f"runs file (default: {DEFAULT_CSV.name} shipped in data/)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--memory", action="store_true",
                   help="instead: predicted vs measured peak memory of the published runs that print it "
                        "(memory_gib of data/published_runs.csv and data/published_memory.csv)")
    p.add_argument("--fit", action="store_true",
                   help="fit the physical efficiency constants to the runs (see autopar/measure/calibration.py)")
    p.add_argument("--cv", action="store_true", help="with --fit: cross-validate by holding out each source")
    p.add_argument("--loss", choices=("mae", "log"), default="mae",
                   help="with --fit: mean |relative error| (default) or squared log error (autopar/measure/calibrate.py)")
    p.add_argument("--write-intervals", action="store_true",
                   help="with --fit --cv: write the held-out errors' 80%% bands by regime to data/error_bars.yaml "
                        "(the interval estimate and solve print; autopar/measure/intervals.py)")
    p.add_argument("--write", action="store_true",
                   help="with --fit: write hardware YAML files with the fitted constants into --out (a stack's own "
                        "constants into --out/stacks/)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="folder for --write (required; never autopar's installed files; in a source checkout "
                        "--out hardware updates the repository's files)")
    p.set_defaults(func=run)
