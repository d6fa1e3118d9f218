"""The kernel-class tables of `autopar profile hardware` (hardware file `kernels:` section): what is timed, the
FLOP convention, tiny real measurements on the CPU that round-trip through HardwareSpec, and the schema's
validation. No timing assertions: only that every measured rate is a positive number in the right place."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from autopar.measure.kernel_tables import attention_flops, measure_kernel_tables, plan_for
from autopar.specs.hardware import HardwareSpec, KernelTables
from autopar.specs.loaders import dump_spec, load_hardware
from autopar.specs.model import ModelSpec

torch = pytest.importorskip("torch")

MOE = ModelSpec(name="tiny_moe", num_layers=2, hidden_size=128, ffn_hidden_size=256, num_attention_heads=4,
                num_kv_heads=2, vocab_size=512, moe={"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 64})


def test_attention_flops_follow_flashattention():
    # forward 4·s²·d per head and sequence; causal half; backward 2.5x (FlashAttention-2 benchmark convention)
    fwd, bwd = attention_flops(2, 16, 4096, 128, 0)
    assert fwd == 4 * 2 * 16 * 4096 ** 2 * 128 and bwd == 2.5 * fwd
    assert attention_flops(2, 16, 4096, 128, 1)[0] == fwd / 2


def test_the_gpu_plan_covers_the_model_and_the_sweeps():
    llama = ModelSpec(name="l", num_layers=2, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                      num_kv_heads=8, vocab_size=128256)
    plan = plan_for(llama, 4096, tiny=False)
    assert (4096, 6144, 4096) in plan.gemm          # QKV: (32 + 2·8)·128 columns
    assert (4096, 2 * 14336, 4096) in plan.gemm     # gated MLP up
    assert (4096, 4096, 14336) in plan.gemm         # MLP down
    assert min(m for m, _, _ in plan.gemm) <= 64 and min(n for _, n, _ in plan.gemm) <= 128   # small M and N
    seqs = {s for _, _, s, _, _ in plan.attention}
    assert min(seqs) == 1024 and max(seqs) == 32768
    assert {d for _, _, _, d, _ in plan.attention} == {64, 128, 192}
    assert {c for *_, c in plan.attention} == {0, 1}
    for b, h, s, d, _ in plan.attention:            # FlashAttention-3 paper setting: 16K tokens, hidden 2048
        assert b * s == max(16384, s) and h == 2048 // d
    assert plan.ce_shape == (4096, 128256)
    moe = plan_for(MOE, 1024, tiny=False)
    assert {(n, k) for _, n, k, _ in moe.grouped} == {(2 * 64, 128), (128, 64)}   # expert up (gated), down
    assert len({t for t, *_ in moe.grouped}) >= 4


def test_tiny_cpu_tables_are_positive_and_round_trip(tmp_path):
    tables = measure_kernel_tables(MOE, 64, device="cpu", threads=1)
    assert "CPU" in tables.provenance and "torch" in tables.provenance and "measured 20" in tables.provenance
    assert tables.gemm["bf16"] and all(len(r) == 4 and r[3] > 0 for r in tables.gemm["bf16"])
    assert tables.grouped_gemm["bf16"] and all(r[-1] > 0 for r in tables.grouped_gemm["bf16"])
    att = tables.attention["bf16"]
    assert {r[2] for r in att} == {0, 1} and all(r[3] > 0 and r[4] > 0 for r in att)
    assert set(tables.memory_bound_gbps) == {"copy", "rmsnorm", "swiglu", "cross_entropy"}
    assert all(v > 0 for v in tables.memory_bound_gbps.values())
    assert tables.host_copy_gbps == {}              # no device, no host-device copy
    hw = load_hardware("h100_sxm").model_copy(update={"kernels": tables})
    path = tmp_path / "hw.yaml"
    dump_spec(HardwareSpec.model_validate(hw.model_dump()), path)
    assert load_hardware(path).kernels == tables


def test_schema_rejects_bad_tables():
    ok = {"provenance": "H100 SXM, measured 2026-01-01 on x"}
    KernelTables(**ok, gemm={"bf16": [[4096, 4096, 4096, 760.0]]}, host_copy_gbps={"h2d": 55.0, "d2h": 55.0},
                 attention={"bf16": [[4096, 128, 0, 500.0, 420.0]]})
    for bad in ({"gemm": {"bf16": [[4096, 4096, 0, 760.0]]}},
                {"gemm": {"fp32": [[1, 1, 1, 1.0]]}},               # not a training precision
                {"grouped_gemm": {"bf16": [[64, 4096, 1536, 8, -1.0]]}},
                {"attention": {"bf16": [[4096, 128, 2, 500.0, 420.0]]}},
                {"attention": {"bf16": [[4096, 128, 1, 500.0]]}},   # backward missing
                {"memory_bound_gbps": {"layernorm": 100.0}},
                {"host_copy_gbps": {"h2d": 0.0}}):
        with pytest.raises(ValidationError):
            KernelTables(**ok, **bad)
    with pytest.raises(ValidationError):
        KernelTables(provenance="", gemm={})
    with pytest.raises(ValidationError):
        KernelTables(**ok, gemms={})                                 # a typo is an error (extra="forbid")


@pytest.mark.parametrize("bwd192", [0.9, 1.05])
def test_kernel_model_is_fitted_back_from_tables_it_generated(bwd192):
    """Tables made from known curves on h100_sxm's datasheet peaks: the fit must find the curves again (the
    backward's head-dim table apart from the forward's only where they differ)."""
    from autopar.measure.kernel_tables import kernel_model_from_tables
    hw = load_hardware("h100_sxm")
    km = hw.kernel_model.model_copy(update={"gemm": {**hw.kernel_model.gemm, "bf16": 0.78, "fp8": 0.66},
                                            "gemm_half_m": 150.0, "gemm_half_nk": 420.0, "grouped_gemm": 0.5,
                                            "attention_fwd": 0.62, "attention_bwd": 0.5, "attention_half_seq": 700.0,
                                            "attention_head_dim": {64: 0.75, 128: 1.0, 192: 1.05},
                                            "attention_head_dim_bwd": {64: 0.75, 128: 1.0, 192: bwd192}})
    p16, p8 = hw.peak_tflops("bf16"), hw.peak_tflops("fp8")

    def eff(m, n, k, top, grouped=False):
        # the output dimensions M and N on one curve; grouped ratios against the reference with N on K's half-point
        return top * m / (m + 150.0) * n / (n + (420.0 if grouped else 150.0)) * k / (k + 420.0)

    plan = plan_for(ModelSpec(name="l", num_layers=2, hidden_size=4096, ffn_hidden_size=14336,
                              num_attention_heads=32, num_kv_heads=8, vocab_size=128256), 4096, tiny=False)
    tables = KernelTables(
        provenance="planted",
        gemm={"bf16": [[m, n, k, p16 * eff(m, n, k, 0.78)] for m, n, k in plan.gemm],
              "fp8": [[m, n, k, p8 * eff(m, n, k, 0.66)] for m, n, k in plan.gemm]},
        grouped_gemm={"bf16": [[t, n, k, e, 0.5 * p16 * eff(t, n, k, 0.78, grouped=True)] for t, n, k, e in plan.grouped]},
        attention={"bf16": [[s, d, c, p16 * 0.62 * s / (s + 700.0) * km.head_dim_factor(d),
                             p16 * 0.5 * s / (s + 700.0) * km.head_dim_factor(d, backward=True)]
                            for _, _, s, d, c in plan.attention]},
        memory_bound_gbps={"copy": 0.85 * hw.hbm_tbps * 1e3})
    got = kernel_model_from_tables(tables, hw)
    assert got.gemm["bf16"] == pytest.approx(0.78, rel=1e-2) and got.gemm["fp8"] == pytest.approx(0.66, rel=1e-2)
    assert got.gemm_half_m == pytest.approx(150.0, rel=2e-2) and got.gemm_half_nk == pytest.approx(420.0, rel=2e-2)
    assert got.grouped_gemm == pytest.approx(0.5, rel=1e-2)
    assert got.attention_fwd == pytest.approx(0.62, rel=1e-2) and got.attention_bwd == pytest.approx(0.5, rel=1e-2)
    assert got.attention_half_seq == pytest.approx(700.0, rel=2e-2)
    assert got.attention_head_dim[64] == pytest.approx(0.75, rel=1e-2)
    # the backward's head-dim factors are fitted apart from the forward's (MLA's backward measures below it)
    assert got.attention_head_dim[192] == pytest.approx(1.05, rel=1e-2)
    if bwd192 == 1.05:      # the same factors: no second table
        assert got.attention_head_dim_bwd is None
    else:
        assert got.attention_head_dim_bwd[192] == pytest.approx(0.9, rel=1e-2)
        assert got.attention_head_dim_bwd[64] == pytest.approx(0.75, rel=1e-2)
    assert got.hbm == pytest.approx(0.85, rel=1e-3)
    assert "planted" in got.source and got.nvlink == hw.kernel_model.nvlink


def test_a_measured_grouped_gemm_updates_the_bf16_entry_and_keeps_the_others():
    """A base file with per-precision grouped-GEMM figures (the Blackwell files): the BF16 benchmark replaces only
    the bf16 entry."""
    from autopar.measure.kernel_tables import kernel_model_from_tables
    from autopar.specs.hardware import KernelTables
    from autopar.specs.loaders import load_hardware
    b200 = load_hardware("b200")
    assert isinstance(b200.kernel_model.grouped_gemm, dict)
    p16 = b200.peak_tflops("bf16")
    km = b200.kernel_model

    def dense(t, n, k, grouped=False):
        # grouped figures are ratios against the reference curve with N on K's half-point (KernelModel.gemm_shape)
        return km.gemm["bf16"] * km.gemm_shape(t, n, k, km.gemm_half_m, km.gemm_half_nk,
                                               km.gemm_half_nk if grouped else None)
    gemm = [[m, n, k, p16 * dense(m, n, k)] for m in (256, 1024, 4096, 16384) for n, k in ((4096, 4096), (1024, 8192))]
    grouped = [[t, 1536, 4096, 8, 0.5 * p16 * dense(t, 1536, 4096, grouped=True)] for t in (512, 2048, 8192)]
    tables = KernelTables(provenance="planted", gemm={"bf16": gemm}, grouped_gemm={"bf16": grouped})
    got = kernel_model_from_tables(tables, b200)
    assert got.grouped_gemm["bf16"] == pytest.approx(0.5, rel=0.05)
    assert got.grouped_gemm["mxfp8"] == km.grouped_gemm["mxfp8"]
