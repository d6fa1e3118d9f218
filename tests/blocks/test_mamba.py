"""Mamba-2 and Mamba-1 (autopar/blocks/mamba.py) against hand counts."""

from __future__ import annotations

import pytest

from autopar.blocks import Mamba1, Mamba2


def test_mamba2_parameters_and_flops_nemotron_h_shape():
    """Nemotron-H 8B Mamba-2 mixer: h 4096, 128 heads x 64, state 128, 8 groups, conv 4."""
    m = Mamba2(hidden=4096, heads=128, head_dim=64, state_size=128, n_groups=8, conv_kernel=4)
    h, d_in = 4096, 128 * 64
    assert m.gemm_params() == h * (2 * d_in + 2 * 8 * 128 + 128) + d_in * h
    xbc = d_in + 2 * 8 * 128
    assert m.other_params() == 4 * xbc + xbc + 3 * 128 + d_in
    C = 64
    assert m.scan_flops() == 2 * 4 * xbc + 8 * 2 * (C / 2) * 128 + 128 * (2 * (C / 2) * 64 + 4 * 128 * 64)
    assert m.state_elems() == 128 * 64 * 128 + 3 * xbc
    assert m.stored() == {"qkv": xbc + xbc + d_in + 128 + d_in}     # conv in, x/B/C, z, dt; output


def test_mamba2_tp_splits_heads_and_groups():
    m = Mamba2(hidden=2048, heads=20, head_dim=64, state_size=128, n_groups=2)
    assert [r.problem(tp=2) for r in m.rules() if r.axis == "tp"] == [None, None]
    assert [r.problem(tp=4) for r in m.rules() if r.axis == "tp"] == [None, "n_groups (2) not divisible by tp (4)"]


@pytest.mark.parametrize("groups, tp, cp, ok", [(8, 8, 2, True), (8, 2, 2, True), (8, 2, 8, True), (8, 4, 4, True),
                                                (8, 2, 3, False), (2, 1, 4, True), (2, 1, 3, False)])
def test_mamba2_all_to_all_cp_group_rule(groups, tp, cp, ok):
    """Megatron-Core MambaContextParallel: n_groups/tp and cp divide one another (heads: 48 / tp % cp)."""
    m = Mamba2(hidden=2048, heads=48, head_dim=64, state_size=128, n_groups=groups)
    why = [w for r in m.rules() if r.axis in ("tp·cp", "cp") and (w := r.problem(tp=tp, cp=cp))]
    assert (why == []) == ok, why


def test_mamba1_parameters_flops_state_and_tp_by_hand():
    """Jamba-v0.1's Mamba-1 mixer: h 4096, d = 8192, N 16, R 256, conv 4, Δ/B/C norms (HF JambaMambaMixer)."""
    m = Mamba1(hidden=4096, inner_size=8192, state_size=16, dt_rank=256, conv_kernel=4, bc_norms=True)
    h, d, N, R = 4096, 8192, 16, 256
    in_proj, x_proj, dt_proj, out_proj = h * 2 * d, d * (R + 2 * N), R * d, d * h
    assert m.gemm_params() == in_proj + x_proj + dt_proj + out_proj
    conv, conv_b, dt_b, A_log, D, norms = 4 * d, d, d, d * N, d, R + 2 * N
    assert m.other_params() == conv + conv_b + dt_b + A_log + D + norms
    # per channel: 7 per state (Δ·A, exp, (Δx)·B, dA·h + ·, C·h accumulated) + Δ·x + D skip (2); conv 2·K
    assert m.scan_flops() == 2 * 4 * d + d * (7 * N + 3)
    assert m.state_elems() == d * N + 3 * d
    assert m.stored_io() == (d + d + d + d + R + 2 * N + R + 2 * N, d)   # conv in, u, z, Δ, Δ rank, B, C, norms
    assert m.gemms()[2].k == N                                           # the scan priced with K = N
    tp = [r for r in m.rules() if r.axis == "tp"]
    assert tp[0].problem(tp=8) is None and tp[0].problem(tp=3) == "inner_size (8192) not divisible by tp (3)"


def test_mamba2_scan_bytes_nemotron3_nano_by_kernel():
    """Nemotron 3 Nano's mixer (64 heads x 64, state 128, 8 groups, chunk 128): the kernel-by-kernel count of
    Mamba2.scan_bytes' docstring, with d = 4096, g = 1024, xbc = 6144, H = 64, S = 4096 (one 64 x 64 x 128 state per
    128 tokens), Q = 1024, in 2-byte units."""
    m = Mamba2(hidden=2688, heads=64, head_dim=64, state_size=128, n_groups=8, conv_kernel=4, chunk_size=128)
    d, g, xbc, H, S, Q = 4096, 1024, 6144, 64, 4096, 1024
    conv, cumsum, state, passing, bmm = 2 * xbc, 5 * H, g + d + 4 * H + 2 * S, 3 * S, 2 * g + 2 * Q
    scan, norm = 2 * Q + 4 * d + g + 4 * H + S, 2 * d
    fwd = conv + cumsum + state + passing + bmm + scan + norm
    assert m.scan_bytes()[0] == fwd == 74560                       # 149 KB per token
    rerun = conv + 2 * H + cumsum + bmm + state + passing
    grads = (6 * d + (g + 2 * H + d + S) + 4 * S + (3 * d + g + 6 * H + 2 * Q + S) + (d + 6 * H + S + 3 * g)
             + (S + 4 * H + d + 3 * g) + (2 * d + 4 * H + 2 * Q) + (8 * g + 4 * Q) + 6 * H + (2 * d + 6 * H + 2 * Q)
             + 7 * H)
    assert m.scan_bytes()[1] == 3 * d + rerun + grads + 3 * xbc == 200960
    # a chunk twice as long halves the chunk-state traffic (6S) and doubles the C·B^T traffic (4Q)
    longer = Mamba2(hidden=2688, heads=64, head_dim=64, state_size=128, n_groups=8, conv_kernel=4, chunk_size=256)
    assert m.scan_bytes()[0] - longer.scan_bytes()[0] == 6 * S / 2 - 4 * Q


def test_recurrent_mixers_count_their_norm_and_residual_like_attention():
    m = Mamba2(hidden=1024, heads=32, head_dim=64, state_size=128, n_groups=1, conv_kernel=4)
    mb = m.membound()
    assert mb["norm"] == (2 * 1024, 3 * 1024) and mb["residual"] == (3 * 1024, 3 * 1024)
    assert mb["ssm_scan"] == m.scan_bytes()
    m1 = Mamba1(hidden=1024, inner_size=2048, state_size=16, dt_rank=64, conv_kernel=4)
    assert "ssm_scan" not in m1.membound()                        # no kernel inventory: priced by its FLOPs alone
