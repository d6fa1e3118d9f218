"""The routed experts' host-bound launches after the token dispatcher's device-to-host sync
(autopar.cost.compute.moe_host_time): max(0, E_loc · h_f − G_f) per MoE layer and forward pass."""

from __future__ import annotations

import pytest

from autopar.cost import Estimator
from autopar.cost import compute as C
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_model
from autopar.specs.model import ModelSpec, MoESpec
from autopar.specs.training import TrainingSpec

H100 = load_hardware("h100_sxm")
H_F = 20e-6   # host seconds per local expert, forward (an input here, not the hardware file's figure)


def _fine_moe(layers: int = 4) -> ModelSpec:
    """Many small experts: 128 experts of width 256 on a 1,024-wide model, every layer MoE."""
    return ModelSpec(name="fine", num_layers=layers, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16,
                     num_kv_heads=4, vocab_size=32000,
                     moe=MoESpec(num_experts=128, top_k=2, expert_ffn_hidden_size=256))


def _parts(est: Estimator, L: Layout, tr: TrainingSpec) -> tuple[float, int]:
    """G_f of one MoE layer (the routed segment's forward seconds) and its local experts."""
    kind = next(k for k in est.profile.kinds if k.is_moe)
    parts = C.layer_parts(est.kernels, kind, L, tr, C.gpu_tokens(L, tr), 1.0)
    return sum(parts[p][0] for p in C.ROUTED_PARTS if p in parts), kind.num_experts // L.ep


def test_exposed_host_time_is_what_the_routed_segment_cannot_hide():
    m, tr = _fine_moe(), TrainingSpec(seq_len=1024, global_batch=64)
    est = Estimator(m, H100, tr, 8)
    L = est.resolve(Layout(ep=1, dp=8))
    st = est.stages(L.stage_layers)[0]
    g_f, e_loc = _parts(est, L, tr)
    assert e_loc == 128 and e_loc * H_F > g_f            # 128 local experts at 1,024 tokens: host-bound
    got = C.moe_host_time(est.profile, st, L, tr, est.kernels, H_F)
    assert got == pytest.approx(m.num_layers * (e_loc * H_F - g_f))


def test_fewer_local_experts_or_more_tokens_hide_the_launches():
    m, tr = _fine_moe(), TrainingSpec(seq_len=1024, global_batch=128)
    est = Estimator(m, H100, tr, 8)
    st_of = lambda L: est.stages(L.stage_layers)[0]   # noqa: E731
    ep1 = est.resolve(Layout(ep=1, dp=8))
    ep8 = est.resolve(Layout(ep=8, dp=8))
    t1 = C.moe_host_time(est.profile, st_of(ep1), ep1, tr, est.kernels, H_F)
    t8 = C.moe_host_time(est.profile, st_of(ep8), ep8, tr, est.kernels, H_F)
    assert t1 > t8 >= 0.0
    long = TrainingSpec(seq_len=8192, global_batch=128)
    est_l = Estimator(m, H100, long, 8)
    big = est_l.resolve(Layout(ep=1, dp=8, micro_batch=16))
    g_f, e_loc = _parts(est_l, big, long)
    assert g_f > e_loc * H_F                               # 16 x 8,192 tokens: the GPU work outlasts the host's
    st = est_l.stages(big.stage_layers)[0]
    assert C.moe_host_time(est_l.profile, st, big, long, est_l.kernels, H_F) == 0.0


def test_a_recomputed_moe_block_syncs_and_pays_again_and_a_dense_model_pays_nothing():
    m, tr = _fine_moe(), TrainingSpec(seq_len=1024, global_batch=64)
    est = Estimator(m, H100, tr, 8)
    plain = est.resolve(Layout(ep=1, dp=8))
    again = est.resolve(Layout(ep=1, dp=8, recompute="moe"))
    st = est.stages(plain.stage_layers)[0]
    once = C.moe_host_time(est.profile, st, plain, tr, est.kernels, H_F)
    assert once > 0
    assert C.moe_host_time(est.profile, st, again, tr, est.kernels, H_F) == pytest.approx(2 * once)
    assert C.moe_host_time(est.profile, st, again, tr, est.kernels, H_F, forward_only=True) == pytest.approx(once)
    dense = load_model("llama3_8b")
    est_d = Estimator(dense, H100, tr, 8)
    L_d = est_d.resolve(Layout(dp=8))
    assert C.moe_host_time(est_d.profile, est_d.stages(L_d.stage_layers)[0], L_d, tr, est_d.kernels, H_F) == 0.0


def test_the_estimator_prices_it_from_the_hardware_file_and_full_iteration_graphs_remove_it():
    m = _fine_moe()
    eager = TrainingSpec(seq_len=1024, global_batch=64)
    graphed = eager.model_copy(update={"cuda_graphs": "full_iteration"})
    grace = load_hardware("gb200_nvl72")   # the host the per-expert figure was measured on
    unmeasured = grace.model_copy(update={"host_us_per_expert_fwd": None})
    L = Layout(ep=1, dp=8)
    with_host = Estimator(m, grace, eager, 8)
    assert with_host.host_expert_s == pytest.approx(grace.host_us_per_expert_fwd * 1e-6)
    t_host = with_host.estimate(L).step_time_s
    t_none = Estimator(m, unmeasured, eager, 8).estimate(L).step_time_s
    assert t_host > t_none
    assert "MoE host launches" in with_host.compute_by_kernel(L)
    assert Estimator(m, grace, graphed, 8).host_expert_s == 0.0


def test_an_x86_host_issues_the_same_experts_in_less_time_than_grace():
    """TransformerEngine issue #2053 (2025-08-11): one Linear forward costs the host 13.48 us on a DGX H100's Xeon
    and 37.08 us on GB200's Grace, so the x86 files carry the Grace figure scaled by that ratio: on one layout the
    H100 pays less exposed host time than it would at the Grace rate, and none where its experts hide it."""
    m, tr = _fine_moe(), TrainingSpec(seq_len=1024, global_batch=64)
    grace = load_hardware("gb200_nvl72")
    assert H100.host_us_per_expert_fwd == pytest.approx(grace.host_us_per_expert_fwd * 13.48 / 37.08, abs=0.05)
    at_grace_rate = H100.model_copy(update={"host_us_per_expert_fwd": grace.host_us_per_expert_fwd})
    L = Layout(ep=1, dp=8)
    x86 = Estimator(m, H100, tr, 8).compute_by_kernel(L).get("MoE host launches", 0.0)
    slow = Estimator(m, at_grace_rate, tr, 8).compute_by_kernel(L)["MoE host launches"]
    assert x86 < slow
