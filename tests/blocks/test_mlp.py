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
