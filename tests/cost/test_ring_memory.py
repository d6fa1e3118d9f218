"""PyTorch's all-gather ring attention (TrainingSpec.cp_ring 'torch_allgather', the torchtitan stack): what one
attention layer's backward holds beside its working set under CP (autopar/cost/memory.py torch_ring_backward_bytes)."""

import pytest

from autopar.cost import Estimator
from autopar.cost.memory import torch_ring_backward_bytes
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
    """A first pipeline stage has no loss phase: the ring's bytes add to its layer phase, at a fixed number of tokens
    per GPU, and te_p2p (Megatron's ring, not counted here) adds nothing. On a single stage of Llama 3 8B the loss
    backward's peak stays the larger, as torchtitan's 8B CP rows measure (83.9-84.5 GiB, flat in CP)."""
    a1, *_ = _stage_act("torch_allgather", 1, 2, 0)
    a4, est, L, tr = _stage_act("torch_allgather", 4, 2, 0)
    p4, *_ = _stage_act("te_p2p", 4, 2, 0)
    assert a4 - p4 == pytest.approx(torch_ring_backward_bytes(est.profile, L, tr)) and a4 > p4
    assert p4 == pytest.approx(a1)
    single = [_stage_act("torch_allgather", cp, 1, 0)[0] for cp in (1, 2, 4)]
    assert single[0] == pytest.approx(single[1]) == pytest.approx(single[2])
