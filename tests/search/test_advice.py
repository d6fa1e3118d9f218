"""What-to-try-next advice: valid neighbours, numbers that match a fresh estimate, a deterministic order."""

import pytest

from autopar.cost import Estimator
from autopar.search import SearchOptions, solve
from autopar.search.advice import CATEGORIES, Advice, advise, neighbours, rank_advice
from autopar.specs import Layout, TrainingSpec
from autopar.specs.layout import check_layout
from autopar.specs.loaders import load_hardware, load_model

GPUS = 8


@pytest.fixture(scope="module")
def problem():
    model, hw, tr = load_model("llama3_8b"), load_hardware("h100_sxm"), TrainingSpec()
    res = solve(model, hw, tr, GPUS, SearchOptions(top_k=3, mbs=[1, 2], vpp=[1], zero=[1, 3]))
    assert res.plans, "the small problem must have a layout that fits"
    return model, hw, tr, res


@pytest.fixture(scope="module")
def items(problem) -> list[Advice]:
    model, hw, tr, res = problem
    return neighbours(Estimator(model, hw, tr, GPUS), res.plans[0].estimate)


def test_advice_is_non_empty_and_ends_with_the_bottleneck(problem):
    model, hw, tr, res = problem
    best = res.plans[0].estimate
    out = advise(Estimator(model, hw, tr, GPUS), best, max_items=5)
    assert 1 <= len(out) <= 5
    assert all(isinstance(s, str) and s for s in out)
    assert best.bottleneck in out[-1]
    assert len(out) > 1, "the best layout of this problem has useful neighbours (more memory for some time)"


def test_every_neighbour_is_valid_and_differs_from_the_layout(problem, items):
    model, hw, tr, res = problem
    base = res.plans[0].layout
    assert items
    for a in items:
        assert check_layout(a.layout, model, tr, GPUS, hw, allow_cross_domain_tp=False) == [], a.change
        assert a.layout.model_dump() != base.model_dump()
        assert sum(a.layout.stage_layers) == model.num_layers and len(a.layout.stage_layers) == a.layout.pp
        assert a.category in CATEGORIES
    knobs = {a.knob for a in items}
    assert {"tp", "cp", "micro_batch", "recompute", "zero"} <= knobs


def test_numbers_match_a_fresh_estimate(problem, items):
    model, hw, tr, res = problem
    base = res.plans[0].estimate
    fresh_est = Estimator(model, hw, tr, GPUS)
    for a in items:
        fresh = fresh_est.estimate(a.layout)  # validates and resolves again
        assert fresh.step_time_s == pytest.approx(a.estimate.step_time_s, rel=1e-12)
        assert fresh.memory_gib.total == pytest.approx(a.estimate.memory_gib.total, rel=1e-12)
        assert a.delta_step == pytest.approx((fresh.step_time_s - base.step_time_s) / base.step_time_s, abs=1e-12)
        assert a.delta_mem == pytest.approx(fresh.memory_gib.total - base.memory_gib.total, abs=1e-9)
        assert a.delta_step_s == pytest.approx(fresh.step_time_s - base.step_time_s, abs=1e-9)
        # the sentence prints these numbers
        assert f"{abs(a.delta_step):.1%}" in a.text, a.text
        assert f"{fresh.memory_gib.total:.1f}" in a.text, a.text
        if a.category == "saves memory":
            assert f"would free {-a.delta_mem:.1f} GiB" in a.text
            assert a.estimate.fits
        if a.category == "faster":
            assert a.estimate.fits and a.delta_step < 0
        if a.category == "near miss":
            assert not a.estimate.fits and f"> {hw.hbm_gib:.1f} HBM" in a.text


def test_advice_sentences_are_the_ranked_neighbours_in_order(problem, items):
    model, hw, tr, res = problem
    ranked = rank_advice(items)
    cats = [CATEGORIES.index(a.category) for a in ranked]
    assert cats == sorted(cats)
    assert all(a.category != "other" for a in ranked)
    out = advise(Estimator(model, hw, tr, GPUS), res.plans[0].estimate, max_items=4)
    assert out[:-1] == [a.text for a in ranked[:3]]


