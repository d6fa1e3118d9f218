"""`autopar tune`: solve, then let Optuna pick among the solver's best layouts by short real runs.

    autopar tune --model llama3_8b --gpus 2                       # CPU: the model is scaled down, and says so
    autopar tune --model M --gpus 8 --trials 30 --storage postgresql://u:p@db/tune --study m8   # one of N workers
    autopar tune --model M --gpus 8 --emit env --emit-out plan.env --out plan.json              # before training

Progress goes to stderr; the predicted-vs-measured table, the winning plan and the --emit text to stdout.
Exit status: 0 with a measured winner, 1 when no run succeeded, 2 for bad input, 130 when interrupted (the
study keeps every finished trial; the same command resumes it).
"""

from __future__ import annotations

import argparse
import json
import sys

from autopar.cli.common import (SCALE_BOUNDS, add_emit_args, add_search_args, count, dump_json, overlap_fields,
                                overlap_set, search_options, seconds)
from autopar.defaults import DEFAULT_HARDWARE
from autopar.errors import AutoparInputError, Terminated
from autopar.fileio import OutputFile

SCALE_FLAGS = ("layers", "hidden", "ffn", "heads", "kv_heads", "experts", "vocab")


def _scale(args: argparse.Namespace) -> dict | str | None:
    given = {k: getattr(args, k) for k in SCALE_FLAGS if getattr(args, k) is not None}
    if args.no_scale:
        if given:
            raise AutoparInputError("--no-scale cannot go with --" + ", --".join(k.replace("_", "-") for k in given))
        return None
    return given or "auto"


def _training(args: argparse.Namespace) -> dict:
    out: dict = {}
    if args.seq_len is not None:
        out["seq_len"] = args.seq_len
    if args.global_batch is not None:
        out["global_batch"] = args.global_batch
    if args.precision is not None:
        out["precision"] = args.precision
    out.update(overlap_fields(args))
    return out


