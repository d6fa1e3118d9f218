"""Multi-head latent attention (autopar/blocks/mla.py) against DeepSeek-V3's shapes by hand."""

from __future__ import annotations

from autopar.blocks import MLA


def deepseek_v3() -> MLA:
    return MLA(hidden=7168, heads=128, kv_heads=128, head_dim=56, q_lora_rank=1536, kv_lora_rank=512,
               qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)


def test_mla_parameters_by_hand():
    """DeepSeek-V3 (arXiv 2412.19437): W_DQ, q norm, W_UQ, W_DKV (+ rope key), kv norm, W_UKV, O."""
    m = deepseek_v3()
    h, a = 7168, 128
    w_dq, q_norm, w_uq = h * 1536, 1536, 1536 * a * 192
    w_dkv, kv_norm, w_ukv = h * (512 + 64), 512, 512 * a * (128 + 128)
    o = a * 128 * h
    assert m.params() == w_dq + q_norm + w_uq + w_dkv + kv_norm + w_ukv + o
    assert m.params() == 187_107_328                                  # 0.187B per layer
    assert m.kv_params() == 0                                         # the latent is not replicated by KV head
    full_q = MLA(hidden=2048, heads=16, kv_heads=16, head_dim=128, kv_lora_rank=512, qk_nope_head_dim=128,
                 qk_rope_head_dim=64, v_head_dim=128)                  # DeepSeek-V2-Lite: no Q compression
    assert full_q.params() == 2048 * 16 * 192 + 2048 * 576 + 512 + 512 * 16 * 256 + 16 * 128 * 2048


def test_mla_kernels_and_stored_activations():
    m = deepseek_v3()
    a, dq, dv = 128, 192, 128
    splits = [(lin.split, lin.module) for lin in m.gemms()]
    assert splits == [("replicated", "attn"), ("col", "mla_up_proj"), ("replicated", "attn"),
                      ("col", "mla_up_proj"), ("row", "attn")]
    up = a * (2 * dq + dv)
    assert m.stored() == {"mla_up": up, "qkv": 1536 + 512 + 64 + up, "attn_out": a * dv}
    assert m.membound()["rope"] == (2 * 129 * 64, 2 * 129 * 64)        # a query heads + the shared key
    assert m.attention_core_flops(4096) == 2 * 2048 * a * (dq + dv)
    assert [r.field for r in m.rules()] == ["num_attention_heads"]     # no KV-head rule


def test_cp_ring_carries_the_up_projected_kv_of_the_local_heads():
    assert deepseek_v3().ring_elems(8) == 128 / 8 * (192 + 128)
