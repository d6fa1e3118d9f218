#!/usr/bin/env python
"""A launcher that embeds autopar: solve, optionally tune with short real runs, then start training with the plan.

    # solve only, then train 20 steps with autopar's own runner (works on a CPU: gloo, scaled-down model)
    python examples/launch_with_autopar.py --model llama3_8b --gpus 2 --train-steps 20

    # tune first (8 real runs, resumable study in ./autopar-tune.db), then train
    python examples/launch_with_autopar.py --model llama3_8b --gpus 2 --tune 8 --train-steps 20

    # your own trainer: everything after "--" is run with the plan in AUTOPAR_* variables and AUTOPAR_PLAN
    python examples/launch_with_autopar.py --model llama3_8b --gpus 8 --tune 20 -- \
        torchrun --nproc-per-node 8 train.py --tp '$AUTOPAR_TP' --pp '$AUTOPAR_PP'

The training command gets the plan three ways: ``AUTOPAR_*`` environment variables (``autopar.emit.env_vars``:
AUTOPAR_TP, AUTOPAR_PP, AUTOPAR_VPP, AUTOPAR_MBS, AUTOPAR_GA, AUTOPAR_RECOMPUTE, ...), ``$AUTOPAR_*`` words in
the command replaced by their values, and ``AUTOPAR_PLAN``: a JSON file with the whole plan
(``autopar.tune.plan_document``; read it back with ``autopar.tune.read_plan_document``).

Without a command the launcher trains the model it planned for with autopar's runner
(``torchrun -m autopar.run.worker``): on a machine without GPUs that is the scaled-down model the
tuner measured, which is what makes this example run anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import string
import subprocess
import sys
import tempfile
from pathlib import Path

import autopar
from autopar.emit import env_vars
from autopar.search import Plan


def plan_without_tuning(args: argparse.Namespace) -> tuple[Plan, autopar.ModelSpec, autopar.TrainingSpec, dict]:
    """The solver's best plan, for the problem the tuner would measure (scaled down on a machine without GPUs)."""
    from autopar.tune import resolve_problem
    problem = resolve_problem(args.model, args.hardware, None, args.gpus, None)
    for note in problem.notes:
        print(f"note: {note}", file=sys.stderr)
    result = autopar.solve(problem.model, problem.hardware, problem.training, args.gpus,
                           autopar.SearchOptions(top_k=1, time_limit_s=20), with_heuristic=False)
    if not result.plans:
        sys.exit("no layout fits: " + "; ".join(result.explanation))
    plan = result.plans[0]
    doc = {"format": "autopar-solved-plan/1", "plan": plan.to_dict(), "model": problem.model.model_dump(mode="json"),
           "training": problem.training.model_dump(mode="json"), "gpus": args.gpus}
    return plan, problem.model, problem.training, doc


def plan_with_tuning(args: argparse.Namespace) -> tuple[Plan, autopar.ModelSpec, autopar.TrainingSpec, dict]:
    """Tune (resumable: the same call continues the same study) and take the layout measured fastest."""
    from autopar.tune import format_summary, plan_document, tune
    result = tune(args.model, args.hardware, None, args.gpus, trials=args.tune, storage=args.storage,
                  study=args.study)
    print(format_summary(result), file=sys.stderr)
    if result.best is None:
        sys.exit("no tuning run succeeded; see the failures above")
    return result.best, result.model, result.training, plan_document(result)


def main() -> int:
    argv = sys.argv[1:]
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    ours = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--hardware", default="h100_sxm")
    p.add_argument("--tune", type=int, default=0, metavar="TRIALS", help="tune with this many real runs first")
    p.add_argument("--storage", default=None, help="Optuna storage for the tuning study (default ./autopar-tune.db)")
    p.add_argument("--study", default=None)
    p.add_argument("--train-steps", type=int, default=20, help="steps of the built-in training (no command given)")
    p.add_argument("--keep", action="store_true", help="keep the run folder (plan.json, results) after the run")
    args = p.parse_args(ours)

    plan, model, training, doc = plan_with_tuning(args) if args.tune else plan_without_tuning(args)
    layout = plan.layout
    print(f"plan: {layout.short()} ({'measured fastest' if args.tune else 'predicted fastest'})", file=sys.stderr)

    work = Path(tempfile.mkdtemp(prefix="autopar-launch-"))   # autopar's own files; removed at the end
    try:
        plan_path = work / "plan.json"
        plan_path.write_text(json.dumps(doc, indent=1))
        env = dict(os.environ, **env_vars(layout, training, args.gpus), AUTOPAR_PLAN=str(plan_path))

        if not command:                         # autopar's own runner trains the planned model with the plan
            from autopar.run.launch import worker_spec
            spec = work / "spec.json"
            spec.write_text(json.dumps(worker_spec(model, layout, training, steps=args.train_steps, warmup=1,
                                                   result_dir=work)))
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                       f"--nproc-per-node={args.gpus}", "-m", "autopar.run.worker", "--spec", str(spec)]
            env.setdefault("OMP_NUM_THREADS", "1")
            root = str(Path(autopar.__file__).resolve().parents[1])
            env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        else:
            command = [string.Template(word).safe_substitute(env) for word in command]
        print("training: " + " ".join(command), file=sys.stderr)
        rc = subprocess.call(command, env=env)
        if rc == 0 and "--" not in argv:
            losses = json.loads((work / "rank0.json").read_text()).get("losses", [])
            last = [json.loads(f.read_text()) for f in work.glob("rank*.json")]
            losses = next((r["losses"] for r in last if r.get("loss_rank")), losses)
            if losses:
                print(f"trained {len(losses)} steps: loss {losses[0]:.4f} -> {losses[-1]:.4f}", file=sys.stderr)
    finally:
        if args.keep:
            print(f"run folder kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
