"""PyTorch's loss path (TrainingSpec.loss_runtime 'torch', the torchtitan stack): what it holds of the logits on the
last stage (autopar/cost/memory.py logit_bytes_per_element)."""

import pytest

from autopar.cost import Estimator
from autopar.cost.result import GIB
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_model
from autopar.specs.training import TrainingSpec

MODEL = load_model("llama3_8b")


def activations(runtime: str, layout: Layout, gpus: int = 8, seq: int = 4096, gb: int = 16) -> float:
    tr = TrainingSpec(seq_len=seq, global_batch=gb, loss_runtime=runtime, cross_entropy="unfused")
    return Estimator(MODEL, load_hardware("h100_sxm"), tr, gpus).estimate(layout).memory_gib.activations


def logit_gib(tokens: int, tp: int) -> float:
    """GiB of one byte per element of one micro-batch's vocab-parallel logits."""
    return tokens * MODEL.vocab_size / tp / GIB


@pytest.mark.parametrize("tp", [1, 2])
def test_without_pp_the_bf16_logits_are_dropped_and_loss_parallel_holds_four_more_bytes(tp):
    # Megatron's path: the bf16 logits (2 B) and the unfused loss's 12 B; torchtitan drops the logits before the
    # backward ('del pred'), ATen's log_softmax holds 12 B without TP, DTensor loss_parallel 16 B with it
    lay = Layout(tp=tp, micro_batch=2, zero_stage=1, recompute="full")
    delta = activations("megatron", lay) - activations("torch", lay)
    per_elem = 2 + 12 - (16 if tp > 1 else 12)
    # ... and torch's final norm runs eagerly outside the compiled blocks: its fp32 input and bf16 output are saved
    # (6 B per element of its input, b·s·h, sequence-parallel under TP: the Layout's default sp)
    from autopar.cost.memory import TORCH_FINAL_NORM_BYTES
    norm = 2 * 4096 * MODEL.hidden_size * TORCH_FINAL_NORM_BYTES / tp / GIB
    assert delta == pytest.approx(per_elem * logit_gib(2 * 4096, tp) - norm, rel=1e-9)


def test_under_pp_the_last_stage_keeps_every_micro_batchs_logits():
    # PP 2 on 4 GPUs (DP 2), 16 micro-batches per step: torch.distributed.pipelining's last stage keeps 16 x 2 B of
    # bf16 logits beside the loss's 12 B; Megatron's path holds one micro-batch's 2 + 12 B
    from autopar.cost.memory import activation_bytes
    lay = Layout(tp=1, pp=2, micro_batch=1, zero_stage=1, recompute="full")
    last = {}
    for rt in ("megatron", "torch"):
        tr = TrainingSpec(seq_len=4096, global_batch=32, loss_runtime=rt, cross_entropy="unfused")
        est = Estimator(MODEL, load_hardware("h100_sxm"), tr, 4)
        L = est.resolve(lay)
        st = est.stages(L.stage_layers)[-1]
        assert st.is_last and L.grad_accum == 16
        last[rt] = activation_bytes(est.profile, st, L, tr) / GIB
    # ... and, on top, torch.distributed.pipelining's activation-receive buffers of the 15 micro-batches beyond the
    # one in flight (one bf16 stage-boundary tensor, s x h, each)
    from autopar.cost.memory import pipeline_boundary_tensors
    assert pipeline_boundary_tensors(st, L) == 16 - 1
    from autopar.cost.memory import TORCH_FINAL_NORM_BYTES
    boundary = 15 * 4096 * MODEL.hidden_size * 2 / GIB + 4096 * MODEL.hidden_size * TORCH_FINAL_NORM_BYTES / GIB
    assert last["torch"] - last["megatron"] == pytest.approx((12 + 2 * 16 - 14) * logit_gib(4096, 1) + boundary,
                                                             rel=1e-9)
