"""Ring attention's buffers under CP: PyTorch's all-gather ring (TrainingSpec.cp_ring 'torch_allgather', the
torchtitan stack) and Transformer Engine's p2p ring ('te_p2p', Megatron-Core): what one attention layer holds beside
its working set (autopar/cost/memory.py torch_ring_backward_bytes, te_ring_bytes)."""

import pytest

from autopar.cost import Estimator
from autopar.cost.memory import te_ring_bytes, torch_ring_backward_bytes
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_model

MODEL = load_model("llama3_8b")


def _tr(ring: str, seq: int):
    from autopar.specs.training import TrainingSpec
    return TrainingSpec(seq_len=seq, global_batch=8, loss_runtime="torch", cp_ring=ring, cross_entropy="unfused")


def test_ring_bytes_count_the_gathered_kv_and_the_fp32_buffers():
    tr = _tr("torch_allgather", 8192)
    est = Estimator(MODEL, load_hardware("h100_sxm"), tr, 8)
    L = est.resolve(Layout(tp=2, cp=4, dp=1, pp=1, micro_batch=1))
    assert (MODEL.num_attention_heads, MODEL.hidden_size) == (32, 4096)      # head dim 128
    tokens = 8192 / 4
    kv = tokens * 16 * 2 * 128            # repeat_kv: K and V of every local query head (32 / TP 2)
    q = tokens * 16 * 128
    # gathered K/V of 4 ranks in bf16 + fp32 dQ + 3 fp32 dK/dV buffers + the step's bf16 dQ, dK, dV
    assert torch_ring_backward_bytes(est.profile, L, tr) == pytest.approx(4 * kv * 2 + 4 * (q + 3 * kv) + 2 * (q + kv))
    assert torch_ring_backward_bytes(est.profile, L.model_copy(update={"cp": 1}), tr) == 0


def _stage_act(ring: str, cp: int, pp: int, stage: int) -> float:
    """Activation bytes of one stage at 8K tokens per GPU (seq 8K·cp, one sequence per micro-batch), full AC."""
    from autopar.cost.memory import activation_bytes
    tr = _tr(ring, 8192 * cp)
    est = Estimator(MODEL, load_hardware("h100_sxm"), tr, 2 * pp * cp)
    L = est.resolve(Layout(tp=2, pp=pp, cp=cp, dp=1, micro_batch=1, recompute="full"))
    return activation_bytes(est.profile, est.stages(L.stage_layers)[stage], L, tr), est, L, tr


def test_the_ring_grows_a_first_stage_with_cp_but_not_a_loss_bound_last_stage():
    """A first pipeline stage has no loss phase: each ring's bytes add to its layer phase, at a fixed number of tokens
    per GPU. On a single stage of Llama 3 8B the loss backward's peak stays the larger, as torchtitan's 8B CP rows
    measure (83.9-84.5 GiB, flat in CP)."""
    a1, *_ = _stage_act("torch_allgather", 1, 2, 0)
    a4, est, L, tr = _stage_act("torch_allgather", 4, 2, 0)
    p4, *_ = _stage_act("te_p2p", 4, 2, 0)
    assert a4 - a1 == pytest.approx(torch_ring_backward_bytes(est.profile, L, tr))
    assert p4 - a1 == pytest.approx(te_ring_bytes(est.profile, L, tr)) and a4 > p4 > a1
    single = [_stage_act("torch_allgather", cp, 1, 0)[0] for cp in (1, 2, 4)]
    assert single[0] == pytest.approx(single[1]) == pytest.approx(single[2])


def test_te_ring_holds_every_steps_kv_and_output_in_its_forward():
    """Transformer Engine's p2p ring (AttnFuncWithCPAndKVP2P, TE@d0067d0d): the forward keeps every step's K/V
    receive buffer and output until its correction loop, which writes an fp32 output; the backward a dQ buffer, two
    K/V-and-gradient buffers and one step's gradients. MLA, whose K/V are wide and not shared, holds the most."""
    from autopar.specs.training import TrainingSpec
    tr = TrainingSpec(seq_len=131072, global_batch=8)
    ds = load_model("deepseek_v2")
    est = Estimator(ds, load_hardware("b200"), tr, 8)
    L = Layout(tp=1, cp=8, dp=1, micro_batch=1)
    t = 131072 / 8
    kv = t * 128 * (192 + 128)                 # up-projected K and V of all 128 heads
    q, o = t * 128 * 192, t * 128 * 128
    fwd, bwd = 2 * 8 * (kv + o) + (4 + 2) * o, 2 * (2 * q + 5 * kv)
    assert (ds.num_attention_heads, ds.qk_head_dim, ds.v_head_dim) == (128, 192, 128)
    assert fwd > bwd and te_ring_bytes(est.profile, L, tr) == pytest.approx(fwd)
    assert te_ring_bytes(est.profile, L.model_copy(update={"cp": 1}), tr) == 0
    # GQA shares K/V over query heads: Llama 3 70B at TP 8 keeps one KV head per rank
    ll = load_model("llama3_70b")
    est = Estimator(ll, load_hardware("b200"), tr, 64)
    L = Layout(tp=8, cp=8, dp=1, micro_batch=1)
    kv, o = t * 1 * 256, t * 8 * 128
    assert te_ring_bytes(est.profile, L, tr) == pytest.approx(2 * 8 * (kv + o) + 6 * o)
