"""What holds ``moe_layer_overhead_us`` where it is: the in-sample error of every published run against that one
constant, the others as the hardware files store them (README 'Accuracy', "Constants at a bound").

Prints (1) the mean |error| over all published runs on a grid of the constant, and the same with its time taken
(a) per local expert and (b) per routed token instead of per MoE layer and micro-batch, so the form of the
missing cost can be read off; (2) for every run the constant touches, its error at the stored value and at 0 and
the value that run alone would need (every other term unchanged). The figures are the cost model's own, against
the measured throughputs in data/published_runs.csv; nothing here is a measurement. About 10 s.

    python benchmarks/moe_overhead_profile.py
"""

from __future__ import annotations

import numpy as np

from autopar.cost.estimator import Estimator
from autopar.measure.validation import load_cases

GRID_US = (0, 1000, 2000, 2500, 2900, 3000, 3100, 3500, 4000, 5000, 6000)
REF_US = 1000.0          # the constant's step used to read each run's slope (step time is linear in it)


def _steps(case, value_us: float) -> float:
    est = Estimator(case.model, case.hardware, case.training, case.gpus)
    eff = case.hardware.efficiency.model_copy(update={"moe_layer_overhead_us": value_us})
    return est.with_hardware(case.hardware.model_copy(update={"efficiency": eff})).estimate(
        case.layout, resolved=True).step_time_s


def main() -> None:
    cases, _ = load_cases()
    ids, base, slope, meas, stored, weight_e, weight_t = [], [], [], [], [], [], []
    for c in cases:
        est = Estimator(c.model, c.hardware, c.training, c.gpus).estimate(c.layout, resolved=True)
        t0, t1 = _steps(c, 0.0), _steps(c, REF_US)
        ids.append(c.row_id)
        base.append(t0)
        slope.append((t1 - t0) / REF_US)
        meas.append(est.step_time_s * est.tokens_per_s_per_gpu / c.measured_tokens)   # measured step time
        stored.append(c.hardware.efficiency.moe_layer_overhead_us)
        moe = c.model.moe
        weight_e.append(moe.num_experts / c.layout.ep / 16.0 if moe else 0.0)      # local experts / 16
        tokens = c.layout.micro_batch * c.training.seq_len / (c.layout.cp * c.layout.tp)
        weight_t.append(tokens * moe.top_k * c.model.hidden_size / (2048 * 8 * 4096) if moe else 0.0)
    base, slope, meas = np.array(base), np.array(slope), np.array(meas)

    def mean_err(per_row_slope: np.ndarray, v: float) -> float:
        return 100.0 * float(np.mean(np.abs(meas / (base + per_row_slope * v) - 1.0)))

    print(f"mean |error| over {len(ids)} published runs against moe_layer_overhead_us (other constants as stored):")
    print("  value_us  per MoE layer  per local expert/16  per routed token (2,048 x top-8 x 4,096 = 1)")
    for v in GRID_US:
        print(f"  {v:8d}  {mean_err(slope, v):12.3f}%  {mean_err(slope * weight_e, v):18.3f}%"
              f"  {mean_err(slope * weight_t, v):12.3f}%")
    print("\nruns the constant touches: error at the stored value, at 0, and the value each alone would need")
    for i in np.argsort(ids):
        if slope[i] <= 1e-12:
            continue
        at = lambda v: 100.0 * (meas[i] / (base[i] + slope[i] * v) - 1.0)   # noqa: E731
        need = (meas[i] - base[i]) / slope[i]
        print(f"  {ids[i]:50s} {at(stored[i]):+6.1f}%  at 0: {at(0.0):+6.1f}%  needs {need:8.0f} us")


if __name__ == "__main__":
    main()
