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


def working_gib(runtime: str, layout: Layout, gpus: int = 8, seq: int = 4096, gb: int = 16, stage: int = -1) -> float:
    """GiB of one layer's backward working set on the stage (the layer phase, beside the stored activations)."""
    from autopar.cost.memory import activation_elems_per_token, linear_input_scale
    tr = TrainingSpec(seq_len=seq, global_batch=gb, loss_runtime=runtime, cross_entropy="unfused")
    est = Estimator(MODEL, load_hardware("h100_sxm"), tr, gpus)
    L = est.resolve(layout)
    st = est.stages(L.stage_layers)[stage]
    _, working = activation_elems_per_token(est.profile, st, L, linear_input_scale(tr))
    return L.micro_batch * seq * tr.activation_bytes * working / GIB


@pytest.mark.parametrize("tp", [1, 2])
def test_without_pp_the_bf16_logits_are_dropped_and_loss_parallel_holds_four_more_bytes(tp):
    # Megatron's path: the bf16 logits (2 B) and the unfused loss's 12 B, summed with one layer's backward working
    # set; torchtitan drops the logits before the backward ('del pred'), ATen's log_softmax holds 12 B without TP,
    # DTensor loss_parallel 16 B with it, and the caching allocator keeps the freed bf16 logits' block (2 B) beside
    # them; that peak comes before any layer's backward, so torch's stage holds the larger phase, not both
    lay = Layout(tp=tp, micro_batch=2, zero_stage=1, recompute="full")
    delta = activations("megatron", lay) - activations("torch", lay)
    per_elem = 2 + 12 - (16 if tp > 1 else 12) - 2
    # ... and torch's final norm runs eagerly outside the compiled blocks: its fp32 input and bf16 output are saved
    # (6 B per element of its input, b·s·h, sequence-parallel under TP: the Layout's default sp)
    from autopar.cost.memory import TORCH_FINAL_NORM_BYTES
    norm = 2 * 4096 * MODEL.hidden_size * TORCH_FINAL_NORM_BYTES / tp / GIB
    working = working_gib("torch", lay)
    assert working == pytest.approx(working_gib("megatron", lay), rel=1e-12)
    loss_phase = ((16 if tp > 1 else 12) + 2) * logit_gib(2 * 4096, tp) + norm
    assert loss_phase > working > 0          # the loss phase is the peak here
    assert delta == pytest.approx(per_elem * logit_gib(2 * 4096, tp) - norm + working, rel=1e-9)


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
    # (the loss phase, 12 + 2 B per logit element and the final norm, outweighs one layer's working set, which
    # Megatron's path adds and torch's does not)
    working = working_gib("torch", lay, gpus=4, gb=32)
    assert (12 + 2) * logit_gib(4096, 1) > working > 0
    assert last["torch"] - last["megatron"] == pytest.approx((12 + 2 + 2 * 16 - 14) * logit_gib(4096, 1) + boundary
                                                             - working, rel=1e-9)


def test_compiled_op_sac_blocks_keep_no_down_projection_output():
    """torchtitan's op-level SAC: eager autograd stores every MUST_SAVE output, the down projection's too; a compiled
    block saves only what its backward reads, 1 h per token and layer less (measured: benchmarks/torch_sac_memory.py,
    7.766 h eager, 6.766 h compiled per layer); full AC keeps each layer's input either way."""
    from autopar.cost.memory import activation_elems_per_token
    lay = Layout(tp=1, micro_batch=2, zero_stage=3, recompute="selective")
    got = {}
    for ew in ("eager", "compiled"):
        tr = TrainingSpec(seq_len=8192, global_batch=16, loss_runtime="torch", selective_ac="op", elementwise=ew)
        est = Estimator(MODEL, load_hardware("h100_sxm"), tr, 8)
        L = est.resolve(lay)
        st = est.stages(L.stage_layers)[0]
        got[ew] = activation_elems_per_token(est.profile, st, L)
        full = activation_elems_per_token(est.profile, st, L.model_copy(update={"recompute": "full"}))
        assert full[0] == st.n_layers * MODEL.hidden_size
        got[ew, "full"] = full
    n, h = MODEL.num_layers, MODEL.hidden_size
    assert got["eager"][0] - got["compiled"][0] == pytest.approx(n * h, rel=1e-12)
    assert got["eager"][1] == got["compiled"][1] > 0            # one layer's backward re-materialises the same
    assert got["eager", "full"] == got["compiled", "full"]
    assert got["eager"][0] / (n * h) == pytest.approx(7.75)    # x, Q, V, w1's output, SDPA's output, w2's output


