"""The tuner finds the best: on this CPU (gloo, 2 ranks, a tiny dense model) every layout of the tuner's space
is measured once (cached in a file), then a study with at most half as many runs as there are layouts must
reach a plan within 10% of the exhaustive best.

CPU step times are noisy (a shared machine, other processes): the runner reports the median of the timed steps,
and when the exhaustive table says the tuned plan is more than 10% behind, the tuned plan and the exhaustive
best are measured again, back to back in alternating order, and those measurements decide.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path

import pytest

import autopar.profile
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
STEPS, WARMUP = 6, 2
CACHE = Path(os.environ.get("AUTOPAR_TUNE_TEST_CACHE", Path(tempfile.gettempdir()) / "autopar-tune-tests"))


def _measure(layout):
    from autopar.profile.launch import run_layout
    r = run_layout(TINY, layout, TRAIN, world=GPUS, steps=STEPS, warmup=WARMUP, timeout_s=120, backend="gloo")
    return r.tokens_per_s if r.ok else None


def _runner_digest() -> str:
    src = sorted(Path(autopar.profile.__file__).parent.glob("*.py"))
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
    best = max(table, key=table.get)
    tuned = res.best_trial.layout
    figures = {"layouts": n, "runs": res.runs, "exhaustive_best": best, "exhaustive_best_tok_s": table[best],
               "tuned": tuned, "tuned_tok_s_exhaustive": table[tuned], "tuned_tok_s_in_study": res.best_trial.
               measured_tokens_per_s, "ratio_exhaustive": table[tuned] / table[best], "table": table}
    ratio = figures["ratio_exhaustive"]
    if ratio < 0.9:                      # re-measure both, back to back, alternating, keep each one's best
        lay = {x.short(): x for x in layouts}
        again = {tuned: 0.0, best: 0.0}
        for order in ((tuned, best), (best, tuned)):
            for label in order:
                again[label] = max(again[label], _measure(lay[label]) or 0.0)
        ratio = again[tuned] / again[best]
        figures.update(remeasured=again, ratio_remeasured=ratio)
    CACHE.mkdir(parents=True, exist_ok=True)
    (CACHE / "finds-best-last.json").write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures, indent=1))
    assert ratio >= 0.9, figures
