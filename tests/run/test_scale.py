"""scale_model (autopar/run/_scale.py) on hybrid models: the scaled model keeps its layer kinds and mixer shapes."""

from __future__ import annotations

import pytest

from autopar.run import scale_model
from autopar.specs.loaders import load_model

HYBRIDS = ["nemotron_h_8b", "qwen3_next_80b_a3b", "jamba_v0_1", "falcon_h1_7b", "kimi_linear_48b_a3b",
           "report_hybrid_17b", "nemotron3_nano_30b_a3b"]


def _kinds(m):
    """Layer kinds the pattern sets: (mixer entry, channel entry) with an mlp_pattern; the mixer entry alone
    where the channel follows the MoE placement rule (first dense layers, interval)."""
    if m.mlp_pattern is None:
        return {m.layer_pattern[i % len(m.layer_pattern)] for i in range(m.num_layers)}
    return {(m.layer_pattern[i % len(m.layer_pattern)], m.channel_of(i)) for i in range(m.num_layers)}


@pytest.mark.parametrize("name", HYBRIDS)
def test_fewer_layers_keep_every_layer_kind_where_there_is_room(name):
    m = load_model(name)
    kinds = _kinds(m)
    s = scale_model(m, layers=max(4, len(kinds)), hidden=512, heads=8, ffn=1024, vocab=1024,
                    experts=8 if m.moe else None)
    assert _kinds(s) == kinds
    assert set(s.mixers) <= set(m.mixers)


def test_the_layer_mix_follows_the_full_model():
    m = load_model("nemotron_h_8b")            # 24 Mamba-2, 4 attention, 24 MLP layers
    s = scale_model(m, layers=13)
    pattern = [(s.layer_pattern[i], s.mlp_pattern[i]) for i in range(13)]
    assert pattern.count(("mamba", "none")) == 6 and pattern.count(("none", "dense")) == 6
    assert pattern.count(("attention", "none")) == 1


@pytest.mark.parametrize("name", HYBRIDS)
def test_mixer_width_scales_with_hidden_and_keeps_head_dims(name):
    m = load_model(name)
    s = scale_model(m, hidden=m.hidden_size // 4, heads=max(1, m.num_attention_heads // 4))
    for key, mx in s.mixers.items():
        old = m.mixers[key]
        assert (mx.head_dim, mx.value_head_dim, mx.state_size, mx.chunk_size) == \
               (old.head_dim, old.value_head_dim, old.state_size, old.chunk_size)
        if mx.kind == "mamba1":
            assert mx.inner_size == pytest.approx(old.inner_size / 4, rel=0.01)
        elif mx.kind != "attention":
            assert mx.num_heads == max(1, old.num_heads // 4)


def test_models_without_a_pattern_are_scaled_as_before():
    m = load_model("llama3_8b")
    s = scale_model(m, layers=2, hidden=256, heads=4)
    assert s.layer_pattern is None and s.num_layers == 2 and s.hidden_size == 256 and not s.mixers
