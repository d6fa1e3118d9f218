"""Speed of the cost model: whole-process `autopar estimate` and library estimates per second on one core.

Targets (issue: foundation): the process in under 0.5 s; >= 20,000 estimates/s. Prints its figures.
"""

import subprocess
import sys
import time

from autopar.cost import Estimator
from autopar.specs import Layout, TrainingSpec
from autopar.specs.loaders import load_hardware, load_model

CMD = [sys.executable, "-m", "autopar.cli.main", "estimate", "--model", "llama3_70b", "--gpus", "64", "--tp", "4",
       "--pp", "4", "--json"]


def main() -> None:
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run(CMD, check=True, capture_output=True)
        runs.append(time.perf_counter() - t0)
    print(f"autopar estimate (whole process): median {sorted(runs)[2]:.3f} s over 5 runs (target < 0.5 s)")
    for name, gpus, lay in (("llama3_70b", 64, Layout(tp=4, pp=4, vpp=5, cp=2)),
                            ("deepseek_v3", 1024, Layout(tp=2, pp=16, ep=64, recompute="full"))):
        model = load_model(name)
        tr = TrainingSpec(seq_len=4096, global_batch=1024)
        est = Estimator(model, load_hardware("h100_sxm"), tr, gpus)
        L = est.resolve(lay.model_copy(update={"stage_layers": None}) if name == "llama3_70b" else
                        lay.model_copy(update={"stage_layers": (3,) + (4,) * 14 + (2,)}))
        n, t0 = 5000, time.perf_counter()
        for _ in range(n):
            est.estimate(L, resolved=True)
        dt = time.perf_counter() - t0
        print(f"library estimate, {name} {L.short()}: {n / dt:,.0f} layouts/s on one core (target >= 20,000)")


if __name__ == "__main__":
    main()
