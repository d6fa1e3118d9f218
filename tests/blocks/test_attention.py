"""Softmax attention (autopar/blocks/attention.py) against hand counts: GQA, window, chunk, sinks, output gate."""

from __future__ import annotations

from autopar.blocks import Attention


def llama3_8b(**options) -> Attention:
    return Attention(hidden=4096, heads=32, kv_heads=8, head_dim=128, **options)


def test_gqa_parameters_by_hand():
    """Llama 3 8B: Q 4096·4096, K and V 4096·1024 each, O 4096·4096; KV replicated weights 2·h·g·d."""
    a = llama3_8b()
    assert a.params() == 4096 * 4096 * 2 + 2 * 4096 * 1024 == a.gemm_params() == a.projection_params()
    assert a.kv_params() == 2 * 4096 * 8 * 128
    biased = Attention(hidden=4096, heads=32, kv_heads=8, head_dim=128, qkv_bias=True)
    assert biased.params() == a.params() + (32 + 16) * 128                 # Qwen2: biases on q, k, v only
    assert Attention(hidden=768, heads=12, kv_heads=12, head_dim=64, linear_bias=True).params() == \
        4 * 768 * 768 + 3 * 768 + 768                                     # GPT-2: biases everywhere


def test_context_window_chunk_and_core_flops():
    s, a, d = 16384, 32, 128
    assert llama3_8b().context(s) == s / 2                                # causal: s/2 keys on average
    assert llama3_8b(window=128).context(s) == 128
    assert llama3_8b(chunk=8192).context(s) == 4096                       # a chunk of 8192: 4096 on average
    assert llama3_8b().attention_core_flops(s) == 2 * (s / 2) * a * 2 * d  # QK^T and AV
    assert llama3_8b(window=128).span(s) == 128 and llama3_8b().span(s) == s


def test_sinks_and_output_gate_add_their_weights_and_kernels():
    a, gated = llama3_8b(), llama3_8b(sinks=True, output_gate=True)
    assert gated.params() == a.params() + 32 + 4096 * 32 * 128             # + sinks + output gate
    assert len(gated.gemms()) == len(a.gemms()) + 1
    assert gated.stored()["qkv"] == a.stored()["qkv"] + 32 * 128


def test_kernels_membound_and_stored_activations():
    a = llama3_8b()
    qkv, o = a.gemms()
    assert (qkv.k, qkv.n, qkv.split, o.k, o.n, o.split) == (4096, 6144, "col", 4096, 4096, "row")
    h, rope = 4096, (32 + 8) * 128
    assert a.membound() == {"norm": (2 * h, 3 * h), "residual": (3 * h, 3 * h), "bda": (h, h),
                            "rope": (2 * rope, 2 * rope)}
    assert a.stored() == {"qkv": 32 * 128 + 2 * 8 * 128, "attn_out": 32 * 128}
    assert a.state_elems() == 0 and a.keeps_kv and not a.has_state


def test_tp_rules_heads_and_kv_replication():
    a = llama3_8b()
    assert [r.problem(tp=16) for r in a.rules()] == [None, None]           # 8 KV heads replicated twice
    assert [r.problem(tp=3) for r in a.rules()] == [
        "num_attention_heads (32) not divisible by tp (3)",
        "num_kv_heads (8) and tp (3) must divide one another (KV heads are replicated when fewer than tp)"]


def test_cp_ring_carries_the_local_kv_heads():
    """K and V of max(g/tp, 1) heads per token: 8 KV heads over tp 2 -> 4; over tp 16 -> 1 (replicated)."""
    a = llama3_8b()
    assert a.ring_elems(2) == 2 * 4 * 128 and a.ring_elems(16) == 2 * 1 * 128


def test_separate_projections_are_torchtitans_wq_wk_wv():
    """torchtitan@9dec370 models/llama/model.py: wq h -> a·d, wk and wv h -> g·d on one input, then wo; the same
    weights as Megatron-Core's fused linear_qkv + linear_proj."""
    a = llama3_8b(output_gate=True)
    q, k, v, o, gate = a.separate_gemms()
    assert [(g.k, g.n, g.split, g.shares_input) for g in (q, k, v, o)] == [
        (4096, 4096, "col", False), (4096, 1024, "col", True), (4096, 1024, "col", True), (4096, 4096, "row", False)]
    assert gate == a.gemms()[-1]                                            # the gate is its own GEMM either way
    assert sum(g.params for g in a.separate_gemms()) == sum(g.params for g in a.gemms())


def test_yarn_scaled_rope_runs_megatrons_unfused_kernels():
    # cos/sin scaled by YaRN's concentration (gpt-oss 1.3466): Megatron-Core's fused RoPE refuses it, and the unfused
    # path adds ROPE_UNFUSED_EXTRA (10 forward, 8 backward) per element of the rotary width (a+g)·d; plain RoPE, or
    # no RoPE, adds nothing, and nothing else moves
    from autopar.blocks.attention import ROPE_UNFUSED_EXTRA
    yarn = Attention(hidden=2880, heads=64, kv_heads=8, head_dim=64, rope_mscale=1.3466)
    plain = Attention(hidden=2880, heads=64, kv_heads=8, head_dim=64)
    r = (64 + 8) * 64
    assert ROPE_UNFUSED_EXTRA == (10.0, 8.0)
    assert yarn.membound()["rope_unfused"] == (10.0 * r, 8.0 * r)
    assert "rope_unfused" not in plain.membound()
    assert {k: v for k, v in yarn.membound().items() if k != "rope_unfused"} == plain.membound()
    nope = Attention(hidden=2880, heads=64, kv_heads=8, head_dim=64, rope=False, rope_mscale=1.3466)
    assert "rope_unfused" not in nope.membound()
