"""The GEMM shape curve of the Blackwell hardware files, fitted to OpenXLA's measured matmul table.

Reads data/gemm_tables/xla_matmul_sm100_sm90.csv (OpenXLA's ``kDefaultMatmulPTable``; provenance in data/README.md)
and fits, per arch and dtype, the cost model's separable curve (:meth:`autopar.specs.hardware.KernelModel.gemm_shape`)

    eff(M, N, K) = g · M/(M + half_m) · N/(N + half_m) · K/(K + half_nk)       eff = FLOP/s / datasheet dense peak

by least squares on log eff (``scipy.optimize.least_squares``). Nothing is timed here: it reads a file and prints
figures.

What the table's coordinates are: XLA's generator (xla/tools/matmul_perf_table_gen.cc) times one batched dot
``lhs[b,m,k] x rhs[b,k,n]``: b independent GEMMs in one kernel, whose output tiles are b·m rows by n columns, so
M = b·m (tokens), N = n, K = k (reduction); FLOPs = 2·b·m·n·k.

Which points: the table's smallest shapes all take the same ~5 us (256^3 and 256 x 512 x 256 alike, on both chips),
a per-kernel floor (launch, prologue, epilogue) that a saturating per-dimension curve cannot describe. Only points
taking at least a multiple of that floor (the table's fastest entry) are fitted: 5x for the K series (the floor is
then at most 1/5 of each point's time), 10x for the whole curve (CUT). Training GEMMs (M = micro-batch tokens in
the thousands, N and K from 512 up under TP) take 50 us and more on these chips.

Two readings per arch and dtype:
  * the K series (what the hardware files take): at each fixed large output (M >= 4096, N >= 1024, so the M and N
    factors are constants of the slice), K/(K + half_nk) fitted to the slice's K = 256..4096 points, as the Hopper
    files read DeepGEMM's K series at M = 4096. ``derive`` returns the median half_nk over the slices; the
    Blackwell files hold one half_nk for every precision, so theirs is the median over the sm_100 BF16 and FP8
    slices together (tests/specs/test_gemm_shape_table.py checks hardware/b200.yaml against it);
  * the whole separable curve: g, half_m, half_nk fitted to every point above the cut (free), and with half_m held
    at the chip's own measured M curve (170 on both: vLLM torch.mm M sweeps, cited in hardware/b200.yaml and
    h100_sxm.yaml; the table's grid starts at M = 256, where the floor dominates, so it cannot see M's curve below
    that). It fits to ~5% rms but is not separable in fact: the K series' half_nk grows as N shrinks (fewer output
    tiles to hide each tile's K loop behind), which one product of three factors cannot express.

    python benchmarks/gemm_shape_fit.py
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from autopar.specs.hardware import KernelModel
from autopar.specs.loaders import load_hardware

TABLE = Path(__file__).resolve().parent.parent / "data" / "gemm_tables" / "xla_matmul_sm100_sm90.csv"
# arch -> (hardware file whose datasheet peaks the table is read against, its gemm_half_m)
ARCHS = {"sm_100": "b200", "sm_90": "h100_sxm"}
DTYPES = {"bf16xbf16->bf16": "bf16", "f8e4m3fnxf8e4m3fn->bf16": "fp8"}
CUT = 10.0          # whole-curve fit: keep points taking at least CUT x the table's per-kernel floor
K_CUT = 5.0         # K series: the same, 5x (a slice's K points are few; the floor is then <= 20% of each)
SLICE_M, SLICE_N = 4096, 1024   # K series: slices with M >= 4096 and N >= 1024


def load_table(path: Path = TABLE) -> list[dict[str, str]]:
    """The CSV rows (arch, b, m, n, k, dtype, flops)."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def points(rows: list[dict[str, str]], arch: str, dtype: str) -> dict[str, np.ndarray]:
    """M = b·m, N, K, time (us) and eff (of the datasheet dense peak of ARCHS[arch]) for one arch and dtype."""
    sel = [r for r in rows if r["arch"] == arch and r["dtype"] == dtype]
    b, m, n, k, flops = (np.array([float(r[c]) for r in sel]) for c in ("b", "m", "n", "k", "flops"))
    peak = load_hardware(ARCHS[arch]).peak_tflops(DTYPES[dtype]) * 1e12
    big_m = b * m
    return {"M": big_m, "N": n, "K": k, "t_us": 2 * big_m * n * k / flops * 1e6, "eff": flops / peak}


def fit(p: dict[str, np.ndarray], cut: float = CUT, half_m: float | None = None) -> dict[str, float | np.ndarray]:
    """Least squares on log eff over the points taking >= cut x the floor; half_m fixed when given."""
    keep = p["t_us"] >= cut * p["t_us"].min()
    big_m, n, k, eff = p["M"][keep], p["N"][keep], p["K"][keep], p["eff"][keep]

    def curve(x: np.ndarray) -> np.ndarray:
        g, hm, hk = (x[0], half_m, x[1]) if half_m is not None else x
        return g * KernelModel.gemm_shape(big_m, n, k, hm, hk)

    start, lo, hi = ([0.7, 500.0], [1e-3, 1.0], [1.0, 65536.0]) if half_m is not None else \
        ([0.7, 200.0, 500.0], [1e-3, 1.0, 1.0], [1.0, 65536.0, 65536.0])
    res = least_squares(lambda x: np.log(curve(x)) - np.log(eff), start, bounds=(lo, hi))
    g, hm, hk = (res.x[0], half_m, res.x[1]) if half_m is not None else res.x
    return {"g": float(g), "half_m": float(hm), "half_nk": float(hk), "n": int(keep.sum()),
            "rms": float(np.sqrt(np.mean(res.fun ** 2))), "max": float(np.abs(res.fun).max()), "resid": res.fun,
            "keep": keep, "floor_us": float(p["t_us"].min())}


