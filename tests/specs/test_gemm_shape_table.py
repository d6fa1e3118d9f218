"""data/gemm_tables/xla_matmul_sm100_sm90.csv (OpenXLA's measured matmul table) and the Blackwell hardware files'
``gemm_half_nk`` that benchmarks/gemm_shape_fit.py derives from it: the table is whole and transcribed as XLA
computed it, and the files hold what the script derives, so the two cannot drift apart silently."""

from __future__ import annotations

import importlib.util
from fractions import Fraction
from pathlib import Path

import pytest

from autopar.specs.loaders import load_hardware

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gemm_shape_fit", ROOT / "benchmarks" / "gemm_shape_fit.py")
fit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fit)

GRID = (256, 512, 1024, 2048, 4096)
TOLERANCE = 0.05    # a hardware file's half_nk within 5% of the script's derivation (the file rounds to 2-3 digits)


def test_the_table_is_whole():
    rows = fit.load_table()
    assert len(rows) == 1125
    for arch, dtype in (("sm_100", "bf16xbf16->bf16"), ("sm_100", "f8e4m3fnxf8e4m3fn->bf16"),
                        ("sm_90", "bf16xbf16->bf16")):
        shapes = {(int(r["b"]), int(r["m"]), int(r["n"]), int(r["k"])) for r in rows
                  if r["arch"] == arch and r["dtype"] == dtype}
        assert shapes == {(b, m, n, k) for b in (1, 2, 4) for m in GRID for n in GRID for k in GRID}, (arch, dtype)


def test_every_value_is_xla_arithmetic_on_a_whole_nanosecond():
    """XLA stores 2·b·m·n·k / (median kernel time in ns) · 1e9: a mistyped digit leaves no whole-ns t within 1."""
    bad = []
    for r in fit.load_table():
        flops = 2 * int(r["b"]) * int(r["m"]) * int(r["n"]) * int(r["k"]) * 10**9
        v = int(r["flops"])
        t = round(flops / v)
        if not any(abs(Fraction(flops, tt) - v) < 1 for tt in (t - 1, t, t + 1)):
            bad.append(r)
    assert bad == []


def test_points_read_b_times_m_as_the_token_dimension():
    p = fit.points(fit.load_table(), "sm_100", "bf16xbf16->bf16")
    assert p["M"].max() == 4 * 4096 and p["M"].min() == 256
    # the fastest entry is the per-kernel floor the fits cut on: ~5 us on this table
    assert 4.0 < p["t_us"].min() < 6.0


def test_blackwell_files_hold_the_half_nk_the_script_derives():
    derived = fit.derive("sm_100")
    b200 = load_hardware("b200").kernel_model.gemm_half_nk
    assert b200 == pytest.approx(derived, rel=TOLERANCE)
    # GB200 shares the sm_100 SM; B300 and GB300 (sm_103, not in the table) take B200's figure as ASSUMED
    for name in ("gb200_nvl72", "b300", "gb300_nvl72"):
        assert load_hardware(name).kernel_model.gemm_half_nk == b200, name


def test_the_k_series_reads_each_slice_on_k_alone():
    """Every slice is one (M, N) with >= 3 distinct K; Blackwell's K saturates later than Hopper's in one harness."""
    rows = fit.load_table()
    for arch in ("sm_100", "sm_90"):
        slices = fit.k_series(fit.points(rows, arch, "bf16xbf16->bf16"))
        assert slices and all(m >= fit.SLICE_M and n >= fit.SLICE_N and c >= 3 for m, n, c, _ in slices)
    assert fit.derive("sm_100", ("bf16xbf16->bf16",)) > fit.derive("sm_90", ("bf16xbf16->bf16",))
