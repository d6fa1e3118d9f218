"""What gpt-oss-120b's Megatron-Bridge runs hold and move around the loss and the routed experts: Transformer Engine's
in-place cross entropy (TrainingSpec.cross_entropy 'te', autopar/cost/memory.py LOGIT_EXTRA_BYTES, compute.py
CROSS_ENTROPY_BYTES) and the routed copies Megatron-Core keeps (autopar/blocks/moe.py MoE.stored)."""

import pytest

from autopar.cost import Estimator
from autopar.cost.result import GIB
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_model
from autopar.specs.training import TrainingSpec

MODEL = load_model("gpt_oss_120b")
# Megatron-Bridge 26.04.01 archive row: DGX-B200, 64 GPUs, BF16, GBS 1280, MBS 4, 4K, TP1 PP1 EP8 (Megatron-Bridge
# v0.4.0 scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py GPT_OSS_120B_PRETRAIN_CONFIG_B200_BF16_V2:
# recompute_modules layernorm, moe_act; utils/overrides.py _set_common_perf_overrides: cross_entropy_fusion_impl 'te';
# gpt_oss_llm_pretrain.py: grad_reduce_in_fp32 False)
LAYOUT = Layout(tp=1, pp=1, ep=8, micro_batch=4, zero_stage=1, recompute="layernorm,moe_act")


def estimate(cross_entropy: str):
    tr = TrainingSpec(seq_len=4096, global_batch=1280, precision="bf16", grad_dtype="bf16",
                      cross_entropy=cross_entropy)
    return Estimator(MODEL, load_hardware("b200"), tr, 64).estimate(LAYOUT)


def test_te_cross_entropy_holds_nothing_beside_the_logits_and_moves_two_bytes_more():
    fused, te = estimate("fused"), estimate("te")
    elems = 4 * 4096 * MODEL.vocab_size           # one micro-batch's logits on the only stage (TP 1)
    # the native fused kernel keeps an fp32 softmax (4 B) beside the bf16 logits; TE's writes its gradient into them
    assert fused.memory_gib.activations - te.memory_gib.activations == pytest.approx(4 * elems / GIB, rel=1e-9)
    # 10 B against 8 B of HBM traffic per logit element (forward + backward), at the chip's streaming rate
    from autopar.cost.compute import head_time
    from autopar.cost.kernels import Kernels
    from autopar.cost.layer_sums import ModelProfile
    times = {}
    for ce in ("fused", "te"):
        tr = TrainingSpec(seq_len=4096, global_batch=1280, precision="bf16", grad_dtype="bf16", cross_entropy=ce)
        kern = Kernels(load_hardware("b200"), tr)
        times[ce] = sum(head_time(kern, ModelProfile(MODEL, tr), LAYOUT, tr, 4 * 4096))
    assert times["te"] - times["fused"] == pytest.approx(kern.stream(2 * elems), rel=1e-9)


def test_the_b200_recipe_that_ran_is_predicted_to_fit():
    # it ran on B200's 180 GB (167.6 GiB); before these two terms autopar predicted 174.9 GiB (does not fit)
    mem = estimate("te").memory_gib
    assert mem.total < load_hardware("b200").hbm_gib
    # the routed copies: k·h entering fc1 and k·2f_e of fc1 output per token and MoE layer under moe_act recompute,
    # plus attention and norms; the experts' outputs are not among them (MoE.stored)
    assert mem.activations < 70


def test_routed_expert_outputs_are_not_stored():
    # the routed part of the stored activations, what the 'moe' recompute module drops, is k·h + k·3f_e per token
    # and MoE layer (fc1 input, fc1 output, activation output) and, gpt-oss's clamps running eagerly here, their
    # saved copy of the fc1 output (k·2f_e, CLAMP_STORED); one layer's worth comes back as the backward's working
    # set, so the stage holds (layers - 1) of them less
    base = Layout(tp=1, pp=1, ep=8, micro_batch=1, zero_stage=1, recompute="none")
    moe = Layout(tp=1, pp=1, ep=8, micro_batch=1, zero_stage=1, recompute="moe")
    tr = TrainingSpec(seq_len=4096, global_batch=64, precision="bf16", grad_dtype="bf16", cross_entropy="te")
    est = Estimator(MODEL, load_hardware("b200"), tr, 64)
    delta = est.estimate(base).memory_gib.activations - est.estimate(moe).memory_gib.activations
    k, h, fe = 4, MODEL.hidden_size, MODEL.moe.expert_ffn_hidden_size
    per_token_layer = k * h + k * 3 * fe + k * 2 * fe
    assert delta == pytest.approx(4096 * (MODEL.num_layers - 1) * per_token_layer * 2 / GIB, rel=1e-6)


