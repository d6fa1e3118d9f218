"""The MoE block (autopar/blocks/moe.py) against DeepSeek-V3's and Mixtral's shapes by hand."""

from __future__ import annotations

from autopar.blocks import MoE
from autopar.specs.loaders import load_model


def deepseek_v3() -> MoE:
    return MoE(hidden=7168, num_experts=256, top_k=8, expert_ffn=2048, num_shared=1, shared_ffn=2048)


def test_parameters_and_flops_by_hand():
    m = deepseek_v3()
    h, E, k, f = 7168, 256, 8, 2048
    expert = 3 * h * f
    assert m.one_expert_params() == expert
    assert m.params() == h * E + expert                             # router + one shared expert (TP-sharded)
    assert m.expert_params() == E * expert                          # routed (EP·ETP-sharded)
    assert m.forward_flops() == 2 * (h * E + expert + k * expert)
    assert m.routed_flops() == 2 * k * expert
    assert m.tp_reduces and m.routed
    assert MoE(hidden=8, num_experts=4, top_k=2, expert_ffn=16, expert_bias=True).one_expert_params() == \
        3 * 8 * 16 + 2 * 16 + 8                                     # GPT-OSS: expert biases


def test_kernels_membound_and_stored_activations():
    m = deepseek_v3()
    h, k, f = 7168, 8, 2048
    modules = [(lin.split, lin.module) for lin in m.gemms()]
    assert modules == [("replicated", "router"), ("col", "shared_experts"), ("row", "shared_experts"),
                       ("expert_col", "moe"), ("expert_row", "moe")]
    mb = m.membound()
    assert mb["permute"] == (2 * k * h, 2 * k * h) and mb["moe_act"] == (k * 3 * f, k * 5 * f)
    # the k routed copies entering fc1 only: the probabilities are applied in the expert activation, so the
    # combine keeps nothing of the experts' output (MoE.stored, Megatron-LM@d98e8a64 experts.py bias_act_func)
    assert m.stored() == {"shared": 3 * f, "moe_io": k * h, "moe_latent": 0.0, "moe_inner": k * 3 * f,
                          "moe_act": k * f}
    assert m.dispatch_elems() == k * h
    mixtral = MoE(hidden=4096, num_experts=8, top_k=2, expert_ffn=14336)
    assert not mixtral.tp_reduces and "shared_act" not in mixtral.membound() and mixtral.fp8_cast_width() == 0


def test_rules_ep_etp_and_shared():
    m = deepseek_v3()
    broken = [r.problem(tp=3, ep=3, etp=3) for r in m.rules()]
    assert broken == ["shared expert FFN (2048) not divisible by tp (3)", "num_experts (256) not divisible by ep (3)",
                      "expert_ffn_hidden_size (2048) not divisible by etp (3)"]
    assert [r.problem(tp=8, ep=64, etp=1) for r in m.rules()] == [None, None, None]


def test_expert_bias_adds_megatrons_eager_output_bias_kernels():
    # TEGroupedMLP._apply_bias (autopar.blocks.moe.EXPERT_BIAS_ELEMS): 14 forward, 18 backward 2-byte units per element
    # of each of the k routed copies' width h; nothing for experts without biases (DeepSeek-V3)
    h, k = 2880, 4
    m = MoE(hidden=h, num_experts=128, top_k=k, expert_ffn=2880, expert_bias=True)
    assert m.membound()["expert_bias"] == (14.0 * k * h, 18.0 * k * h)
    assert "expert_bias" not in deepseek_v3().membound()


def test_clamped_activation_adds_megatrons_eager_clamp_kernels():
    # weighted_bias_quick_geglu_impl clamps the two halves and concatenates them in eager PyTorch before the fused
    # activation (autopar.blocks.moe.CLAMP_ELEMS): 8 forward, 15 backward 2-byte units per element of each routed
    # copy's f_e; the same MoE without the clamp has no such entry, and its other entries do not move
    h, k, f = 2880, 4, 2880
    clamped = MoE(hidden=h, num_experts=128, top_k=k, expert_ffn=f, expert_bias=True, clamped=True)
    plain = MoE(hidden=h, num_experts=128, top_k=k, expert_ffn=f, expert_bias=True)
    assert clamped.membound()["moe_act_clamp"] == (8.0 * k * f, 15.0 * k * f)
    assert "moe_act_clamp" not in plain.membound()
    assert {n: v for n, v in clamped.membound().items() if n != "moe_act_clamp"} == plain.membound()
    assert MoE.from_spec(load_model("gpt_oss_120b")).clamped and not MoE.from_spec(load_model("qwen3_30b_a3b")).clamped
    # autograd's clamps save the fc1 output beside the activation function's clamped copy: 2 f_e more per copy
    assert clamped.stored()["moe_act_clamp"] == 2.0 * k * f and "moe_act_clamp" not in plain.stored()
