"""Does `autopar tune` find the fastest layout with real runs? A timed benchmark, not a test: CPU step times on a
shared machine are noisy, so its verdict can change with the load (it was once a test, and flaky).

Measures every layout of a small space for real (TINY, 2 gloo processes, 8 steps, 2 warm-up; DP2 / TP2 / PP2 x
micro-batch 1 or 4 x recompute none or full = 12 layouts), then runs a study with half as many real runs and prints
how close its winner is to the exhaustive best. A layout's figure is its fastest run (the exhaustive table, the
study, re-measurements): load only ever slows a run down. The table it prints is what
tests/tune/test_tune_finds_best.py replays deterministically (RECORDED there).

    PYTHONPATH=. python benchmarks/bench_tune_finds_best.py [--out table.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autopar.run.launch import run_layout  # noqa: E402
from autopar.specs.layout import resolve_layout  # noqa: E402
from autopar.tune import solve_space, tune  # noqa: E402
from autopar.tune._problem import resolve_problem  # noqa: E402
from tests.tune.test_tune_finds_best import GPUS, OPTIONS, TINY, TRAIN  # noqa: E402

STEPS, WARMUP = 8, 2


def measure(layout, attempts: int = 3) -> float | None:
    for _ in range(attempts):
        r = run_layout(TINY, layout, TRAIN, world=GPUS, steps=STEPS, warmup=WARMUP, timeout_s=120, backend="gloo")
        if r.ok:
            return r.tokens_per_s
        print(f"{layout.short()}: run failed: {r.failure} (log {r.log_path})", file=sys.stderr)
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="write the measured table and the verdict as JSON")
    args = ap.parse_args()
    problem = resolve_problem(TINY, "h100_sxm", TRAIN, GPUS, OPTIONS, backend="gloo")
    space = solve_space(problem, top_k=8, n_seeds=3)
    layouts = {lay.short(): lay for lay in (resolve_layout(space.layout(p, GPUS), TINY, TRAIN, GPUS)
                                            for p in space.all_params(GPUS))}
    table = {label: measure(lay) for label, lay in layouts.items()}
    n = len(table)
    with tempfile.TemporaryDirectory() as tmp:
        res = tune(TINY, "h100_sxm", TRAIN, GPUS, OPTIONS, trials=n // 2, top_k=8, storage=f"sqlite:///{tmp}/t.db",
                   study="best", seed=0, steps=STEPS, warmup=WARMUP, timeout_s=120, backend="gloo",
                   progress=lambda m: print(m, file=sys.stderr))
    known = {k: v or 0.0 for k, v in table.items()}
    for r in res.records:
        if r.measured_tokens_per_s:
            known[r.layout] = max(known[r.layout], r.measured_tokens_per_s)
    tuned = res.best_trial.layout if res.best_trial else None
    best = max(known, key=known.get)
    out = {"machine": f"{platform.node()} {platform.processor() or platform.machine()}", "layouts": n,
           "runs": res.runs, "tuned": tuned, "best": best,
           "ratio": known[tuned] / known[best] if tuned else 0.0, "table": table}
    print(json.dumps(out, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
