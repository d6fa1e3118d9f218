"""Gated DeltaNet and KDA (autopar/blocks/deltanet.py) against hand counts."""

from __future__ import annotations

import pytest

from autopar.blocks import KDA, GatedDeltaNet


def _delta_rule_per_head(C: float, dk: int, dv: int) -> float:
    return (2 * (C / 2) * dk              # K K^T (lower triangle)
            + C * C / 3                   # triangular inverse, C^3/3 per chunk
            + 2 * (C / 2) * dk + 2 * (C / 2) * dv   # W = T K, U = T V
            + 2 * (C / 2) * dk + 2 * (C / 2) * dv   # Q K^T, scores (U - W S)
            + 3 * 2 * dk * dv)            # W S, Q S, state update


def test_gated_deltanet_parameters_and_flops_qwen3_next_shape():
    """Qwen3-Next GatedDeltaNet: 16 QK heads, 32 V heads, 128 each, conv 4 (in_proj_qkvz, in_proj_ba, out_proj)."""
    d = GatedDeltaNet(hidden=2048, heads=16, value_heads=32, head_dim=128, conv_kernel=4, output_gate=True)
    h = 2048
    in_qkvz = h * (2 * 16 * 128 + 2 * 32 * 128)
    in_ba = h * 2 * 32
    out = 32 * 128 * h
    assert d.gemm_params() == in_qkvz + in_ba + out
    conv_channels = 2 * 16 * 128 + 32 * 128
    assert d.other_params() == 4 * conv_channels + 2 * 32 + 128
    assert d.scan_flops() == pytest.approx(2 * 4 * conv_channels + 32 * _delta_rule_per_head(64, 128, 128))
    assert d.state_elems() == 32 * 128 * 128 + 3 * conv_channels     # per value head, + conv tail
    assert d.out_width() == 32 * 128 and d.in_width() == (in_qkvz + in_ba) // h


def test_gated_deltanet_splits_key_and_value_heads():
    d = GatedDeltaNet(hidden=2048, heads=4, value_heads=8, head_dim=128)
    tp = [r.problem(tp=8) for r in d.rules() if r.axis == "tp"]
    assert tp == ["num_heads (4) not divisible by tp (8)", None]
    cp = [r.problem(tp=2, cp=4) for r in d.rules() if r.axis == "tp·cp"]
    assert cp == ["num_heads (4) not divisible by tp·cp = 2·4 (all-to-all context parallel splits heads)", None]


def test_kda_parameters_flops_and_state():
    """Kimi Linear's KDA shape: h 2304, 32 heads x 128, conv 4, gate rank 128 (default: the head dim)."""
    k = KDA(hidden=2304, heads=32, head_dim=128, conv_kernel=4)
    h, H, d = 2304, 32, 128
    q = kk = v = h * H * d
    f_gate = h * d + d * H * d              # low-rank per-channel forget gate (rank d)
    g_gate = h * d + d * H * d              # low-rank output gate
    beta, o = h * H, H * d * h
    assert k.gemm_params() == q + kk + v + f_gate + g_gate + beta + o
    conv = 3 * H * d
    assert k.other_params() == 4 * conv + H + H * d + H * d + d      # conv, A_log, dt_bias, gate bias, norm
    assert k.scan_flops() == pytest.approx(2 * 4 * conv + H * _delta_rule_per_head(64, d, d))
    assert k.state_elems() == H * d * d + 3 * conv
    assert k.stored() == {"qkv": conv + 3 * H * d + H * d + H + H * d + H * d}
    assert KDA(hidden=2304, heads=32, head_dim=128, gate_low_rank=16).gemm_params() == \
        3 * h * H * d + 2 * (h * 16 + 16 * H * d) + beta + o
