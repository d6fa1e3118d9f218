"""PyTorch's all-gather ring attention (torchtitan's CP) against Transformer Engine's p2p ring (autopar/cost/cp.py)."""

import pytest

from autopar.cost import Estimator
from autopar.cost.collectives import Network
from autopar.cost.cp import cp_time_per_microbatch, torch_ring_merge_bytes
from autopar.cost.kernels import Kernels
from autopar.cost.layer_sums import ModelProfile
from autopar.cost.overlap import overlap_cost
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_model, load_stack
from autopar.specs.training import TrainingSpec

MODEL = load_model("llama3_8b")
HW = load_hardware("h100_grand_teton")


def _training(ring: str, seq: int = 262144, **kw) -> TrainingSpec:
    return TrainingSpec(seq_len=seq, global_batch=8, precision="bf16", attention_impl="sdpa_fa2", cp_ring=ring, **kw)


def _cp_seconds(tr: TrainingSpec, L: Layout) -> float:
    """The CP term of one micro-batch straight from cp.py; the estimator's adds what the hidden part of the ring
    costs the attention it hides under (autopar.cost.overlap; the CP group stays inside the node's NVLink)."""
    est = Estimator(MODEL, HW, tr, 8)   # one 8-GPU node: dp = 8 / (tp·cp)
    R = est.resolve(L)
    st = est.stages(R.stage_layers)[0]
    t = est.stage_times(R, st).cp
    hw = est.hardware
    on = cp_time_per_microbatch(est.profile, st, R, tr, hw, Network(hw), Kernels(hw, tr))
    off_tr = tr.model_copy(update={"cp_comm_overlap": False})
    off = cp_time_per_microbatch(est.profile, st, R, off_tr, hw, Network(hw), Kernels(hw, off_tr))
    hidden = max(0.0, off - on) if tr.cp_comm_overlap and R.cp > 1 else 0.0
    assert t == pytest.approx(on + overlap_cost(hidden, hw, "sm"))
    return on


def test_torchtitan_runs_the_allgather_ring_and_megatron_the_p2p_ring():
    assert load_stack("torchtitan").knobs.training_fields()["cp_ring"] == "torch_allgather"
    assert load_stack("megatron_core").knobs.training_fields()["cp_ring"] == "te_p2p"
    assert TrainingSpec(seq_len=4096, global_batch=8).cp_ring == "te_p2p"


def test_merge_bytes_by_hand_for_llama3_8b_cp8():
    # b = 1, s = 256K, cp = 8, tp = 1: 32,768 local tokens; 32 heads x 128 (q and o); K and V as SDPA gets them in
    # torchtitan, repeated from 8 to all 32 heads (repeat_kv): 32 x 128 x 2
    L = Layout(cp=8, micro_batch=1, recompute="full")
    o = q = 32768 * 32 * 128
    kv = 32768 * 2 * 32 * 128
    eager = _training("torch_allgather", elementwise="eager")
    fwd, bwd = torch_ring_merge_bytes(ModelProfile(MODEL, eager), L, eager)
    assert fwd == pytest.approx(o * (6 + 6 + 7 * 38) + kv * 7 * 4)
    assert bwd == pytest.approx(q * (4 + 6 + 8 * 10) + kv * (4 + 6 + 8 * 25))
    # compiled (torchtitan's fullgraph blocks): each merge one fused pass, 10 B per element and step
    compiled = _training("torch_allgather", elementwise="compiled")
    fwd, bwd = torch_ring_merge_bytes(ModelProfile(MODEL, compiled), L, compiled)
    assert fwd == pytest.approx(o * (6 + 6 + 7 * 10) + kv * 7 * 4)
    assert bwd == pytest.approx(q * (4 + 6 + 8 * 10) + kv * (4 + 6 + 8 * 14))


def test_allgather_ring_costs_more_than_the_p2p_ring_and_grows_with_cp():
    # same FLOPs, but merges through HBM and a KV all-gather only step 0 can hide; at a fixed 32K tokens per GPU
    # (torchtitan's table 2: s = 32K x cp) one more merge per further ring step; nothing at cp = 1
    seen = []
    for cp in (2, 4, 8):
        L = Layout(cp=cp, micro_batch=1, recompute="full")
        torch_ring = _cp_seconds(_training("torch_allgather", seq=32768 * cp), L)
        te = _cp_seconds(_training("te_p2p", seq=32768 * cp), L)
        assert torch_ring > te
        seen.append(torch_ring)
    assert seen == sorted(seen)
    assert _cp_seconds(_training("torch_allgather"), Layout(cp=1, micro_batch=1)) == 0.0


def test_full_recompute_reruns_the_forward_merges():
    lay = dict(cp=8, micro_batch=1)
    tr = _training("torch_allgather")
    full, sel = _cp_seconds(tr, Layout(recompute="full", **lay)), _cp_seconds(tr, Layout(recompute="none", **lay))
    fwd, _ = torch_ring_merge_bytes(ModelProfile(MODEL, tr), Layout(recompute="full", **lay), tr)
    layers = MODEL.num_layers
    assert full - sel >= Kernels(HW, tr).stream(fwd) * layers * (1 - 1e-9)


def test_overlap_off_exposes_the_allgather_ring():
    L = Layout(cp=8, micro_batch=1, recompute="full")
    on, off = _training("torch_allgather"), _training("torch_allgather", cp_comm_overlap=False)
    assert _cp_seconds(off, L) > _cp_seconds(on, L)


def test_off_diagonal_ring_steps_run_at_the_full_block_rate():
    # (cp − 1)/cp of a causal layer's attention FLOPs are full blocks; a sliding window stays causal
    from autopar.cost.cp import ring_full_share
    assert ring_full_share(1, 8192, 8192) == 0.0
    assert ring_full_share(8, 262144, 262144) == pytest.approx(7 / 8)
    assert ring_full_share(8, 4096, 262144) == 0.0
    tr = _training("torch_allgather")
    k = Kernels(HW, tr)
    assert k.km.attention_full_ratio == pytest.approx(370 / 335, rel=1e-3)   # FA3 paper Fig. 5(b)/5(e), FA2, 16K
    causal = k.attention(1e15, 32768, 128)
    ring = k.attention(1e15, 32768, 128, full_share=7 / 8)
    for c, r in zip(causal, ring):
        assert r == pytest.approx(c * (1 / 8 + 7 / 8 / k.km.attention_full_ratio))
    # a chip file that measures no full/causal ratio leaves the ring's attention as it was
    b200 = Kernels(load_hardware("b200"), TrainingSpec(seq_len=8192, global_batch=8))
    assert b200.attention(1e15, 32768, 128, full_share=7 / 8) == b200.attention(1e15, 32768, 128)


def test_the_allgather_rings_link_time_counts_its_expanded_kv():
    # what the DP window shares its link with: PyTorch's ring moves K and V of all 32 query heads (repeat_kv), a
    # gather forward and backward and cp fp32 dK/dV sends; Transformer Engine's 3 (cp − 1) sends of the 8 KV heads
    from autopar.cost.cp import cp_ring_seconds
    L = Layout(cp=8, micro_batch=1, recompute="full")
    t = {}
    for ring in ("torch_allgather", "te_p2p"):
        tr = _training(ring)
        est = Estimator(MODEL, HW, tr, 8)
        R = est.resolve(L)
        t[ring] = cp_ring_seconds(est.profile, est.stages(R.stage_layers)[0], R, tr, Network(HW), 3)
    assert t["torch_allgather"] > 2 * t["te_p2p"]