def test_the_torch_stage_holds_the_larger_of_its_loss_and_layer_phases():
    """The last stage's loss backward (fp32 temporaries, the cached bf16 logits block, the final norm) comes before
    any layer's backward: torch's runtime holds the larger of that and one layer's working set; a long sequence with
    a small vocabulary share makes the layer phase the larger."""
    from autopar.cost.memory import activation_bytes, activation_elems_per_token, linear_input_scale
    lay = Layout(tp=1, micro_batch=1, zero_stage=3, recompute="full")
    for seq, vocab_wins in ((4096, True), (4096, False)):
        model = MODEL if vocab_wins else MODEL.model_copy(update={"vocab_size": 256})
        tr = TrainingSpec(seq_len=seq, global_batch=8, loss_runtime="torch", cross_entropy="unfused")
        est = Estimator(model, load_hardware("h100_sxm"), tr, 8)
        L = est.resolve(lay)
        st = est.stages(L.stage_layers)[-1]
        kept, working = activation_elems_per_token(est.profile, st, L, linear_input_scale(tr))
        tokens = seq * L.micro_batch
        stored, layer = tokens * 2 * kept, tokens * 2 * working
        from autopar.cost.memory import TORCH_FINAL_NORM_BYTES
        loss = tokens * model.vocab_size * (12 + 2) + tokens * model.hidden_size * TORCH_FINAL_NORM_BYTES
        assert (loss > layer) == vocab_wins
        assert activation_bytes(est.profile, st, L, tr) == pytest.approx(stored + max(loss, layer), rel=1e-12)


@pytest.mark.parametrize("tp", [1, 2])
def test_a_compiled_loss_holds_its_measured_bytes_and_no_cached_logits_block(tp):
    """torch.compile'd cross entropy (torchtitan's loss under --training.compile from 2025-04; measured with
    benchmarks/torch_compiled_loss_memory.py): without TP the partition saves the bf16 logits and the backward writes
    a bf16 gradient, 4 B per logit element; with TP (loss_parallel traced) the forward's peak is 10 B. No fp32
    temporaries, so no eager allocator block (2 B) beside them. The eager loss holds 12 / 16 B and that block."""
    from autopar.cost.memory import activation_bytes, activation_elems_per_token, linear_input_scale
    lay = Layout(tp=tp, micro_batch=2, zero_stage=1, recompute="selective")
    got = {}
    for ce in ("unfused", "compiled"):
        tr = TrainingSpec(seq_len=8192, global_batch=16, loss_runtime="torch", cross_entropy=ce,
                          elementwise="compiled", selective_ac="op")
        est = Estimator(MODEL, load_hardware("h100_sxm"), tr, 8)
        L = est.resolve(lay)
        st = est.stages(L.stage_layers)[-1]
        _, working = activation_elems_per_token(est.profile, st, L, linear_input_scale(tr))
        got[ce] = activation_bytes(est.profile, st, L, tr) / GIB
        got["layer"] = L.micro_batch * 8192 * 2 * working / GIB
    logits = logit_gib(2 * 8192, tp)
    from autopar.cost.memory import TORCH_FINAL_NORM_BYTES
    norm = 2 * 8192 * MODEL.hidden_size * TORCH_FINAL_NORM_BYTES / tp / GIB
    eager_phase = ((16 if tp > 1 else 12) + 2) * logits + norm
    compiled_phase = (10 if tp > 1 else 4) * logits + norm
    assert eager_phase > compiled_phase > got["layer"] > 0      # the loss phase stays the peak at 2 x 8K tokens
    assert got["unfused"] - got["compiled"] == pytest.approx(eager_phase - compiled_phase, rel=1e-9)


