"""The tuner finds the best: on this CPU (gloo, 2 ranks, a tiny dense model) every layout of the tuner's space
is measured once (cached in a file), then a study with at most half as many runs as there are layouts must
reach a plan within 10% of the exhaustive best.

CPU step times are noisy: the machine is shared, and another process can only slow a run down. So, as
`autopar profile compare --repeats` does, a layout's speed is its fastest measurement: the runner reports the
median of the timed steps of a run, and a layout's figure is the best of all its runs here (the exhaustive
table, the study, and re-measurements). When those figures put the tuned plan more than 10% behind, the tuned
plan and the best layout are measured again, back to back in alternating order, before the verdict.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path

import pytest

import autopar.run
from autopar.search.space import SearchOptions
from autopar.specs import TrainingSpec
from autopar.specs.layout import resolve_layout
from autopar.tune import solve_space, tune
from autopar.tune._problem import resolve_problem

from .conftest import TINY

pytestmark = pytest.mark.slow

GPUS = 2
TRAIN = TrainingSpec(seq_len=128, global_batch=8)
# Every structure of 2 ranks but context parallel (DP2, PP2, TP2), micro-batch 1 or 4, recompute none or full.
OPTIONS = SearchOptions(time_limit_s=10, cp=[1], zero=[1], mbs=[1, 4], recompute=["none", "full"], vpp=[1])
STEPS, WARMUP = 8, 2
CACHE = Path(os.environ.get("AUTOPAR_TUNE_TEST_CACHE", Path(tempfile.gettempdir()) / "autopar-tune-tests"))


def _measure(layout, attempts: int = 3):
    """Tokens/s of one run (a run that fails for a passing reason, e.g. a port taken by another process's
    rendezvous, is tried again); None with the failures printed when every attempt failed."""
    from autopar.run.launch import run_layout
    for _ in range(attempts):
        r = run_layout(TINY, layout, TRAIN, world=GPUS, steps=STEPS, warmup=WARMUP, timeout_s=120, backend="gloo")
        if r.ok:
            return r.tokens_per_s
        print(f"{layout.short()}: run failed: {r.failure} (log {r.log_path})")
    return None


def _runner_digest() -> str:
    src = sorted(Path(autopar.run.__file__).parent.glob("*.py"))
    return hashlib.sha256(b"".join(p.read_bytes() for p in src)).hexdigest()[:12]


@pytest.fixture(scope="module")
def exhaustive():
    """{layout label: measured tokens/s} for every layout of the space, measured once per machine and runner."""
    problem = resolve_problem(TINY, "h100_sxm", TRAIN, GPUS, OPTIONS, backend="gloo")
    space = solve_space(problem, top_k=8, n_seeds=3)
    layouts = [resolve_layout(space.layout(p, GPUS), TINY, TRAIN, GPUS) for p in space.all_params(GPUS)]
    key = hashlib.sha256(json.dumps([[lay.short() for lay in layouts], TINY.model_dump(mode="json"),
                                     TRAIN.model_dump(mode="json"), STEPS, WARMUP, _runner_digest(),
                                     platform.node(), os.cpu_count()]).encode()).hexdigest()[:16]
    path = CACHE / f"exhaustive-{key}.json"
    if path.exists():
        table = json.loads(path.read_text())
    else:
        table = {lay.short(): _measure(lay) for lay in layouts}
        if all(table.values()):          # only a complete table is kept
            CACHE.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(table, indent=1))
    return layouts, table


def test_the_tuner_reaches_the_exhaustive_best_within_10pct_with_half_the_runs(exhaustive, tmp_path):
    layouts, table = exhaustive
    n = len(table)
    assert n == 12 and all(v for v in table.values()), table        # 3 structures x mbs x recompute, all ran
    res = tune(TINY, "h100_sxm", TRAIN, GPUS, OPTIONS, trials=n // 2, top_k=8, storage=f"sqlite:///{tmp_path / 't.db'}",
               study="best", seed=0, steps=STEPS, warmup=WARMUP, timeout_s=120, backend="gloo", progress=print)
    assert res.space_size == n and res.runs <= n // 2
    known = dict(table)                  # each layout's fastest measurement so far
    for r in res.records:
        if r.measured_tokens_per_s:
            known[r.layout] = max(known[r.layout], r.measured_tokens_per_s)
    tuned = res.best_trial.layout
    best = max(known, key=known.get)
    figures = {"layouts": n, "runs": res.runs, "exhaustive_best": max(table, key=table.get),
               "exhaustive_best_tok_s": max(table.values()), "tuned": tuned, "tuned_tok_s_in_study":
               res.best_trial.measured_tokens_per_s, "tuned_tok_s_exhaustive": table[tuned], "best_known": best,
               "ratio": known[tuned] / known[best], "table": table,
               "study": [(r.number, r.layout, r.outcome, r.measured_tokens_per_s) for r in res.records]}
    if figures["ratio"] < 0.9:           # measure both again, back to back, alternating
        lay = {x.short(): x for x in layouts}
        for order in ((tuned, best), (best, tuned)):
            for label in order:
                known[label] = max(known[label], _measure(lay[label]) or 0.0)
        best = max(known, key=known.get)
        figures.update(remeasured={tuned: known[tuned], best: known[best]}, ratio=known[tuned] / known[best])
    CACHE.mkdir(parents=True, exist_ok=True)
    (CACHE / "finds-best-last.json").write_text(json.dumps(figures, indent=1))
    print(json.dumps({k: v for k, v in figures.items() if k not in ("table", "study")}, indent=1))
    assert figures["ratio"] >= 0.9, figures