def test_deterministic(problem):
    model, hw, tr, res = problem
    a = advise(Estimator(model, hw, tr, GPUS), res.plans[0].estimate, max_items=10)
    b = advise(Estimator(model, hw, tr, GPUS), res.plans[0].estimate, max_items=10)
    assert a == b
    assert advise(Estimator(model, hw, tr, GPUS), res.plans[0].estimate, max_items=0) == []


def test_a_layout_that_does_not_fit_gets_the_changes_that_make_it_fit_first():
    model, hw, tr = load_model("llama3_8b"), load_hardware("h100_sxm"), TrainingSpec()
    est = Estimator(model, hw, tr, GPUS)
    base = est.estimate(Layout(tp=1, zero_stage=0, micro_batch=2))
    assert not base.fits
    items = neighbours(est, base)
    ranked = rank_advice(items)
    assert ranked and ranked[0].category == "fits" and ranked[0].estimate.fits
    assert "would fit" in advise(est, base)[0]


def test_faster_neighbour_that_fits_comes_first():
    # TP8 on 8 GPUs with selective recompute: smaller TP is faster and still fits
    model, hw, tr = load_model("llama3_8b"), load_hardware("h100_sxm"), TrainingSpec()
    est = Estimator(model, hw, tr, GPUS)
    base = est.estimate(Layout(tp=8, recompute="selective"))
    ranked = rank_advice(neighbours(est, base))
    assert ranked[0].category == "faster"
    faster = [a.delta_step for a in ranked if a.category == "faster"]
    assert faster == sorted(faster)
    assert "faster" in advise(est, base)[0]


def test_cross_domain_tp_only_when_allowed():
    model, hw, tr = load_model("llama3_8b"), load_hardware("h100_sxm"), TrainingSpec()
    est = Estimator(model, hw, tr, 16)
    base = est.estimate(Layout(tp=8))
    inside = neighbours(est, base)
    across = neighbours(est, base, allow_cross_domain=True)
    assert all(a.layout.tp <= hw.nvlink_domain_size for a in inside)
    assert any(a.layout.tp == 16 for a in across)


def test_pipeline_neighbours_get_a_stage_split():
    model, hw, tr = load_model("llama3_8b"), load_hardware("h100_sxm"), TrainingSpec()
    est = Estimator(model, hw, tr, GPUS)
    base = est.estimate(Layout(pp=2, vpp=2))
    by_change = {(a.layout.pp, a.layout.vpp): a for a in neighbours(est, base)}
    assert by_change[(4, 2)].layout.stage_layers == (8, 8, 8, 8)
    assert by_change[(1, 1)].layout.stage_layers == (32,)  # halving PP to 1 drops interleaving too
    assert by_change[(2, 4)].layout.stage_layers == (16, 16)


def test_a_neighbour_inside_the_memory_margin_says_so():
    """A neighbour that fits HBM but not the margin solve keeps free is marked as such (why solve did not pick it),
    exactly where its predicted memory is above HBM x (1 - margin); and a change of DP names the change of GA."""
    model, hw, tr = load_model("llama3_8b"), load_hardware("h100_sxm"), TrainingSpec()
    est = Estimator(model, hw, tr, GPUS)
    base = est.estimate(Layout(tp=8, recompute="selective"))
    useful = [a for a in neighbours(est, base) if a.category in ("fits", "faster")]
    fullest = max(a.estimate.memory_gib.total / a.estimate.hbm_gib for a in useful)
    margin = 1.0 - fullest + 0.001           # the fullest useful neighbour is just inside it
    seen = 0
    for a in neighbours(est, base, memory_margin=margin):
        if a.category not in ("fits", "faster"):
            continue
        inside = a.estimate.memory_gib.total > a.estimate.hbm_gib * (1 - margin)
        seen += inside
        assert ("memory margin solve keeps" in a.text) == inside, a.text
    assert seen >= 1
    assert not any("memory margin" in a.text for a in neighbours(est, base))
    tp = [a for a in neighbours(est, base) if a.knob == "tp" and a.layout.dp != base.layout.dp]
    assert tp and all(f"GA {base.layout.grad_accum}→{a.layout.grad_accum}" in a.change for a in tp
                      if a.layout.grad_accum != base.layout.grad_accum)
