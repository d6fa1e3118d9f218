"""Speed of the cost model: whole-process `autopar estimate` and library estimates per second on one core.

Targets (issue: foundation): the process in under 0.5 s; >= 20,000 estimates/s. Prints its figures.

The library figure repeats one layout on one Estimator (the target's definition), so the Estimator's per-stage memos
(autopar.cost.estimator: the vpp-free stage terms and the link loads; autopar.cost.memory: the activation elements
per token, the model states and the buffers; each kept per the layout fields it reads) serve every call after the
first. The "distinct layouts" figure prices each of 1,386 valid llama3_70b layouts once on a
fresh Estimator, as a search or a tuner meets them: the memos then serve only layouts that share those fields. Each
figure is per second of wall time and per second of the process's CPU time (on a busy machine the second leaves
out the waits for a core).
"""

import itertools
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
        n, t0, c0 = 5000, time.perf_counter(), time.process_time()
        for _ in range(n):
            est.estimate(L, resolved=True)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        print(f"library estimate, {name} {L.short()}: {n / dt:,.0f} layouts/s on one core, {n / dc:,.0f}/s of CPU "
              f"time (target >= 20,000)")
    distinct_layouts()


def distinct_layouts() -> None:
    """Each valid llama3_70b layout on 64 GPUs over TP, PP, VPP, CP, micro-batch, ZeRO stage and recompute, estimated
    once per pass on a fresh Estimator; the median of 5 passes."""
    model, hw = load_model("llama3_70b"), load_hardware("h100_sxm")
    tr = TrainingSpec(seq_len=4096, global_batch=1024)
    layouts, resolver = [], Estimator(model, hw, tr, 64)
    for tp, pp, vpp, cp, mb, z, rc in itertools.product((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 5), (1, 2), (1, 2),
                                                        (0, 1, 3), ("none", "selective", "full")):
        try:
            layouts.append(resolver.resolve(Layout(tp=tp, pp=pp, vpp=vpp, cp=cp, micro_batch=mb, zero_stage=z,
                                                   recompute=rc)))
        except ValueError:   # not valid for this model and GPU count (autopar's input errors are ValueErrors)
            continue
    rates, cpu = [], []
    for _ in range(5):
        t0, c0 = time.perf_counter(), time.process_time()
        est = Estimator(model, hw, tr, 64)
        for L in layouts:
            est.estimate(L, resolved=True)
        rates.append(len(layouts) / (time.perf_counter() - t0))
        cpu.append(len(layouts) / (time.process_time() - c0))
    print(f"library estimate, {len(layouts)} distinct llama3_70b layouts once each on a fresh Estimator: "
          f"{sorted(rates)[2]:,.0f} layouts/s on one core, {sorted(cpu)[2]:,.0f}/s of CPU time (medians of 5 passes)")


if __name__ == "__main__":
    main()