def test_torchtitan_s_fp32_weighting_multiply_keeps_two_more_elements_per_routed_copy():
    # torchtitan multiplies the k routed copies by their scores in fp32 (torchtitan/models/moe.py): the multiply saves
    # the fp32 operand, 4 B = two bf16 elements per element of k·h, per token and MoE layer; Megatron-Core multiplies
    # inside the expert activation and keeps nothing more
    qwen = load_model("qwen3_30b_a3b")
    lay = Layout(tp=1, pp=1, ep=8, micro_batch=1, zero_stage=1, recompute="none")
    acts = {}
    for w in ("activation", "fp32_multiply"):
        tr = TrainingSpec(seq_len=4096, global_batch=64, precision="bf16", grad_dtype="bf16", moe_weighting=w)
        acts[w] = Estimator(qwen, load_hardware("h100_sxm"), tr, 8).estimate(lay).memory_gib.activations
    k, h, layers = qwen.moe.top_k, qwen.hidden_size, qwen.num_layers
    assert acts["fp32_multiply"] - acts["activation"] == pytest.approx(4096 * layers * 2 * k * h * 2 / GIB, rel=1e-6)
    # under the 'moe' recompute module the whole MoE block is re-run, the multiply's fp32 copy with it
    lay = Layout(tp=1, pp=1, ep=8, micro_batch=1, zero_stage=1, recompute="moe")
    moe = {w: Estimator(qwen, load_hardware("h100_sxm"), TrainingSpec(
        seq_len=4096, global_batch=64, precision="bf16", grad_dtype="bf16", moe_weighting=w), 8).estimate(lay)
        .memory_gib.activations for w in ("activation", "fp32_multiply")}
    # one layer's worth comes back as the backward's working set
    assert moe["fp32_multiply"] - moe["activation"] == pytest.approx(4096 * 2 * k * h * 2 / GIB, rel=1e-6)


def test_eager_clamps_keep_one_more_copy_of_the_fc1_output():
    """Megatron-Core's weighted_bias_quick_geglu_impl clamps the two GLU halves in eager PyTorch and concatenates them:
    autograd's clamp saves the fc1 output for its mask and the activation function saves the clamped copy, one copy
    (2 f_e per routed copy) more than an unclamped expert (autopar/blocks/moe.py CLAMP_STORED). Not under TE's fused
    grouped MLP (it clamps inside its kernels), nor where moe_act recompute drops the activation's tensors."""
    def act(recompute: str, **tr):
        t = TrainingSpec(seq_len=4096, global_batch=1280, precision="bf16", grad_dtype="bf16", **tr)
        lay = LAYOUT.model_copy(update={"recompute": recompute})
        return Estimator(MODEL, load_hardware("b300"), t, 64).estimate(lay).memory_gib.activations
    k, fe, layers = MODEL.moe.top_k, MODEL.moe.expert_ffn_hidden_size, MODEL.num_layers
    copy = 4 * 4096 * k * 2 * fe * layers * 2 / GIB          # one micro-batch (PP 1), TP 1, bf16
    assert act("layernorm") - act("layernorm", fused_grouped_mlp=True) == pytest.approx(copy, rel=1e-6)
    # moe_act recompute keeps only its checkpoint's input: the clamps' copy is back for one layer, in its backward
    assert act("layernorm,moe_act") - act("layernorm,moe_act", fused_grouped_mlp=True) == \
        pytest.approx(copy / layers, rel=1e-6)
