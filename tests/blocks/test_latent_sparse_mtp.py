"""LatentMoE (Nemotron 3 Super/Ultra), DeepSeek Sparse Attention's indexer (DeepSeek-V3.2) and multi-sub-layer MTP
modules, each priced as what it is (issue 22)."""

from __future__ import annotations

import pytest

from autopar.blocks import MLA, MoE
from autopar.specs.model import ModelSpec


def test_latent_moe_runs_the_experts_at_the_latent_width():
    h, l, E, k, f = 4096, 1024, 512, 22, 2688
    plain = MoE(hidden=h, num_experts=E, top_k=k, expert_ffn=f, num_shared=1, shared_ffn=5376, gated=False)
    lat = MoE(hidden=h, num_experts=E, top_k=k, expert_ffn=f, num_shared=1, shared_ffn=5376, gated=False, latent=l)
    assert lat.one_expert_params() == 2 * l * f and plain.one_expert_params() == 2 * h * f
    assert lat.params() == plain.params() + 2 * h * l              # fc1_latent_proj + fc2_latent_proj
    assert lat.dispatch_elems() == k * l and plain.dispatch_elems() == k * h
    assert lat.routed_flops() == pytest.approx(plain.routed_flops() * l / h)
    gemms = {(g.k, g.n, g.split) for g in lat.gemms()}
    assert {(h, l, "replicated"), (l, h, "replicated"), (l, f, "expert_col"), (f, l, "expert_row")} <= gemms
    assert lat.membound()["permute"] == (2.0 * k * l, 2.0 * k * l)
    assert lat.stored()["moe_io"] == k * l and lat.stored()["moe_latent"] == 2.0 * l


def _mla(**kw):
    return MLA(hidden=7168, heads=128, kv_heads=128, head_dim=56, q_lora_rank=1536, kv_lora_rank=512,
               qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, **kw)


@pytest.mark.parametrize("s", [1024, 2048, 4096, 32768])
def test_sparse_attention_prices_the_indexer_and_the_top_k_keys(s):
    dense, dsa = _mla(), _mla(index_heads=64, index_head_dim=128, index_topk=2048)
    assert dsa.indexer_params() == 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64
    assert dsa.projection_params() == dense.projection_params() + dsa.indexer_params()
    # a query at position t attends to min(t, k) keys: the mean over t = 1..s
    exact = sum(min(t, 2048) for t in range(1, s + 1)) / s
    assert dsa.context(s) == pytest.approx(exact, rel=2e-3)
    scores = 2.0 * (s / 2) * 64 * (128 + 1)                       # over all earlier keys
    assert dsa.attention_core_flops(s) == pytest.approx(
        2.0 * dsa.context(s) * 128 * (192 + 128) + scores)
    if s > 4096:
        assert dsa.attention_core_flops(s) < dense.attention_core_flops(s)   # sparse wins on long sequences
    assert len(dsa.gemms()) == len(dense.gemms()) + 3


def test_mtp_sublayers_are_counted_each():
    base = dict(name="m", num_layers=4, hidden_size=256, ffn_hidden_size=512, num_attention_heads=4,
                vocab_size=1000, gated_mlp=False, position_embedding="none",
                moe={"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 128, "num_shared_experts": 1},
                mixers={"mamba": {"kind": "mamba2", "num_heads": 8, "head_dim": 64, "state_size": 16}},
                layer_pattern=["mamba", "none", "attention", "none"], mlp_pattern=["none", "moe", "none", "moe"],
                mtp_layers=1)
    last_only = ModelSpec(**base)
    two = ModelSpec(**base, mtp_layer_pattern=["attention", "none"], mtp_mlp_pattern=["none", "moe"])
    h = 256
    attn_sub = two.attention_params + two.norm_params
    moe_sub = two.channel_block(1).params() + two.moe_layer_expert_params + two.norm_params
    assert two.mtp_module_params == 2 * two.norm_params + 2 * h * h + attn_sub + moe_sub
    assert last_only.mtp_module_params == 2 * two.norm_params + 2 * h * h + moe_sub
    assert two.mtp_module_expert_params == two.moe_layer_expert_params
    assert two.mtp_forward_flops_per_token(1024) > last_only.mtp_forward_flops_per_token(1024)
    assert two.total_params == last_only.total_params                    # MTP is not in the published total
    assert any("MTP" in n for n in two.pricing_notes())
    with pytest.raises(ValueError, match="mtp_layer_pattern"):
        ModelSpec(**base, mtp_layer_pattern=["attention"])
