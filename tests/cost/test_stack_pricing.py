"""Each stack knob moves the prediction the way it physically should (autopar/cost, autopar/specs/stack.py)."""

from autopar.cost import Estimator
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_model, load_stack
from autopar.specs.stack import parse_knobs
from autopar.specs.training import TrainingSpec


def step(knobs: str, precision: str = "bf16", layout: Layout | None = None, hw: str = "h100_grand_teton",
         stack: str = "torchtitan") -> float:
    st = load_stack(stack)
    k = st.with_knobs(parse_knobs(knobs))
    tr = TrainingSpec(seq_len=8192, global_batch=64, precision=precision, **k.training_fields())
    est = Estimator(load_model("llama3_8b"), st.on(load_hardware(hw)), tr, 8)
    return est.estimate(layout or Layout(tp=8, micro_batch=2, zero_stage=3, recompute="full")).step_time_s


def test_eager_elementwise_is_slower_than_compiled():
    assert step("eager") > step("compile")


def test_async_tp_hides_tp_communication():
    assert step("compile,async_tp") < step("compile")
    assert step("compile,async_tp", layout=Layout(tp=1, micro_batch=2, zero_stage=3)) == \
        step("compile", layout=Layout(tp=1, micro_batch=2, zero_stage=3))       # nothing to hide without TP


def test_rowwise_quantisation_moves_more_bytes_than_tensorwise():
    assert step("compile,fp8_recipe=rowwise", "fp8") > step("compile,fp8_recipe=tensorwise", "fp8")


def test_sdpa_fa2_attention_is_slower_than_the_chip_files_best():
    assert step("compile,attention=sdpa_fa2") > step("compile,attention=best")


def test_dp_overlap_off_exposes_the_fsdp_traffic():
    # Megatron-Core's distributed optimizer hides a fitted share (torchtitan's own fitted share is 0: nothing moves)
    lay = Layout(tp=1, micro_batch=1, zero_stage=3, recompute="full")
    assert step("dp_overlap=off", layout=lay, stack="megatron_core") > step("", layout=lay, stack="megatron_core")


def test_op_level_sac_sits_between_no_recompute_and_full():
    # torchtitan's selective policy re-runs every second matmul and the elementwise ops (compute.OP_SAC_SHARE) and
    # keeps fewer activations than Megatron's selective policy (memory.activation_elems_per_token)
    st = load_stack("torchtitan")
    tr = TrainingSpec(seq_len=8192, global_batch=16, **st.knobs.training_fields())
    mtr = tr.model_copy(update={"selective_ac": "modules"})
    model, hw = load_model("llama3_8b"), st.on(load_hardware("h100_grand_teton"))
    est = {k: Estimator(model, hw, t, 8) for k, t in (("op", tr), ("modules", mtr))}

    def run(which: str, rc: str):
        return est[which].estimate(Layout(micro_batch=2, zero_stage=3, recompute=rc))

    none, op, full = run("op", "none"), run("op", "selective"), run("op", "full")
    assert none.step_time_s < op.step_time_s < full.step_time_s
    assert full.memory_gib.total < op.memory_gib.total < none.memory_gib.total
    assert op.memory_gib.total < run("modules", "selective").memory_gib.total


def _moe_step(knobs: str, hw: str = "gb200_nvl72") -> float:
    st = load_stack("megatron_core")
    k = st.with_knobs(parse_knobs(knobs))
    tr = TrainingSpec(seq_len=4096, global_batch=256, precision="mxfp8", **k.training_fields())
    est = Estimator(load_model("qwen3_30b_a3b"), st.on(load_hardware(hw)), tr, 8)
    return est.estimate(Layout(ep=8, micro_batch=2)).step_time_s


def test_full_iteration_cuda_graphs_pay_no_per_layer_host_overhead():
    # compute.HOST_OVERHEAD_SHARE: a whole-iteration graph takes the host off the critical path; partial graphs leave
    # the routed experts eager, priced as no graphs
    hw = load_hardware("gb200_nvl72")
    est = Estimator(load_model("qwen3_30b_a3b"), hw, TrainingSpec(seq_len=4096, global_batch=256, precision="mxfp8"), 8)
    lay = est.resolve(Layout(ep=8, micro_batch=2))
    over = lay.grad_accum * est.stage_overhead_s(est.stages(lay.stage_layers)[0])
    assert over > 0
    assert _moe_step("cuda_graphs=partial") == _moe_step("cuda_graphs=none")
    assert abs(_moe_step("cuda_graphs=none") - _moe_step("cuda_graphs=full_iteration") - over) < 1e-9 * over


