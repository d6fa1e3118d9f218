"""`autopar profile`: train one layout for real for a few steps and measure it.

    autopar profile run  --model llama3_8b --gpus 4 --tp 2 --pp 2 --layers 4 --hidden 256 --heads 8 ...
    autopar profile spec --model llama3_8b --gpus 4 --tp 2 ... -o spec.json   # for a hand-run torchrun

``autopar profile hardware`` and ``autopar profile compare`` are registered here too; their command lines are
in autopar/cli/measure.py, the work in autopar/measure/.

torch is never imported here: the run happens in torchrun's worker processes (autopar.run.worker; see
docs/runner.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autopar.cli.common import SCALE_BOUNDS, count, dump_json, seconds
from autopar.cli.estimate import add_layout_args, layout_from_args
from autopar.cli.measure import register_compare, register_hardware
from autopar.errors import AutoparInputError
from autopar.fileio import OutputFile, check_output_dir
from autopar.run import check_cpu_world, runner_training, runs_on_cpu, scale_model, scale_notes
from autopar.specs.layout import resolve_layout
from autopar.specs.loaders import build_spec, load_model
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

DEFAULT_SEQ_LEN = 256   # small on purpose: profiling runs are meant to fit the machine at hand
SCALE_FLAGS = ("layers", "hidden", "ffn", "heads", "kv_heads", "experts", "vocab")


def _add_run_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("problem")
    g.add_argument("--model", required=True, help="zoo name (see `autopar zoo`), a model YAML, or a HF config.json")
    g.add_argument("--gpus", type=count("gpus"), required=True,
                   help="ranks to launch (GPUs with NCCL, processes with gloo on the CPU)")
    g.add_argument("--seq-len", type=count("seq_len"), default=DEFAULT_SEQ_LEN,
                   help=f"sequence length (default: {DEFAULT_SEQ_LEN})")
    g.add_argument("--global-batch", type=count("global_batch"), default=None,
                   help="sequences per step (default: dp·mbs·pp, the smallest batch that fills the pipeline)")
    s = p.add_argument_group("scale the model down (same architecture; divisibility is checked against the layout)")
    for name in SCALE_FLAGS:
        s.add_argument(f"--{name.replace('_', '-')}", type=count(SCALE_BOUNDS[name]), default=None)
    add_layout_args(p)
    r = p.add_argument_group("run")
    r.add_argument("--steps", type=count("steps"), default=4, help="training steps, warm-up included (default: 4)")
    r.add_argument("--warmup", type=count("steps", low=0), default=1, help="steps left out of the timing (default: 1)")
    r.add_argument("--seed", type=count("seed", low=0), default=0,
                   help="seed of the weights and the synthetic data (default: 0)")
    r.add_argument("--timeout", type=seconds("run_timeout_s"), default=600.0,
                   help="seconds before the run is killed (default: 600)")
    r.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="auto = NCCL when CUDA is available, else gloo on the CPU")
    r.add_argument("--lr", type=float, default=None,
                   help="peak AdamW learning rate (default: 3e-4, Llama 3 8B's)")
    r.add_argument("--lr-warmup", type=int, default=None,
                   help="steps of linear LR warm-up (default: a quarter of --steps, at least 1)")
    r.add_argument("--dtype", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
                   help="model weights' dtype; auto = the training precision's (bf16) on CUDA, fp32 on the CPU "
                        "(fp32 main weights and Adam moments always)")


def _problem(args: argparse.Namespace) -> tuple[ModelSpec, object, TrainingSpec]:
    model = load_model(args.model)
    scale = {k: getattr(args, k) for k in SCALE_FLAGS if getattr(args, k) is not None}
    if scale:
        unscaled, model = model, scale_model(model, **scale)
        for note in scale_notes(unscaled, model):    # what scaling changed beyond the sizes asked for
            from autopar.cli.render import wrap
            print(wrap(f"note: {note}"), file=sys.stderr)
    layout = layout_from_args(args)
    if layout.offload_activations:
        raise AutoparInputError("--offload-activations: the profiling runner does not offload activations yet; "
                                "profile without it (autopar estimate models the offload)")
    gb = args.global_batch
    if gb is None:
        gb = max(1, args.gpus // layout.dense_ranks) * layout.micro_batch * layout.pp
    training = runner_training(build_spec(TrainingSpec, dict(seq_len=args.seq_len, global_batch=gb), "training flags"),
                               model)
    resolve_layout(layout, model, training, args.gpus)      # invalid layouts fail here, with the arithmetic
    if args.warmup < 0 or args.steps <= args.warmup:
        raise AutoparInputError(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    if args.lr is not None and not args.lr > 0:
        raise AutoparInputError(f"--lr must be positive (got {args.lr})")
    if args.lr_warmup is not None and args.lr_warmup < 0:
        raise AutoparInputError(f"--lr-warmup must be at least 0 (got {args.lr_warmup})")
    return model, layout, training


def run(args: argparse.Namespace) -> int:
    from autopar.cli.render import terminal_width, wrap
    from autopar.run.launch import run_layout
    width = terminal_width()

    def say(line: str = "", file=None) -> None:   # every line within the terminal, continued under its label
        print(wrap(line, width, indent=" " * 10), file=file, flush=file is not None)

    if args.workdir:
        check_output_dir(args.workdir, "--workdir")
    model, layout, training = _problem(args)
    resolved = resolve_layout(layout, model, training, args.gpus)
    if runs_on_cpu(args.backend):
        check_cpu_world(args.gpus)
    say(f"autopar profile: {model.summary()}; {resolved.short()}; {args.gpus} ranks, "
        f"{training.global_batch} x {training.seq_len} tokens/step, {args.steps} steps", file=sys.stderr)
    res = run_layout(model, layout, training, world=args.gpus, steps=args.steps, warmup=args.warmup,
                     timeout_s=args.timeout, seed=args.seed, backend=args.backend,
                     workdir=Path(args.workdir) if args.workdir else None,
                     progress=lambda line: say(line, file=sys.stderr),
                     lr=args.lr, lr_warmup_steps=args.lr_warmup, dtype=args.dtype)
    if args.json:
        print(dump_json(dict(res.to_dict(), model=model.model_dump(mode="json"), layout=resolved.short(),
                             global_batch=training.global_batch, seq_len=training.seq_len)))
        return 0 if res.ok else 1
    if not res.ok:
        say(f"run failed: {res.failure}" + (f" (log: {res.log_path})" if res.log_path else ""))
        return 1
    a = res.applied
    say(f"model     {model.summary()}")
    say(f"layout    {resolved.short()}")
    say("applied   " + " ".join(f"{k}={a[k]}" for k in ("tp", "pp", "dp", "cp", "ep", "etp")) +
        f"  sp={a['sp']}  schedule={a['schedule']}  backend={a['backend']} ({a['dtype']})")
    say(f"          data parallel: {a['data_parallel']}; recompute: {', '.join(a['recompute']) or 'none'}")
    say(f"step      {res.step_time_s:.4f} s (median of {args.steps - args.warmup} after {args.warmup} warm-up)"
        f"   {res.tokens_per_s:,.0f} tokens/s")
    say(f"memory    peak GiB per rank: {' '.join(f'{m:.3f}' for m in res.peak_mem_gib)}  ({a['memory']})")
    say(f"          scheme: {a['memory_scheme']}")
    for term, label in (("weights", "weights"), ("grads", "gradients"), ("optimizer", "optimizer (main+Adam)"),
                        ("fwd_bwd_peak", "fwd/bwd peak above step start")):
        vals = [t.get(term) for t in res.memory_terms_gib]
        shown = "n/a on CPU" if all(v is None for v in vals) else " ".join(f"{v:.4g}" for v in vals)
        say(f"          {label:<30} GiB per rank: {shown}")
    say(f"loss      {' '.join(f'{x:.4f}' for x in res.losses)}   ({a['lr']})")
    for n in res.notes:
        say(f"note      {n}")
    return 0


def spec(args: argparse.Namespace) -> int:
    from autopar.run.launch import worker_spec
    target = OutputFile(args.out, "--out")          # checked before any work
    model, layout, training = _problem(args)
    resolved = resolve_layout(layout, model, training, args.gpus)
    out = target.path
    target.write(json.dumps(worker_spec(model, resolved, training, steps=args.steps, warmup=args.warmup,
                                          seed=args.seed, backend=args.backend, timeout_s=args.timeout,
                                          lr=args.lr, lr_warmup_steps=args.lr_warmup, dtype=args.dtype), indent=1))
    print(f"wrote {out}; run it with:\n  torchrun --nproc-per-node {args.gpus} -m autopar.run.worker --spec {out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="train one layout for a few real steps and measure it",
                       description="Real training runs with torch.distributed (torchrun): TP/SP, PP (1F1B, "
                                   "interleaved), CP (ring attention), EP/ETP, FSDP/ZeRO, recompute.")
    psub = p.add_subparsers(dest="profile_command", metavar="SUBCOMMAND")
    r = psub.add_parser("run", help="launch torchrun with the layout's world size and report the measurements",
                        description="Build the model (optionally scaled down), apply the layout, train "
                                    "--steps steps on synthetic data and report the median step time, tokens/s, "
                                    "peak memory per rank, the loss per step and the layout actually applied.")
    _add_run_args(r)
    r.add_argument("--workdir", default=None, help="keep the spec, per-rank results and the log here")
    r.add_argument("--json", action="store_true", help="print one JSON object (RunResult.to_dict() and the inputs)")
    r.set_defaults(func=run)
    s = psub.add_parser("spec", help="write the worker's JSON spec for a hand-launched torchrun",
                        description="Write the run spec and print the torchrun command that runs it.")
    _add_run_args(s)
    s.add_argument("-o", "--out", default="spec.json", help="file to write (default: spec.json)")
    s.set_defaults(func=spec)

    # Measurement subcommands: autopar.measure (command lines in autopar.cli.measure).
    register_hardware(psub)
    register_compare(psub)

    def _usage(args: argparse.Namespace) -> int:
        p.print_help()
        raise AutoparInputError("profile: no subcommand given (choose " + ", ".join(psub.choices) + ")")
    p.set_defaults(func=_usage)
