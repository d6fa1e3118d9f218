"""Where does FSDP (ZeRO-3) win, and does its traffic hide there? Issue 20's check, on a fixed sample of zoo cases.

For each (model, GPUs) the solver's best layout on h100_sxm (default training: seq 4096, the default global batch)
is printed with its ZeRO stage and its exposed DP/FSDP seconds as a share of the step. Run it against any checkout
(``PYTHONPATH=/path/to/other/checkout python benchmarks/fsdp_wins.py``) to compare two cost models: the figures
are the model's own predictions, not measurements.
"""

from __future__ import annotations

import autopar
from autopar.defaults import default_global_batch
from autopar.specs.loaders import load_model

CASES = [("llama3_8b", 64), ("llama3_8b", 512), ("llama3_70b", 256), ("llama3_70b", 2048), ("llama3_405b", 1024),
         ("llama3_405b", 8192), ("gpt3_175b", 1024), ("mixtral_8x7b", 128), ("qwen3_30b_a3b", 64),
         ("qwen3_235b_a22b", 512), ("deepseek_v3", 256), ("nemotron4_340b", 2048)]


def main() -> None:
    wins = 0
    for name, gpus in CASES:
        gb, _ = default_global_batch(load_model(name), 4096)
        tr = autopar.TrainingSpec(seq_len=4096, global_batch=gb)
        res = autopar.solve(name, "h100_sxm", tr, gpus=gpus)
        if not res.plans:
            print(f"{name:18s} {gpus:5d}  nothing fits")
            continue
        e = res.plans[0].estimate
        fsdp = e.layout.zero_stage == 3
        wins += fsdp
        print(f"{name:18s} {gpus:5d}  {e.layout.short():48s} {'FSDP' if fsdp else f'Z{e.layout.zero_stage}':4s} "
              f"exposed dp {e.time_s.dp:7.3f} s = {e.time_s.dp / e.step_time_s:5.1%} of {e.step_time_s:.3f} s")
    print(f"FSDP wins {wins} of {len(CASES)} cases")


if __name__ == "__main__":
    main()
