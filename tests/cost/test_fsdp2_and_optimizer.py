"""PyTorch FSDP2 and torch's foreach AdamW as torchtitan runs them (autopar/cost/dp.py, autopar/cost/optimizer.py):
fp32 reduce-scatter, the all-gather copy-out on the compute stream, one gather per step under pipelining, and the
optimizer's one-pass-per-op traffic."""

from __future__ import annotations

import pytest

from autopar.cost.collectives import Network
from autopar.cost.dp import dp_time_per_step
from autopar.cost.optimizer import optimizer_bytes_per_param, optimizer_time
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_stack
from autopar.specs.training import TrainingSpec

GT = load_hardware("h100_grand_teton")
MEGATRON = TrainingSpec(seq_len=8192, global_batch=16, dp_comm_overlap=False, grad_dtype="bf16")   # perf recipes'
FSDP2 = TrainingSpec(seq_len=8192, global_batch=16, dp_comm_overlap=False, dp_impl="fsdp2",
                     pp_fsdp="per_step")   # torchtitan's, as its stack (fp32 gradients: TrainingSpec)
HBM = GT.hbm_tbps * 1e12 * GT.kernel_model.hbm
P = 8.0e9   # parameters of the stage before sharding


def _dp(tr: TrainingSpec, **lay) -> tuple[float, float]:
    L = Layout(**{"tp": 1, "pp": 1, "dp": 8, "zero_stage": 3, "grad_accum": 2, **lay})
    return dp_time_per_step(P, 0.0, L, tr, GT, Network(GT), 1.0, 2.0, units=32)


def test_torchtitan_stack_runs_fsdp2_and_foreach_adamw():
    fields = load_stack("torchtitan").knobs.training_fields()
    assert (fields["dp_impl"], fields["optimizer_impl"]) == ("fsdp2", "foreach")
    assert TrainingSpec().dp_impl == "megatron" and TrainingSpec().optimizer_impl == "fused"


def test_fsdp2_reduces_in_fp32():
    """FSDP2's fp32 reduce dtype is TrainingSpec's one say: fp32 gradients whatever else is set, and a bf16 stated
    beside it is refused as the contradiction it is."""
    assert (MEGATRON.grad_bytes, FSDP2.grad_bytes) == (2, 4)
    assert TrainingSpec(dp_impl="fsdp2", grad_dtype="fp32").grad_dtype == "fp32"
    with pytest.raises(ValueError, match="grad_dtype bf16: FSDP2"):
        TrainingSpec(dp_impl="fsdp2", grad_dtype="bf16")


def test_unstated_grad_dtype_is_the_frameworks():
    """Unstated, the gradients are what Megatron-LM keeps for the weight dtype: fp32 main-gradient buffers for bf16
    weights (--bf16 sets --accumulate-allreduce-grads-in-fp32 unless --grad-reduce-in-bf16), fp16 ones for fp16
    weights; a stated dtype stands. The gradient bytes follow, and with them memory and DP traffic."""
    assert TrainingSpec().grad_dtype == "fp32" and TrainingSpec().grad_bytes == 4
    assert TrainingSpec(precision="fp8").grad_dtype == "fp32"
    assert TrainingSpec(precision="fp16", weight_dtype="fp16").grad_dtype == "fp16"
    assert TrainingSpec(grad_dtype="bf16").grad_bytes == 2
    fp32 = _dp(MEGATRON.model_copy(update={"grad_dtype": "fp32"}), zero_stage=0)[1]
    assert fp32 > 1.9 * _dp(MEGATRON, zero_stage=0)[1]   # the all-reduce moves twice the bytes


def test_fsdp2_copies_out_every_gather_on_the_compute_stream():
    """Same bytes on the wire as Megatron reducing in fp32; the difference is the copy-out of 2 gathers per
    micro-batch, 2 x 2 B per parameter each, at the HBM rate."""
    wire_fp32 = MEGATRON.model_copy(update={"grad_dtype": "fp32"})
    exposed_m, total_m = _dp(wire_fp32)
    exposed_f, total_f = _dp(FSDP2)
    copy_out = 2 * 2.0 * P / HBM
    assert total_f - total_m == pytest.approx(2 * 2 * copy_out, rel=1e-9)
    assert exposed_f - exposed_m == pytest.approx(2 * 2 * copy_out, rel=1e-9)   # overlap off: all exposed


def test_fsdp2_under_pipelining_gathers_reduces_and_copies_out_once_per_step():
    """torch's pipeline stage keeps FSDP2's parameters unsharded and its gradients unreduced between micro-batches
    (pp_fsdp per_step): the step's traffic and copy-out do not grow with the micro-batch count, at ZeRO-3 or at the
    ZeRO-1 torchtitan's PP rows are read as; without PP they do."""
    for zero in (1, 3):
        one = _dp(FSDP2, pp=2, grad_accum=1, zero_stage=zero)[1]
        assert _dp(FSDP2, pp=2, grad_accum=8, zero_stage=zero)[1] == pytest.approx(one)
    assert _dp(FSDP2, grad_accum=8)[1] > 7 * _dp(FSDP2, grad_accum=1)[1]
    with_copy, without = _dp(FSDP2, pp=2)[1], _dp(FSDP2.model_copy(update={"dp_impl": "megatron",
                                                                         "grad_dtype": "fp32"}), pp=2)[1]
    assert with_copy - without == pytest.approx(2 * 2.0 * P / HBM, rel=1e-9)   # one gather's copy-out


def test_foreach_adamw_moves_bytes_op_by_op():
    """fp32 params, moments and (FSDP2) gradients: 4 m + 14 s + 2 g for the AdamW ops and 3 g for torch's clipping."""
    foreach = FSDP2.model_copy(update={"optimizer_impl": "foreach"})
    assert optimizer_bytes_per_param(foreach) == 4 * 4 + 14 * 4 + 2 * 4 + 3 * 4 == 92
    assert optimizer_bytes_per_param(MEGATRON) == 2 + 2 * 12 + 2    # fused: g + 2 o + w
    assert optimizer_time(1e9, foreach, GT) == pytest.approx(92e9 / HBM)


def test_fsdp2_without_reshard_gathers_and_reduces_every_micro_batch():
    """ZeRO-2 as FSDP2 (reshard_after_forward False): one gather, one reduce-scatter and one copy-out per micro-batch,
    against Megatron's distributed optimizer, which reduces and gathers once per step."""
    one, four = _dp(FSDP2, zero_stage=2, grad_accum=1)[1], _dp(FSDP2, zero_stage=2, grad_accum=4)[1]
    assert four == pytest.approx(4 * one, rel=1e-9)
    megatron = MEGATRON.model_copy(update={"grad_dtype": "fp32"})
    assert _dp(megatron, zero_stage=2, grad_accum=4)[1] == pytest.approx(_dp(megatron, zero_stage=2, grad_accum=1)[1])
    # ZeRO-3 gathers twice per micro-batch (forward and backward), ZeRO-2 once
    assert _dp(FSDP2, zero_stage=3, grad_accum=1)[1] > one