def run(args: argparse.Namespace) -> int:
    from autopar.tune import TuneInterrupted, format_summary, format_trials, plan_document, tune

    # every output is checked before the (long) study: its folder exists and takes a file
    out = OutputFile(args.out, "--out") if args.out is not None else None
    emit_out = OutputFile(args.emit_out, "--emit-out") if args.emit_out is not None else None
    if args.emit_out and not args.emit:
        raise AutoparInputError("--emit-out needs --emit megatron|bridge|torchtitan|env")
    if args.emit:   # refuse before the (long) tuning run when the launcher cannot train the model at all
        from autopar.emit import emit_refusal
        from autopar.specs.loaders import load_model
        refusal = emit_refusal(args.emit, load_model(args.model))
        if refusal:
            raise AutoparInputError(f"--emit {args.emit}: {refusal}")
    from autopar.cli.render import terminal_width, wrap, wrap_comments
    width = terminal_width()
    say = (lambda m: None) if args.quiet else (lambda m: print(wrap(m, width), file=sys.stderr, flush=True))
    try:
        result = tune(args.model, args.hardware, _training(args), args.gpus, search_options(args), trials=args.trials,
                      top_k=args.top_k, storage=args.storage, study=args.study, seed=args.seed, steps=args.steps,
                      warmup=args.warmup, timeout_s=args.timeout, backend=args.backend, scale=_scale(args),
                      seeds=args.seeds, confirm=args.confirm, progress=say)
    except TuneInterrupted as err:
        print(wrap(f"autopar tune: interrupted; {err}", width), file=sys.stderr)
        return 143 if isinstance(err.__context__, Terminated) else 130
    emitted = None
    if args.emit and result.best is not None:
        from autopar.emit import emit
        emitted = emit(args.emit, result.best.layout, result.model, result.training, result.gpus, result.hardware,
                       torchtitan_version=args.torchtitan_version)
        if args.emit_out:
            emit_out.write(emitted)
    if out is not None and result.best is not None:
        out.write(json.dumps(plan_document(result), indent=1))
    if args.json:
        d = result.to_dict()
        if args.emit:   # the settings are part of the answer: --json carries them too
            d["emit"] = {"target": args.emit, "text": emitted, "file": args.emit_out}
        print(dump_json(d))
        return 0 if result.best is not None else 1
    for n in result.notes:
        print(wrap(f"note: {n}", width))
    print(wrap(f"\nPredicted ({result.hardware.name}) vs measured ({result.gpus} rank(s)), every trial of study "
               f"'{result.study_name}':", width))
    print(wrap(format_trials(result, width), width))
    print(wrap(format_summary(result), width))
    if result.best is None:
        print("No run succeeded: no plan to give (see the failures above).")
        return 1
    b, e = result.best_trial, result.best.estimate
    print(f"\nWinning plan: {result.best.layout.short()}")
    print(wrap(f"  measured  {b.measured_tokens_per_s:,.0f} tokens/s, {b.measured_step_s:.4g} s/step, peak "
               f"{b.measured_mem_gib if b.measured_mem_gib is not None else float('nan'):.3f} GiB on the fullest "
               "rank", width))
    print(wrap(f"  predicted {e.step_time_s:.4g} s/step, {e.memory_gib.total:.2f} GiB per GPU on "
               f"{result.hardware.name} ({'fits' if e.fits else 'does not fit'})", width))
    if args.out:
        print(f"  written to {args.out}")
    if emitted is not None:
        print(f"\n{args.emit} settings" + (f" (also in {args.emit_out})" if args.emit_out else ""))
        print(wrap_comments(emitted, width), end="" if emitted.endswith("\n") else "\n")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune", help="measure the solver's best layouts with short real runs; Optuna finds the fastest",
        description="Solve, then run an Optuna study over the solver's top-K parallel structures with micro-batch, "
                    "recompute, virtual stages and ZeRO stage as parameters. Each trial is a short real training "
                    "run (autopar profile's runner); the objective is the measured tokens/s. The solver's "
                    "predicted-best layouts are the first trials; layouts predicted not to fit are never run. The "
                    "study lives in an Optuna storage: the same command resumes it, and several workers on several "
                    "nodes can share it (--storage postgresql://... or journal:FILE). Without GPUs the runs are "
                    "gloo processes on the CPU and a large model is scaled down (the output says so).")
    g = p.add_argument_group("problem")
    g.add_argument("--model", required=True, help="zoo name (see `autopar zoo`), a model YAML, or a HF config.json")
    g.add_argument("--gpus", type=count("gpus"), required=True,
                   help="world size of every run (GPUs of this node; processes with gloo on a CPU)")
    g.add_argument("--hardware", default=DEFAULT_HARDWARE,
                   help=f"what the predictions and the memory limit are for (default: {DEFAULT_HARDWARE})")
    g.add_argument("--seq-len", type=count("seq_len"), default=None, help="sequence length (default: 128 on CPU, 4096)")
    g.add_argument("--global-batch", type=count("global_batch"), default=None,
                   help="sequences per step (default: 4 per rank on CPU, else by model size)")
    g.add_argument("--precision", default=None, help="GEMM precision of the predictions (default: bf16)")
    g.add_argument("--overlap", type=overlap_set, default=None, metavar="none|tp,dp,ep,cp",
                   help="communication the framework overlaps, for the predictions (default: tp,dp,ep,cp)")
    s = p.add_argument_group("scale the model down (default on a machine without GPUs: at most 4 layers, hidden 64, "
                             "ffn 256, 4 heads, 4 experts, vocab 512)")
    for name in SCALE_FLAGS:
        s.add_argument(f"--{name.replace('_', '-')}", type=count(SCALE_BOUNDS[name]), default=None)
    s.add_argument("--no-scale", action="store_true", help="run the model as given, even on a CPU")
    pins = add_search_args(p, "search space (pins as comma lists, as for `autopar solve`)", time_limit_default=20.0)
    pins.add_argument("--top-k", type=count("top_k"), default=8,
                      help="distinct parallel structures kept from the solver (default: 8)")
    st = p.add_argument_group("study")
    st.add_argument("--trials", type=count("trials"), default=20,
                    help="real runs in the whole study, all workers together; more on a later call extends it "
                         "(default: 20)")
    st.add_argument("--seeds", type=count("trials", low=0), default=None,
                    help="first trials taken from the solver's ranking (default: min(top-k, trials/2))")
    st.add_argument("--confirm", type=count("trials", low=0), default=None,
                    help="last trials re-measuring the runner-up layouts; each layout counts its fastest run "
                         "(default: min(2, trials/5))")
    st.add_argument("--storage", default=None,
                    help="Optuna storage: sqlite:///FILE (default sqlite:///autopar-tune.db here), "
                         "postgresql://..., mysql://..., journal:FILE, redis://...")
    st.add_argument("--study", default=None, help="study name (default: derived from the problem, so the same "
                                                   "command resumes the same study)")
    st.add_argument("--seed", type=count("seed", low=0), default=0, help="sampler seed (default: 0)")
    r = p.add_argument_group("each run")
    r.add_argument("--steps", type=count("steps"), default=8,
                   help="training steps per run, warm-up included (default: 8)")
    r.add_argument("--warmup", type=count("steps", low=0), default=2, help="steps left out of the timing (default: 2)")
    r.add_argument("--timeout", type=seconds("run_timeout_s"), default=300.0,
                   help="seconds before a run is killed (default: 300)")
    r.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="auto = NCCL when this node has GPUs, else gloo on the CPU")
    o = p.add_argument_group("output")
    add_emit_args(o, "the winning plan")
    o.add_argument("--emit-out", default=None, help="also write the --emit text to this file")
    o.add_argument("--out", default=None, help="write the winning plan as JSON (Plan.to_dict + measurement)")
    o.add_argument("--json", action="store_true", help="print the whole result as JSON")
    o.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=run)
