"""The CP-SAT search against the exhaustive reference and against estimate()."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.cost import Estimator
from autopar.search import SearchOptions, solve
from autopar.search.cpsat import SCALE_T
from autopar.specs import ModelSpec, MoESpec, TrainingSpec
from autopar.specs.loaders import load_hardware


def small_model(moe: bool, layers: int) -> ModelSpec:
    return ModelSpec(name="tiny_moe" if moe else "tiny", num_layers=layers, hidden_size=2048, ffn_hidden_size=5632,
                     num_attention_heads=16, num_kv_heads=4, vocab_size=32000,
                     moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1408) if moe else None)


OPTS = dict(mbs=[1, 2], vpp=[1, 2], zero=[1, 3], recompute=["none", "full"], top_k=1, time_limit_s=30)


@settings(max_examples=6, deadline=None)
@given(moe=st.booleans(), layers=st.sampled_from([8, 12]), gpus=st.sampled_from([4, 8]),
       gb=st.sampled_from([16, 32]))
def test_cpsat_and_exhaustive_find_the_same_optimum(moe, layers, gpus, gb):
    model, tr = small_model(moe, layers), TrainingSpec(seq_len=2048, global_batch=gb)
    a = solve(model, "h100_sxm", tr, gpus, SearchOptions(**OPTS), explain=False, with_heuristic=False)
    b = solve(model, "h100_sxm", tr, gpus, SearchOptions(**OPTS), method="exhaustive", with_heuristic=False)
    assert a.status == "OPTIMAL"
    assert a.plans and b.plans
    # equal optimum up to the solver's integer rounding (1 us per term)
    assert a.plans[0].estimate.step_time_s == pytest.approx(b.plans[0].estimate.step_time_s, abs=5e-6)


def test_objective_equals_estimate_of_the_best_layout():
    model, tr = small_model(True, 8), TrainingSpec(seq_len=2048, global_batch=32)
    res = solve(model, "h100_sxm", tr, 8, SearchOptions(**{**OPTS, "top_k": 3}), explain=False, with_heuristic=False)
    for p in res.plans:
        exact = Estimator(model, load_hardware("h100_sxm"), tr, 8).estimate(p.layout, resolved=True).step_time_s
        assert p.objective_s == pytest.approx(exact, abs=4 / SCALE_T)


def test_every_plan_fits_and_is_valid():
    model, tr = small_model(False, 8), TrainingSpec(seq_len=2048, global_batch=32)
    res = solve(model, "h100_sxm", tr, 8, SearchOptions(**{**OPTS, "top_k": 4}), explain=False, with_heuristic=False)
    steps = [p.estimate.step_time_s for p in res.plans]
    assert steps == sorted(steps) and all(p.estimate.fits for p in res.plans)
    assert len({p.layout.short() for p in res.plans}) == len(res.plans)


def test_infeasible_problem_names_the_hbm_group_and_a_gpu_count():
    model = ModelSpec(name="big", num_layers=8, hidden_size=16384, ffn_hidden_size=65536, num_attention_heads=128,
                      vocab_size=32000)
    tr = TrainingSpec(seq_len=2048, global_batch=16)
    res = solve(model, "h100_sxm", tr, 2, SearchOptions(**OPTS), with_heuristic=False)
    assert not res.plans
    text = "\n".join(res.explanation)
    assert "hbm capacity" in text and "smallest per-GPU memory" in text and "GPU count" in text


def test_pins_that_no_mesh_satisfies_give_no_plans_and_an_explanation():
    model = ModelSpec(name="four_heads", num_layers=4, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=4,
                      vocab_size=512)
    tr = TrainingSpec(seq_len=2048, global_batch=32)
    res = solve(model, "h100_sxm", tr, 8, SearchOptions(**{**OPTS, "tp": [8]}), with_heuristic=False)
    assert not res.plans and res.status == "INFEASIBLE"
    assert any("tensor parallel" in line for line in res.explanation)


def _best_steps(cands, top_k):
    from autopar.search.cpsat import LayoutModel
    res = LayoutModel(cands).solve(top_k, 30.0)
    return res.status, [s.objective_s for s in res.solutions]


@settings(max_examples=12, deadline=None)
@given(moe=st.booleans(), layers=st.sampled_from([8, 12, 30]), gpus=st.sampled_from([8, 16, 32]),
       gb=st.sampled_from([16, 64, 96]), seq=st.sampled_from([2048, 8192]), top_k=st.integers(1, 4),
       hidden=st.sampled_from([2048, 8192]))
def test_branch_and_bound_over_meshes_loses_nothing(moe, layers, gpus, gb, seq, top_k, hidden):
    """The bounded table build (meshes skipped by lower bounds) gives the same top-k as tabulating every mesh,
    including problems where nothing or only a few layouts fit."""
    from autopar.search.cpsat import build_candidates
    from autopar.search.space import build_space
    model = ModelSpec(name="m", num_layers=layers, hidden_size=hidden, ffn_hidden_size=4 * hidden,
                      num_attention_heads=16, num_kv_heads=4, vocab_size=32000,
                      moe=MoESpec(num_experts=16, top_k=2, expert_ffn_hidden_size=hidden) if moe else None)
    hw, tr = load_hardware("h100_sxm"), TrainingSpec(seq_len=seq, global_batch=gb)
    space = build_space(model, hw, tr, gpus, SearchOptions(top_k=top_k))
    est = Estimator(model, hw, tr, gpus)
    full = build_candidates(space, est, top_k, bound=False)
    bounded = build_candidates(space, est, top_k, bound=True)
    assert bounded.tabulated_meshes <= full.tabulated_meshes == full.valid_meshes
    assert _best_steps(bounded, top_k) == _best_steps(full, top_k)


def test_branch_and_bound_on_deepseek_v3_skips_most_meshes_and_keeps_the_optimum():
    from autopar.search.cpsat import build_candidates
    from autopar.search.space import build_space
    from autopar.specs.loaders import load_model
    model, hw = load_model("deepseek_v3"), load_hardware("h100_sxm")
    tr = TrainingSpec(seq_len=4096, global_batch=512)
    space = build_space(model, hw, tr, 256, SearchOptions(top_k=3))
    est = Estimator(model, hw, tr, 256)
    full, bounded = build_candidates(space, est, 3, bound=False), build_candidates(space, est, 3)
    assert bounded.tabulated_meshes < full.valid_meshes / 3
    assert _best_steps(bounded, 3) == _best_steps(full, 3)
