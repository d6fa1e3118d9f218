"""Measured against predicted on one GPU: slices of real models through `autopar profile run`, next to
`autopar estimate`'s prediction for the same slice, layout and batch.

    python benchmarks/gpu_check.py                    # on a CUDA machine (about 10-15 minutes on one H100)
    python benchmarks/gpu_check.py --cpu-smoke        # a tiny variant on the CPU (gloo), to check the script

Cases (one GPU, so dp = tp = pp = 1; global batch = micro-batch x GA 8, as the issue's MoE measurement):
dense llama3_8b (4 layers) and llama3_70b (2 layers) at 4K and 8K tokens per sequence, micro-batch 1 and 2,
recompute none and full; MoE qwen3_30b_a3b (4 layers, 128 experts, top-8) at 4K tokens, micro-batch 1.
The runner uses Megatron-LM's memory scheme (bf16 weights and grads, fp32 main weights and Adam moments), the
same bytes per parameter as the estimate's default training spec.

Printed per case: step time predicted / measured and their ratio; memory predicted (weights, grads, optimizer,
activations; total without the framework reserve) / measured (the same terms read from the rank's tensors,
the forward/backward peak above the step's start, and torch.cuda.max_memory_allocated); the loss of the
first and last steps and whether it falls. A failed run prints its reason (e.g. "oom", which the estimate's
memory column should then explain). Writes every record to --out as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autopar.cost import estimate  # noqa: E402
from autopar.run import scale_model  # noqa: E402
from autopar.specs import Layout, TrainingSpec  # noqa: E402
from autopar.specs.loaders import load_model  # noqa: E402

GA = 8
GPU_CASES = (
    [dict(model="llama3_8b", scale=dict(layers=4), seq=s, mbs=m, recompute=r)
     for s in (4096, 8192) for m in (1, 2) for r in ("none", "full")]
    + [dict(model="llama3_70b", scale=dict(layers=2), seq=s, mbs=m, recompute=r)
       for s in (4096, 8192) for m in (1, 2) for r in ("none", "full")]
    + [dict(model="qwen3_30b_a3b", scale=dict(layers=4), seq=4096, mbs=1, recompute="none")])
SMOKE = dict(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=512)
CPU_CASES = [dict(model="llama3_8b", scale=SMOKE, seq=64, mbs=1, recompute="none"),
             dict(model="llama3_8b", scale=SMOKE, seq=64, mbs=2, recompute="full"),
             dict(model="qwen3_30b_a3b", scale=dict(SMOKE, experts=8), seq=64, mbs=1, recompute="none")]


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def label(case: dict) -> str:
    return (f"{case['model']}[{case['scale'].get('layers', 'all')}L] s={case['seq']} mbs={case['mbs']} "
            f"rc={case['recompute']}")


def run_case(case: dict, hardware: str, steps: int, warmup: int, backend: str, timeout_s: float) -> dict:
    model = scale_model(load_model(case["model"]), **case["scale"])
    # The runner's loss is plain torch cross entropy on fp32-upcast logits: the estimate's "unfused" kernel.
    training = TrainingSpec(seq_len=case["seq"], global_batch=case["mbs"] * GA, cross_entropy="unfused")
    layout = Layout(micro_batch=case["mbs"], recompute=case["recompute"])
    est = estimate(model, hardware, training, layout, 1)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in case["scale"].items()]
    cmd = [sys.executable, "-m", "autopar.cli.main", "profile", "run", "--model", case["model"], "--gpus", "1",
           *flags, f"--seq-len={case['seq']}", f"--global-batch={training.global_batch}", f"--mbs={case['mbs']}",
           f"--recompute={case['recompute']}", f"--steps={steps}", f"--warmup={warmup}",
           f"--backend={backend}", f"--timeout={timeout_s}", "--json"]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"]
                                                  if os.environ.get("PYTHONPATH") else ""))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    try:
        run = json.loads(proc.stdout)
    except ValueError:
        run = {"ok": False, "failure": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    mem = est.memory_gib
    return {"case": case, "label": label(case),
            "estimate": {"step_time_s": est.step_time_s, "weights": mem.weights, "grads": mem.grads,
                         "optimizer": mem.optimizer, "activations": mem.activations,
                         "total_without_reserve": mem.total - mem.reserve, "fits": est.fits},
            "run": run}


def _fmt(x, spec=".3g") -> str:
    return "-" if x is None else format(x, spec)


def report(rec: dict) -> list[str]:
    e, r = rec["estimate"], rec["run"]
    lines = [rec["label"]]
    if not r.get("ok"):
        lines.append(f"  run failed: {r.get('failure')}   (predicted {e['total_without_reserve']:.1f} GiB, "
                     f"fits={e['fits']}; predicted step {e['step_time_s']:.3f} s)")
        return lines
    t = r["step_time_s"]
    lines.append(f"  step s     predicted {_fmt(e['step_time_s'])}   measured {_fmt(t)}   measured/predicted "
                 f"{t / e['step_time_s']:.2f}")
    terms = r.get("memory_terms_gib") or [{}]
    m = terms[0]
    lines.append(f"  memory GiB predicted: weights {_fmt(e['weights'])} grads {_fmt(e['grads'])} "
                 f"optimizer {_fmt(e['optimizer'])} activations {_fmt(e['activations'])} "
                 f"total {_fmt(e['total_without_reserve'])} (no reserve)")
    lines.append(f"             measured:  weights {_fmt(m.get('weights'))} grads {_fmt(m.get('grads'))} "
                 f"optimizer {_fmt(m.get('optimizer'))} fwd/bwd peak {_fmt(m.get('fwd_bwd_peak'))} "
                 f"peak {_fmt(max(r['peak_mem_gib']))} ({r['applied'].get('memory', '')})")
    losses = r["losses"]
    k = max(1, len(losses) // 3)
    falling = sum(losses[-k:]) / k < sum(losses[:k]) / k
    lines.append(f"  loss       {losses[0]:.3f} -> {losses[-1]:.3f}  ({'falling' if falling else 'NOT falling'}; "
                 f"{r['applied'].get('lr', '')})")
    lines.append(f"  scheme     {r['applied'].get('memory_scheme', '')}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu-smoke", action="store_true", help="tiny slices on the CPU (gloo): checks the script only")
    p.add_argument("--hardware", default="h100_sxm", help="hardware spec for the estimate (default: h100_sxm)")
    p.add_argument("--steps", type=int, default=None, help="steps per run (default: 12 on GPU, 6 on CPU)")
    p.add_argument("--only", default=None, help="run only the cases whose label contains this text")
    p.add_argument("--out", default="gpu_check.json", help="JSON records (default: gpu_check.json)")
    args = p.parse_args(argv)
    cuda = _cuda_available()
    if not cuda and not args.cpu_smoke:
        print("gpu_check: error: no CUDA device; this check needs a GPU (run with --cpu-smoke for a tiny CPU "
              "variant that only checks the script)", file=sys.stderr)
        return 2
    cases = CPU_CASES if args.cpu_smoke else GPU_CASES
    steps = args.steps or (6 if args.cpu_smoke else 12)
    backend = "gloo" if args.cpu_smoke else "nccl"
    records = []
    for case in cases:
        if args.only and args.only not in label(case):
            continue
        rec = run_case(case, args.hardware, steps, warmup=2, backend=backend, timeout_s=900)
        records.append(rec)
        print("\n".join(report(rec)), flush=True)
    Path(args.out).write_text(json.dumps(records, indent=1))
    ok = [r for r in records if r["run"].get("ok")]
    if ok:
        ratios = [r["run"]["step_time_s"] / r["estimate"]["step_time_s"] for r in ok]
        print(f"\n{len(ok)}/{len(records)} runs ok; measured/predicted step time: min {min(ratios):.2f} "
              f"max {max(ratios):.2f}" + ("  (CPU smoke: the estimate is for the GPU, the ratio means nothing)"
                                          if args.cpu_smoke else ""))
    print(f"records: {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
