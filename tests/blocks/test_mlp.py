"""The dense MLP (autopar/blocks/mlp.py) against hand counts."""

from __future__ import annotations

from autopar.blocks import MLP


def test_gated_and_plain_parameters_and_flops():
    assert MLP(hidden=4096, ffn=14336).params() == 3 * 4096 * 14336          # gate, up, down (Llama 3 8B)
    plain = MLP(hidden=768, ffn=3072, gated=False, bias=True)               # GPT-2: up, down and their biases
    assert plain.params() == 2 * 768 * 3072 + 3072 + 768
    assert plain.forward_flops() == 2 * plain.params()


def test_kernels_membound_stored_and_rule():
    m = MLP(hidden=4096, ffn=14336)
    up, down = m.gemms()
    assert (up.n, up.split, down.k, down.split) == (2 * 14336, "col", 14336, "row")
    assert m.membound()["mlp_act"] == (3 * 14336, 5 * 14336)               # SwiGLU: reads 2f writes f; bwd 2f+f, 2f
    assert MLP(hidden=8, ffn=16, gated=False).membound()["mlp_act"] == (2 * 16, 3 * 16)
    assert m.stored() == {"mlp": 3 * 14336}
    assert m.fp8_cast_width() == 4096 + 2 * 14336 + 14336 + 4096
    (rule,) = m.rules()
    assert rule.problem(tp=8) is None and rule.problem(tp=5) == "ffn_hidden_size (14336) not divisible by tp (5)"


def test_separate_projections_are_torchtitans_w1_w3_w2():
    """torchtitan@9dec370 models/llama/model.py FeedForward: w2(silu(w1 x) * w3 x): two h -> f GEMMs on one input."""
    w1, w3, w2 = MLP(hidden=4096, ffn=14336).separate_gemms()
    assert [(g.k, g.n, g.split, g.shares_input) for g in (w1, w3, w2)] == [
        (4096, 14336, "col", False), (4096, 14336, "col", True), (14336, 4096, "row", False)]
    plain = MLP(hidden=768, ffn=3072, gated=False)
    assert plain.separate_gemms() == plain.gemms()                          # one input GEMM: nothing to separate


def test_unfused_activation_counts_each_torch_op():
    """What the activation adds when it runs unfused (autopar/blocks/mlp.py ACT_UNFUSED_EXTRA), per unit of f."""
    f = 16
    # squared ReLU, torch.pow(F.relu(x), 2): relu 2 + pow 2 = 4 against 2; bwd pow_backward 7 + threshold_backward 3
    sq = MLP(hidden=8, ffn=f, gated=False, activation="squared_relu")
    assert sq.membound()["mlp_act_unfused"] == (2 * f, 7 * f)
    assert sq.membound()["mlp_act"] == (2 * f, 3 * f)                     # fused (or compiled): one kernel
    # GELU is one torch kernel each way: nothing to add, unless the bias is added on its own (read, write 1·f)
    assert MLP(hidden=8, ffn=f, gated=False).membound()["mlp_act_unfused"] == (0, 0)
    assert MLP(hidden=8, ffn=f, gated=False, bias=True).membound()["mlp_act_unfused"] == (2 * f, 0)
    # SwiGLU, act(x[0]) * x[1]: (5, 8) against the fused (3, 5), the eager stack's old 5/3 and 8/5
    fwd, bwd = MLP(hidden=8, ffn=f).membound()["mlp_act_unfused"]
    assert (3 * f + fwd, 5 * f + bwd) == (5 * f, 8 * f)


def test_a_biased_block_counts_its_bias_dropout_add_bias():
    assert "bda_bias" in MLP(hidden=8, ffn=16, bias=True).membound()
    assert "bda_bias" not in MLP(hidden=8, ffn=16).membound()