def test_the_compiled_loss_is_the_stack_knob_under_compile_only():
    """torchtitan compiles the loss only when it compiles (build_cross_entropy_loss: ``if job_config.training.
    compile``), and from 2025-04 (compiled_loss on, the stack default); the Dec 2024 release did not (off)."""
    from autopar.errors import AutoparInputError
    from autopar.specs.loaders import load_stack
    from autopar.specs.stack import parse_knobs
    tt = load_stack("torchtitan")
    kernel = lambda knobs: tt.with_knobs(parse_knobs(knobs)).training_fields()["cross_entropy"]   # noqa: E731
    assert kernel("compile") == "compiled"
    assert kernel("eager") == kernel("compile,compiled_loss=off") == "unfused"
    with pytest.raises(AutoparInputError, match="compiled_loss"):
        tt.with_knobs(parse_knobs("compile,cross_entropy=fused"))       # torch's own loss is what compile wraps
    with pytest.raises(AutoparInputError, match="compiled_loss"):
        load_stack("megatron_core").with_knobs(parse_knobs("compile,compiled_loss=on"))
    with pytest.raises(ValueError, match="loss_runtime"):
        TrainingSpec(cross_entropy="compiled", loss_runtime="megatron")


@pytest.mark.parametrize("tp", [1, 2])
def test_a_compiled_loss_moves_its_counted_bytes_through_hbm(tp):
    """The head's cross entropy streams 44 B per logit element eager and 8 B compiled (24 B under loss_parallel),
    read from Inductor's kernels (autopar/cost/compute.py CROSS_ENTROPY_BYTES): the head's time differs by exactly
    the difference at the chip's stream rate."""
    from autopar.cost.compute import COMPILED_LOSS_PARALLEL_BYTES, CROSS_ENTROPY_BYTES, head_time
    from autopar.cost.kernels import Kernels
    from autopar.cost.layer_sums import ModelProfile
    hw, tokens = load_hardware("h200"), 16384.0
    t = {}
    for ce in ("unfused", "compiled"):
        tr = TrainingSpec(seq_len=8192, global_batch=16, loss_runtime="torch", cross_entropy=ce)
        kern = Kernels(hw, tr)
        t[ce] = sum(head_time(kern, ModelProfile(MODEL, tr), Layout(tp=tp), tr, tokens))
    compiled = COMPILED_LOSS_PARALLEL_BYTES if tp > 1 else CROSS_ENTROPY_BYTES["compiled"]
    assert compiled < CROSS_ENTROPY_BYTES["unfused"]
    saved = kern.stream(CROSS_ENTROPY_BYTES["unfused"] * tokens * MODEL.vocab_size / tp) - kern.stream(
        compiled * tokens * MODEL.vocab_size / tp)
    assert t["unfused"] - t["compiled"] == pytest.approx(saved, rel=1e-9) and saved > 0


def test_under_pp_the_compiled_loss_does_not_count_the_kept_logits_twice():
    """Without TP the compiled loss saves the bf16 logits (2 of its 4 B per element); under PP
    torch.distributed.pipelining's last stage keeps every micro-batch's logits anyway (output_chunks, counted apart),
    so the compiled loss adds only its bf16 gradient there: 2 B, against the eager loss's 12 + 2."""
    from autopar.cost.memory import activation_bytes
    lay = Layout(tp=1, pp=2, micro_batch=1, zero_stage=1, recompute="full")
    got = {}
    for ce in ("unfused", "compiled"):
        tr = TrainingSpec(seq_len=4096, global_batch=32, loss_runtime="torch", cross_entropy=ce)
        est = Estimator(MODEL, load_hardware("h100_sxm"), tr, 4)
        L = est.resolve(lay)
        st = est.stages(L.stage_layers)[-1]
        got[ce] = activation_bytes(est.profile, st, L, tr) / GIB
    working = working_gib("torch", lay, gpus=4, gb=32)
    assert 2 * logit_gib(4096, 1) > working > 0          # the loss phase stays the larger in both
    assert got["unfused"] - got["compiled"] == pytest.approx((12 + 2 - 2) * logit_gib(4096, 1), rel=1e-9)
