"""GLA and Lightning (autopar/blocks/gla.py) against hand counts."""

from __future__ import annotations

from autopar.blocks import GLA, Lightning


def test_gla_parameters_and_flops():
    """FLA GatedLinearAttention, 16 heads x 128, low-rank 16 forget gate, output gate, h = 2048."""
    g = GLA(hidden=2048, heads=16, head_dim=128, gate_low_rank=16, output_gate=True)
    h = 2048
    q = k = v = gate = o = h * 2048                     # 16 heads x 128 = 2048 wide
    gk = h * 16 + 16 * 2048                             # low-rank forget gate
    assert g.gemm_params() == q + k + v + gate + o + gk
    assert g.other_params() == 2048 + 128               # gk bias, shared per-head norm
    assert g.params() == g.gemm_params() + g.other_params()
    # chunk 64: intra-chunk 2·32·(128+128), state output and update 4·128·128, per head
    assert g.scan_flops() == 16 * (2 * 32 * 256 + 4 * 128 * 128)
    assert g.state_elems() == 16 * 128 * 128
    assert g.attention_core_flops(4096) == 0 and g.kv_params() == 0 and g.has_state and not g.keeps_kv


def test_gla_kernels_widths_and_stored_activations():
    """Conv 4 on q, k, v; no output gate, full-rank forget gate (h·H·d_k)."""
    g = GLA(hidden=1024, heads=8, head_dim=64, conv_kernel=4)
    h, H, d = 1024, 8, 64
    conv = 3 * H * d                                    # q, k, v channels
    assert g.gemm_params() == 3 * h * H * d + h * H * d + H * d * h     # q, k, v, gk, o
    assert g.other_params() == 4 * conv + d                             # conv weights, norm (no gk bias)
    assert g.scan_flops() == 2 * 4 * conv + H * (2 * 32 * 2 * d + 4 * d * d)
    assert g.state_elems() == H * d * d + 3 * conv                      # + the last K − 1 = 3 conv inputs
    assert (g.out_width(), g.in_width()) == (H * d, 4 * H * d)          # q, k, v, gk in; scan output out
    assert g.a2a_elems() == 5 * H * d
    assert g.stored() == {"qkv": conv + 2 * H * d + H * d + H * d + H * d}   # the output with the inputs
    ins, outs, core = g.gemms()
    assert (ins.k, ins.n, ins.split) == (h, 4 * H * d, "col") and (outs.k, outs.n, outs.split) == (H * d, h, "row")
    assert (core.k, core.module) == (d, "ssm_scan") and 2 * core.k * core.n == g.scan_flops()
    assert g.fp8_cast_width() == h + 4 * H * d + H * d + h


def test_lightning_parameters_and_flops():
    li = Lightning(hidden=512, heads=8, head_dim=64, output_gate=True)
    assert li.gemm_params() == 5 * 512 * 512           # q, k, v, output gate, o
    assert li.other_params() == 8 * 64                 # output norm H·d
    assert li.scan_flops() == 8 * (2 * 32 * 128 + 4 * 64 * 64)
    assert li.stored() == {"qkv": 4 * 512 + 512}


def test_head_rules_split_heads_by_tp_and_by_tp_cp():
    g = GLA(hidden=1024, heads=12, head_dim=64)
    assert [r.problem(tp=4) for r in g.rules() if r.axis == "tp"] == [None]
    assert [r.problem(tp=8) for r in g.rules() if r.axis == "tp"] == ["num_heads (12) not divisible by tp (8)"]
    cp = [r.problem(tp=2, cp=4) for r in g.rules() if r.axis == "tp·cp"]
    assert cp == ["num_heads (12) not divisible by tp·cp = 2·4 (all-to-all context parallel splits heads)"]
