"""What PyTorch FSDP2 (``dp_impl`` fsdp2, torchtitan) holds per block, counted from torch's source (autopar/cost/
memory.py, FSDP2's per-block buffers): one gathered block, the all-gather copy-in stream's two flat outputs, and, in
a layer's backward only, the block's bf16 unsharded gradients, the previous block's fp32 reduce-scatter input and the
head's unsharded gradient. Megatron's path keeps its own count."""

import pytest

from autopar.cost import Estimator
from autopar.cost.memory import (activation_bytes, buffer_bytes, fsdp2_all_gather_pool_bytes, fsdp2_backward_bytes,
                                 fsdp2_block_params)
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_model
from autopar.specs.training import TrainingSpec

MODEL = load_model("llama3_8b")
TR = TrainingSpec(seq_len=4096, global_batch=16, dp_impl="fsdp2", loss_runtime="torch", cross_entropy="unfused")


def _stage(tr: TrainingSpec, model=MODEL, gpus: int = 8, **lay):
    est = Estimator(model, load_hardware("h100_sxm"), tr, gpus)
    L = est.resolve(Layout(**{"tp": 1, "micro_batch": 1, "zero_stage": 3, "recompute": "full", **lay}))
    return est.profile, est.stages(L.stage_layers), L


def test_one_block_is_its_share_of_the_layers():
    prof, (st,), L = _stage(TR)
    assert fsdp2_block_params(prof, st, L) == pytest.approx(
        (prof.model.total_params - prof.embedding_params - prof.head_params) / MODEL.num_layers, rel=1e-3)


def test_the_all_gather_stream_keeps_the_root_and_one_block_flat_output():
    """Forward: each unit's flat all-gather output stays until the next unit's copy-out, and the root (embedding,
    head) is gathered first, so the copy-in stream's pool peaks at the root's flat output and the first block's:
    2 B per parameter each. None on one rank."""
    prof, (st,), L = _stage(TR)
    block = fsdp2_block_params(prof, st, L)
    root = prof.embedding_params + prof.head_params
    assert fsdp2_all_gather_pool_bytes(prof, st, L, TR) == pytest.approx(2 * (root + block), rel=1e-12)
    prof1, (st1,), L1 = _stage(TR, gpus=1, dp=1)
    assert fsdp2_all_gather_pool_bytes(prof1, st1, L1, TR) == 0


def test_a_middle_pipeline_stage_pools_two_blocks():
    """A stage without the embedding or the head has no root parameters to gather: two blocks' flat outputs."""
    tr = TR   # pp_fsdp per_microbatch, TrainingSpec's default: FSDP stays ZeRO-3 under PP
    prof, stages, L = _stage(tr, gpus=16, pp=4, dp=4)
    mid = stages[1]
    assert not (mid.is_first or mid.is_last)
    assert fsdp2_all_gather_pool_bytes(prof, mid, L, tr) == pytest.approx(
        2 * 2 * fsdp2_block_params(prof, mid, L), rel=1e-12)


def test_buffers_at_zero_3_are_one_gathered_block_the_root_and_the_pool():
    """Beside ZeRO-1 (no FSDP terms), FSDP2's ZeRO-3 buffers are the gathered block, the root module's gathered
    parameters and the pool; Megatron's ZeRO-3 keeps two gathered blocks and one block's gradient."""
    prof, (st,), L = _stage(TR)
    z1 = L.model_copy(update={"zero_stage": 1})
    block = fsdp2_block_params(prof, st, L)
    root = 2 * (prof.embedding_params + prof.head_params)
    pool = fsdp2_all_gather_pool_bytes(prof, st, L, TR)
    assert buffer_bytes(prof, st, L, TR) - buffer_bytes(prof, st, z1, TR) == pytest.approx(2 * block + root + pool,
                                                                                              rel=1e-12)
    mega = TR.model_copy(update={"dp_impl": "megatron"})
    per_layer = (prof.model.total_params) / MODEL.num_layers
    assert buffer_bytes(prof, st, L, mega) - buffer_bytes(prof, st, z1, mega) == pytest.approx(
        per_layer * (2 * 2 + mega.grad_bytes), rel=1e-3)


def test_a_layer_backward_holds_bf16_gradients_the_fp32_reduce_scatter_input_and_the_head_gradient():
    """In a block's backward: its unsharded gradients in bf16 (2 B), the previous block's fp32 reduce-scatter input
    (4 B, held until this block's is issued) and, on the head's stage, the head's bf16 gradient (the root reduces
    after the whole backward)."""
    prof, (st,), L = _stage(TR)
    block = fsdp2_block_params(prof, st, L)
    assert TR.grad_bytes == 4
    assert fsdp2_backward_bytes(prof, st, L, TR) == pytest.approx((2 + 4) * block + 2 * prof.head_params,
                                                                  rel=1e-12)


@pytest.mark.parametrize("vocab_wins", [True, False])
def test_the_backward_bytes_belong_to_the_layer_phase(vocab_wins):
    """They add to one layer's working set, not to the loss backward's peak: with a large vocabulary the loss phase
    stays the larger and the activations do not move; with a small one they add in full."""
    model = MODEL if vocab_wins else MODEL.model_copy(update={"vocab_size": 256})
    prof, (st,), L = _stage(TR, model=model)
    mega = TR.model_copy(update={"dp_impl": "megatron"})
    extra = fsdp2_backward_bytes(prof, st, L, TR)
    diff = activation_bytes(prof, st, L, TR) - activation_bytes(prof, st, L, mega)
    assert diff == (0.0 if vocab_wins else pytest.approx(extra, rel=1e-9))


def test_under_pp_per_step_a_backward_adds_only_the_bf16_gradients():
    """With pp_fsdp per_step (torchtitan under PP) the gradients accumulate unsharded in fp32, counted by the gradient
    term; the last micro-batch's reduce-scatter input takes their place: a block's backward adds its bf16 gradients."""
    tr = TR.model_copy(update={"pp_fsdp": "per_step"})
    prof, stages, L = _stage(tr, gpus=16, pp=4, dp=4)
    mid = stages[1]
    assert fsdp2_backward_bytes(prof, mid, L, tr) == pytest.approx(2 * fsdp2_block_params(prof, mid, L), rel=1e-12)
    assert fsdp2_backward_bytes(prof, mid, L, TR) == pytest.approx(6 * fsdp2_block_params(prof, mid, L), rel=1e-12)
