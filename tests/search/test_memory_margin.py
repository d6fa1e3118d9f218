"""The memory margin (issue 20): solve keeps a stated share of HBM free beyond the memory model, the exhaustive
reference agrees, and the memory it compares is the larger of the training peak and the optimizer step's."""

from __future__ import annotations

import pytest

from autopar.cost import Estimator
from autopar.cost.memory import step_grad_copy_bytes
from autopar.errors import AutoparInputError
from autopar.search import SearchOptions, solve
from autopar.search.space import build_space
from autopar.specs import Layout, ModelSpec, TrainingSpec
from autopar.specs.loaders import load_hardware, load_model

H100 = load_hardware("h100_sxm")
OPTS = dict(mbs=[1, 2], vpp=[1, 2], zero=[1, 3], recompute=["none", "full"], top_k=3, time_limit_s=30)


@pytest.mark.parametrize("margin", [0.0, 0.2])
def test_plans_keep_the_margin_and_the_exhaustive_reference_agrees(margin):
    model = ModelSpec(name="tiny", num_layers=8, hidden_size=2048, ffn_hidden_size=5632, num_attention_heads=16,
                      num_kv_heads=4, vocab_size=32000)
    tr = TrainingSpec(seq_len=8192, global_batch=32)
    hw = H100.model_copy(update={"hbm_gib": 24.0})     # small enough that the margin binds
    a = solve(model, hw, tr, 4, SearchOptions(memory_margin=margin, **OPTS), explain=False, with_heuristic=False)
    b = solve(model, hw, tr, 4, SearchOptions(memory_margin=margin, **OPTS), method="exhaustive",
              with_heuristic=False)
    assert a.memory_margin == margin and a.plans and b.plans
    for p in a.plans:
        assert p.estimate.memory_gib.total <= 24.0 * (1 - margin) + 1e-3
    assert a.plans[0].estimate.step_time_s == pytest.approx(b.plans[0].estimate.step_time_s, abs=5e-6)


def test_a_margin_the_best_layout_breaks_changes_the_answer():
    tr = TrainingSpec(seq_len=4096, global_batch=512)
    free = solve("deepseek_v3", H100, tr, 256, SearchOptions(memory_margin=0.0, top_k=1), explain=False,
                 with_heuristic=False)
    used = free.plans[0].estimate.memory_gib.total / H100.hbm_gib
    kept = solve("deepseek_v3", H100, tr, 256, SearchOptions(memory_margin=round(1 - used + 0.01, 3), top_k=1),
                 explain=False, with_heuristic=False)
    assert kept.plans[0].estimate.memory_gib.total < free.plans[0].estimate.memory_gib.total


def test_margin_bounds():
    with pytest.raises(AutoparInputError, match="--memory-margin"):
        SearchOptions(memory_margin=0.9)
    with pytest.raises(AutoparInputError, match="--memory-margin"):
        SearchOptions(memory_margin=-0.1)


def test_the_optimizer_steps_fp32_copy_is_a_second_peak():
    """Llama 3 405B, 8 layers on 8 GPUs at TP 8, DP 1: bf16 gradient buffers make the optimizer step hold a
    4 B fp32 copy of every gradient, more than the activations of a 4K micro-batch; fp32 buffers make none."""
    model = load_model("llama3_405b").model_copy(update={"num_layers": 8})
    for grad, copy_expected in (("bf16", True), ("fp32", False)):
        tr = TrainingSpec(seq_len=4096, global_batch=8, grad_dtype=grad)
        est = Estimator(model, H100.model_copy(update={"hbm_gib": 400.0}), tr, 8)
        L = est.resolve(Layout(tp=8, zero_stage=1))
        st = est.stages(L.stage_layers)[0]
        copy = step_grad_copy_bytes(est.profile, st, L, tr)
        assert (copy > 0) == copy_expected
        m = est.estimate(L).memory_gib
        if copy_expected:   # the step's peak: states + the copy (reported under buffers)
            assert (m.activations + m.buffers) * 2**30 == pytest.approx(copy, rel=1e-9)


@pytest.mark.parametrize("zero", [1, 3])
@pytest.mark.parametrize("vpp", [1, 2])
def test_the_ep_overlap_tables_follow_megatrons_schedule_rules(vpp, zero):
    """MoE on a pipeline: the all-to-all overlap needs virtual stages, and not under FSDP (launcher_rules). Whatever
    the pins, the solver's objective is the estimate of the layout it returns."""
    from autopar.search.tables import SCALE_T
    from autopar.specs import MoESpec
    model = ModelSpec(name="tiny_moe", num_layers=8, hidden_size=2048, ffn_hidden_size=5632, num_attention_heads=16,
                      num_kv_heads=4, vocab_size=32000, moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1408))
    tr = TrainingSpec(seq_len=2048, global_batch=32)
    opts = SearchOptions(pp=[2], vpp=[vpp], ep=[4], zero=[zero], mbs=[1], recompute=["none"], top_k=2,
                         memory_margin=0.0, time_limit_s=30)
    res = solve(model, "h100_sxm", tr, 8, opts, explain=False, with_heuristic=False)
    assert res.plans
    for p in res.plans:
        exact = Estimator(model, H100, tr, 8).estimate(p.layout, resolved=True).step_time_s
        assert p.objective_s == pytest.approx(exact, abs=4 / SCALE_T)