def test_fp8_lm_head_runs_the_output_projection_at_the_mxfp8_rate():
    # Megatron-Core fp8_output_proj: the head GEMM at the MXFP8 peak (2x BF16 on Blackwell), its operand casts added
    import pytest
    from autopar.cost.compute import head_time
    from autopar.cost.kernels import Kernels
    from autopar.cost.layer_sums import ModelProfile
    model, hw = load_model("deepseek_v3"), load_hardware("gb200_nvl72")
    times = {}
    for on in (False, True):
        tr = TrainingSpec(seq_len=4096, global_batch=256, precision="mxfp8", fp8_lm_head=on)
        f, b = head_time(Kernels(hw, tr), ModelProfile(model, tr), Layout(), tr, 4096.0)
        times[on] = f + b
    assert 0.45 * times[False] < times[True] < 0.65 * times[False]
    with pytest.raises(ValueError, match="fp8_lm_head"):
        TrainingSpec(seq_len=4096, global_batch=256, precision="bf16", fp8_lm_head=True)


def test_fused_grouped_mlp_drops_the_eager_expert_bias_kernels():
    # gpt-oss (expert biases): Megatron-Core's eager TEGroupedMLP adds the fc2 bias in unfused PyTorch kernels, memory
    # bound; Transformer Engine's op fuser (knob fused_grouped_mlp) adds it inside the grouped kernels. The difference
    # is exactly the expert_bias part's HBM time; a model without expert biases does not move.
    from autopar.cost.compute import layer_parts
    from autopar.cost.kernels import Kernels
    from autopar.cost.layer_sums import ModelProfile
    hw, lay = load_hardware("b300"), Layout(ep=8, micro_batch=4)
    parts = {}
    for on in (False, True):
        tr = TrainingSpec(seq_len=4096, global_batch=1280, precision="mxfp8", fused_grouped_mlp=on)
        prof = ModelProfile(load_model("gpt_oss_120b"), tr)
        kind = next(k for k in prof.kinds if k.is_moe)
        parts[on] = layer_parts(Kernels(hw, tr), kind, lay, tr, 16384.0, 1.0)
    assert "expert_bias" in parts[False] and "expert_bias" not in parts[True]
    f, b = parts[False]["expert_bias"]
    assert b > f > 0
    # the clamped activation's eager clamps (autopar.blocks.moe.CLAMP_ELEMS) likewise: Transformer Engine's
    # ScaledClampedQGeGLU clamps inside the fused kernels
    assert "moe_act_clamp" in parts[False] and "moe_act_clamp" not in parts[True]
    f, b = parts[False]["moe_act_clamp"]
    assert abs(b / f - 15 / 8) < 1e-9 and f > 0
    tr = TrainingSpec(seq_len=4096, global_batch=256, precision="mxfp8")
    steps = []
    for on in (False, True):
        t = tr.model_copy(update={"fused_grouped_mlp": on})
        steps.append(Estimator(load_model("qwen3_30b_a3b"), hw, t, 8).estimate(Layout(ep=8, micro_batch=2)).step_time_s)
    assert steps[0] == steps[1]


def test_megatrons_unfused_rope_and_clamps_are_not_an_eager_or_compiled_stacks():
    # rope_unfused (YaRN-scaled RoPE, autopar.blocks.attention.ROPE_UNFUSED_EXTRA) is Megatron-Core's unfused RoPE:
    # priced under the fused elementwise setting only (a compiled stack fuses it, an eager stack prices its own RoPE);
    # the expert activation's clamps (moe_act_clamp) are separate kernels in an eager stack too, fused when compiled
    from autopar.cost.compute import layer_parts
    from autopar.cost.kernels import Kernels
    from autopar.cost.layer_sums import ModelProfile
    hw, lay = load_hardware("b200"), Layout(ep=8, micro_batch=4)
    for mode in ("fused", "compiled", "eager"):
        tr = TrainingSpec(seq_len=4096, global_batch=1280, precision="bf16", elementwise=mode)
        prof = ModelProfile(load_model("gpt_oss_120b"), tr)
        kind = next(k for k in prof.kinds if k.is_moe)
        parts = layer_parts(Kernels(hw, tr), kind, lay, tr, 16384.0, 1.0)
        for name in ("rope_unfused", "moe_act_clamp"):
            f, b = parts[name]
            priced = mode == "fused" or (mode == "eager" and name == "moe_act_clamp")
            assert (f > 0 and b > 0) if priced else (f, b) == (0.0, 0.0), (mode, name, f, b)