def k_series(p: dict[str, np.ndarray], cut: float = K_CUT) -> list[tuple[int, int, int, float]]:
    """(M, N, points, half_nk) per large output slice: g · K/(K + half_nk) fitted on log eff to the slice's points
    taking >= cut x the floor (slices with fewer than 3 distinct K left out)."""
    out = []
    keep = p["t_us"] >= cut * p["t_us"].min()
    for big_m in sorted(set(p["M"])):
        for n in sorted(set(p["N"])):
            sel = keep & (p["M"] == big_m) & (p["N"] == n)
            if big_m < SLICE_M or n < SLICE_N or len(set(p["K"][sel])) < 3:
                continue
            k, eff = p["K"][sel], p["eff"][sel]
            res = least_squares(lambda x: np.log(x[0] * k / (k + x[1])) - np.log(eff), [0.7, 300.0],
                                bounds=([1e-3, 1.0], [2.0, 65536.0]))
            out.append((int(big_m), int(n), int(sel.sum()), float(res.x[1])))
    return out


def derive(arch: str = "sm_100", dtypes: tuple[str, ...] = tuple(DTYPES)) -> float:
    """The hardware files' half_nk: the median K-series half_nk over the arch's slices of the given dtypes."""
    rows = load_table()
    return float(np.median([s[3] for d in dtypes for s in k_series(points(rows, arch, d))]))


def main() -> None:
    rows = load_table()
    print(f"{TABLE.name}: {len(rows)} rows; curve g · M/(M+half_m) · N/(N+half_m) · K/(K+half_nk), M = b·m")
    for arch, hw in ARCHS.items():
        km = load_hardware(hw).kernel_model
        for dtype in DTYPES:
            p = points(rows, arch, dtype)
            if not len(p["M"]):
                continue
            print(f"\n{arch} {dtype} ({len(p['M'])} points, against {hw}'s peak; best measured eff "
                  f"{p['eff'].max():.3f}; per-kernel floor {p['t_us'].min():.2f} us; {hw}.yaml has half_m "
                  f"{km.gemm_half_m:g}, half_nk {km.gemm_half_nk:g})")
            ks = k_series(p)
            print(f"  K series (t >= {K_CUT:g} x floor): half_nk median {np.median([x[3] for x in ks]):.0f} over "
                  f"{len(ks)} slices: " + ", ".join(f"M {m} N {n}: {h:.0f} ({c} pts)" for m, n, c, h in ks))
            for cut in (5.0, CUT, 20.0):
                free = fit(p, cut)
                fixed = fit(p, cut, half_m=km.gemm_half_m)
                print(f"  t >= {cut:4.0f} x floor: {free['n']:3d} points  free: g {free['g']:.3f} half_m "
                      f"{free['half_m']:5.0f} half_nk {free['half_nk']:5.0f} (rms {free['rms']:.1%}, max "
                      f"{free['max']:.1%})   half_m {km.gemm_half_m:g} fixed: g {fixed['g']:.3f} half_nk "
                      f"{fixed['half_nk']:5.0f} (rms {fixed['rms']:.1%}, max {fixed['max']:.1%})")
            all_pts = fit(p, 0.0, half_m=km.gemm_half_m)
            print(f"  every point (no cut): half_m {km.gemm_half_m:g} fixed: g {all_pts['g']:.3f} half_nk "
                  f"{all_pts['half_nk']:.0f}, rms {all_pts['rms']:.1%}, max {all_pts['max']:.1%} (the floor, not "
                  f"the shape, sets the small shapes)")
            best = fit(p, CUT, half_m=km.gemm_half_m)
            keep = best["keep"]
            order = np.argsort(p["t_us"][keep])
            print(f"  residuals at t >= {CUT:g} x floor, half_m fixed (model/measured - 1):")
            for i in order:
                big_m, n, k = (int(p[c][keep][i]) for c in ("M", "N", "K"))
                print(f"    M {big_m:6d} N {n:5d} K {k:5d}  {p['t_us'][keep][i]:7.1f} us  eff {p['eff'][keep][i]:.3f}"
                      f"  {np.exp(best['resid'][i]) - 1:+.1%}")


def summary() -> None:
    """What the files take: one half_nk per arch over its BF16 and FP8 K series."""
    for arch, hw in ARCHS.items():
        dts = tuple(d for d in DTYPES if points(load_table(), arch, d)["M"].size)
        print(f"{arch}: K-series half_nk, median over {' and '.join(DTYPES[d] for d in dts)} slices: "
              f"{derive(arch, dts):.0f} ({hw}.yaml: {load_hardware(hw).kernel_model.gemm_half_nk:g})")


if __name__ == "__main__":
    main()
    print()
    summary()
