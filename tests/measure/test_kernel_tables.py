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
