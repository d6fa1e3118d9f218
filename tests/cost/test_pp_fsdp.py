"""FSDP under pipeline parallelism as torchtitan runs it (autopar/cost/dp.py, TrainingSpec.pp_fsdp): one gather
and one reduce-scatter per step, the reduce-scatter after the stage's last backward and exposed."""

import pytest

from autopar.cost.collectives import Network
from autopar.cost.dp import dp_time_per_step
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_stack
from autopar.specs.training import TrainingSpec

HW = load_hardware("h100_grand_teton")
NET = Network(HW)
PARAMS = 6.2e9          # one 405B PP8 TP8 stage's parameters per GPU before sharding


def _dp(mode: str, M: int, on: bool = True, t_fwd: float = 0.5, t_bwd: float = 1.0) -> tuple[float, float]:
    tr = TrainingSpec(seq_len=8192, global_batch=64 * M, pp_fsdp=mode, dp_comm_overlap=on,
                      grad_dtype="bf16")   # the schedule's counts, at 2 B a gradient as _ag_rs prices it
    L = Layout(tp=8, pp=8, dp=8, micro_batch=1, grad_accum=M, zero_stage=3, fsdp=True)
    return dp_time_per_step(PARAMS, 0.0, L, tr, HW, NET, t_fwd, t_bwd, units=16)


def _ag_rs() -> tuple[float, float]:
    ag_c, ag_t0 = NET.coefficients("all_gather", 8, 8)
    rs_c, rs_t0 = NET.coefficients("reduce_scatter", 8, 8)
    return PARAMS * 2 * ag_c + 16 * ag_t0, PARAMS * 2 * rs_c + 16 * rs_t0


def test_torchtitan_gathers_and_reduces_once_per_step_under_pp():
    assert load_stack("torchtitan").knobs.training_fields()["pp_fsdp"] == "per_step"
    ag, rs = _ag_rs()
    for M in (1, 8, 32):
        _, total = _dp("per_step", M)
        assert total == pytest.approx(ag + rs)                       # not M x (2 AG + RS)
        assert _dp("per_microbatch", M)[1] == pytest.approx(M * (2 * ag + rs))


def test_the_last_reduce_scatter_is_exposed_whatever_the_window():
    _, rs = _ag_rs()
    exposed, _ = _dp("per_step", 8, t_fwd=100.0, t_bwd=100.0)       # a window that hides every gather
    assert exposed == pytest.approx(_ag_rs()[0] / 16 + rs)           # the first layer's gather + the whole RS
    off, total = _dp("per_step", 8, on=False)
    assert off == pytest.approx(total)


def test_without_pp_nothing_changes():
    tr = TrainingSpec(seq_len=8192, global_batch=64, pp_fsdp="per_step")
    L = Layout(tp=8, dp=8, micro_batch=1, grad_accum=8, zero_stage=3, fsdp=True)
    per_mb = tr.model_copy(update={"pp_fsdp": "per_microbatch"})
    assert dp_time_per_step(PARAMS, 0.0, L, tr, HW, NET, 0.5, 1.0, 16) == \
        dp_time_per_step(PARAMS, 0.0, L, per_mb, HW, NET, 0.5, 1.0, 16)


def test_torch_pipelining_keeps_its_stage_buffers():
    """torch.distributed.pipelining (loss_runtime 'torch'): per micro-batch a gradient-receive buffer on every stage
    but the last, an activation-receive buffer on every stage but the first, and every micro-batch's stage output
    (output_chunks on every stage before pytorch/pytorch#153383); counted in stage-boundary tensors beyond the stored
    layer inputs (autopar/cost/memory.py docstring)."""
    from types import SimpleNamespace

    from autopar.cost.memory import pipeline_boundary_tensors
    pp, M = 4, 8
    stage = lambda i: SimpleNamespace(pp=pp, index=i, is_first=i == 0, is_last=i == pp - 1)   # noqa: E731
    L = SimpleNamespace(grad_accum=M, vpp=1)
    # first: M gradient buffers + M kept outputs; stage i in the middle: M gradient buffers, the M - (pp - i) receive
    # buffers beyond its pp - i in-flight inputs, M kept outputs; last: the M - 1 receive buffers beyond its one
    # in-flight input, no kept output (its logits are counted apart)
    assert [pipeline_boundary_tensors(stage(i), L) for i in range(pp)] == [2 * M, 3 * M - 3, 3 * M - 2, M - 1]
    # interleaved, 2 chunks per rank: the last rank keeps the M outputs of its first chunk (its second ends in logits)
    L2 = SimpleNamespace(grad_accum=M, vpp=2)
    c_last = min(2 * 0 + (2 - 1) * pp + 1, 2 * M)       # Megatron's warm-up count on the last rank: 5 chunks
    assert pipeline_boundary_tensors(stage(pp - 1), L2) == M + (2 * M - c_last) + M


def test_fsdp_under_pp_holds_zero1_bytes_as_torchtitan_runs_it():
    """Under PP with pp_fsdp per_step FSDP2 keeps the stage's parameters gathered and the fp32 gradients unsharded
    all step (memory.held_zero_stage): a ZeRO-3 layout holds what ZeRO-1 holds, not ZeRO-3's shards; without PP,
    or per micro-batch, ZeRO-3's shards."""
    from autopar.cost import Estimator
    from autopar.specs.loaders import load_model

    model = load_model("llama3_70b")
    tr = TrainingSpec(seq_len=8192, global_batch=64, **load_stack("torchtitan").knobs.training_fields())
    per_mb = tr.model_copy(update={"pp_fsdp": "per_microbatch"})

    def mem(spec, pp, zero):
        L = Layout(tp=8, pp=pp, dp=64 // (8 * pp), micro_batch=1, grad_accum=64 // (64 // (8 * pp)),
                   zero_stage=zero, fsdp=zero == 3)
        return Estimator(model, HW, spec, 64).estimate(L).memory_gib

    z3, z1 = mem(tr, 4, 3), mem(tr, 4, 1)
    assert (z3.weights, z3.grads, z3.optimizer) == pytest.approx((z1.weights, z1.grads, z1.optimizer))
    sharded = mem(per_mb, 4, 3)
    assert z3.weights + z3.grads > sharded.weights + sharded.grads + 1.0    # GiB: the gathered stage is held
    flat3 = mem(tr, 1, 3)
    assert flat3.grads < mem(tr, 1, 1).grads                                # no PP: ZeRO-3 shards the gradients
