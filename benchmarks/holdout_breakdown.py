"""The out-of-sample check in detail: data/published_runs_holdout.csv (Megatron-Bridge releases before 26.06, NeMo's
long-sequence runs).

Prints the mean absolute error and bias by chip, model, source (release), precision, context length and CP degree
(and, for NeMo's long-sequence runs, each row with its attention share of the predicted step); the worst rows with their step-time
terms and compute by kernel class; and, for every layout the archive ran unchanged in two or more releases (26.06's
fitted rows included), the measured throughput change against the predicted one, so that what the recipes' stated
switches carry can be told from what they do not. Run against any checkout
(``PYTHONPATH=/path/to/other/checkout python benchmarks/holdout_breakdown.py``) to compare two cost models; the
figures are the model's predictions against the published measurements.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict

from autopar.cost.estimator import Estimator
from autopar.measure.validation import DEFAULT_CSV, HOLDOUT_CSV, validate

WORST = 10
SAME_LAYOUT_SOURCES = ("mb2511", "mb2602", "mb2602a", "mb2604", "mb2604a", "mb2606")   # oldest release first


def _groups(rows, key) -> dict[str, tuple[int, float, float]]:
    g: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        g[key(r)].append(r.error)
    return {k: (len(v), sum(map(abs, v)) / len(v), sum(v) / len(v)) for k, v in sorted(g.items())}


def _context(seq: int) -> str:
    """Context-length bucket, as `autopar validate` groups them, with the long-sequence spans split further
    (right-aligned, so that the buckets sort shortest first)."""
    for top, name in ((4096, "<= 4K"), (16384, "8K-16K"), (65536, "32K-64K"), (262144, "128K-256K")):
        if seq <= top:
            return name.rjust(10)
    return "512K-1024K"


def _layout_key(r) -> tuple:
    c, lay = r.case, r.case.layout
    return (c.model.name, c.hardware.name, c.training.precision, c.gpus, c.training.global_batch, lay.micro_batch,
            lay.tp, lay.pp, lay.vpp, lay.cp, lay.ep, lay.zero_stage)


def main() -> None:
    rep = validate(HOLDOUT_CSV)
    rows = rep.rows
    print(f"{len(rows)} runs ({len(rep.skipped)} skipped): mean |error| {rep.mape:.2%}, bias "
          f"{sum(r.error for r in rows) / len(rows):+.2%}, worst {rep.max_abs_error:.1%}, within-source ranking "
          f"{rep.ranking.share:.1%}; predicted over HBM: {len(rep.predicted_oom)} {rep.predicted_oom}")
    for name, key in (("chip", lambda r: r.case.hardware.name), ("model", lambda r: r.case.model.name),
                      ("source (release)", lambda r: r.case.row_id.split("-")[0]),
                      ("precision", lambda r: r.case.training.precision),
                      ("dense/MoE", lambda r: "MoE" if r.case.model.is_moe else "dense"),
                      ("context length", lambda r: _context(r.case.training.seq_len)),
                      ("CP degree", lambda r: f"CP{r.case.layout.cp:>3d}")):
        print(f"-- by {name} (+ = predicted faster than measured)")
        for k, (n, mae, bias) in _groups(rows, key).items():
            print(f"   {k:26s} {n:3d} runs  mean |error| {mae:6.1%}  bias {bias:+7.1%}")
    long = [r for r in rows if r.case.row_id.startswith("nemolong-")]
    if long:
        print("-- NeMo's long-sequence runs (nemolong-): error, and the predicted step's attention-core and exposed CP "
              "shares")
        for r in long:
            c, lay = r.case, r.case.layout
            est = Estimator(c.model, c.hardware, c.training, c.gpus)
            step = est.estimate(lay, resolved=True)
            attn = est.compute_by_kernel(lay, resolved=True).get("attention core", 0.0)
            cp = step.to_dict()["time_s"].get("cp", 0.0)
            print(f"   {c.row_id:34s} {c.training.seq_len // 1024:5d}K TP{lay.tp} CP{lay.cp:<3d} {r.error:+7.1%}  "
                  f"attention {attn / step.step_time_s:5.1%}  CP exposed {cp / step.step_time_s:5.1%}")
    print(f"-- the {WORST} worst runs: step-time terms and compute by kernel class (seconds)")
    for r in sorted(rows, key=lambda r: -abs(r.error))[:WORST]:
        c, lay = r.case, r.case.layout
        est = Estimator(c.model, c.hardware, c.training, c.gpus)
        e = est.estimate(lay, resolved=True)
        print(f"{c.row_id:36s} TP{lay.tp} PP{lay.pp}v{lay.vpp} CP{lay.cp} EP{lay.ep} DP{lay.dp} mbs{lay.micro_batch} "
              f"rc={lay.recompute} graphs={c.training.cuda_graphs}: {r.error:+.1%}, predicted {e.step_time_s:.2f} s, "
              f"measured {e.step_time_s * (1 + r.error):.2f} s")
        print("    terms", {k: round(v, 3) for k, v in e.to_dict()["time_s"].items() if v})
        print("    compute", {k: round(v, 3) for k, v in est.compute_by_kernel(lay, resolved=True).items() if v})
    fitted = [r for r in validate(DEFAULT_CSV).rows if r.case.row_id.startswith("mb2606")]
    by_layout: dict[tuple, dict[str, object]] = defaultdict(dict)
    for r in rows + fitted:
        by_layout[_layout_key(r)][r.case.row_id.split("-")[0]] = r
    moves = []
    for key, runs in by_layout.items():
        seq = [runs[s] for s in SAME_LAYOUT_SOURCES if s in runs]
        if len(seq) > 1:
            a, b = seq[0], seq[-1]
            moves.append((b.measured / a.measured - 1, b.predicted / a.predicted - 1, a.case.row_id, b.case.row_id))
    if not moves:
        sys.exit("no layout ran in two releases")
    print(f"-- {len(moves)} layouts run unchanged in two or more releases, oldest -> newest: measured change median "
          f"{statistics.median(m[0] for m in moves):+.1%} (range {min(m[0] for m in moves):+.1%} .. "
          f"{max(m[0] for m in moves):+.1%})")
    for meas, pred, a, b in sorted(moves):
        print(f"   {a:36s} -> {b:38s} measured {meas:+7.1%}  predicted {pred:+7.1%}")


if __name__ == "__main__":
    main()
