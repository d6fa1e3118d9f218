"""The cost model's GEMM prices against the published long-run GEMM tables kept in the hardware files.

Every zoo hardware file with a ``kernels: gemm:`` table (published cuBLASLt runs after 10,000 warm-up iterations,
so the clock has settled under the power limit; provenance in the file) is priced shape by shape with
:class:`autopar.cost.kernels.Kernels` (kernel_model curve times ``sustained_gemm``), and the ratio model/measured
is printed. Nothing is timed here: it reads files and prints figures. README 'How the step time is priced' quotes
this output; tests/cost/test_kernels.py guards the same bounds.

    python benchmarks/kernel_curves_vs_published.py
"""

from autopar.cost.kernels import Kernels
from autopar.specs.loaders import load_hardware, zoo_names
from autopar.specs.training import TrainingSpec


def main() -> None:
    for name in sorted(zoo_names("hardware")):
        hw = load_hardware(name)
        if hw.kernels is None or not hw.kernels.gemm:
            continue
        print(f"{name}: {hw.kernels.provenance}")
        print(f"  sustained_gemm {hw.kernel_model.sustained_gemm}")
        for prec, rows in hw.kernels.gemm.items():
            k = Kernels(hw, TrainingSpec(seq_len=4096, global_batch=64, precision=prec))
            for m, n, kk, measured in rows:
                fwd, _ = k.gemm(m, n, kk, n * kk, 1, 1)
                model = 2 * m * n * kk / fwd / 1e12
                print(f"  {prec:5s} {m:>7d} x {n:>6d} x {kk:>6d}: measured {measured:7.1f}  model {model:7.1f} "
                      f"TFLOP/s  model/measured {model / measured:4.2f}")


if __name__ == "__main__":
    main()
