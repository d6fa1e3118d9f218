"""Arguments shared by the commands: the problem (model, hardware, training, gpus) and layout degrees."""

from __future__ import annotations

import argparse
import json
import math

from autopar.defaults import (DEFAULT_HARDWARE, DEFAULT_MBS, DEFAULT_MEMORY_MARGIN, DEFAULT_PRECISION,
                              DEFAULT_SEQ_LEN, DEFAULT_STACK, DEFAULT_VPP, DEFAULT_ZERO, MEMORY_MARGIN_SOURCE,
                              default_global_batch)
from autopar.errors import AutoparInputError
from autopar.specs.bounds import BOUNDS, limit
from autopar.specs.hardware import PRECISIONS, HardwareSpec
from autopar.specs.loaders import build_spec, load_hardware, load_model, load_stack
from autopar.specs.model import ModelSpec
from autopar.specs.stack import parse_knobs
from autopar.specs.training import TrainingSpec


# Version of the --json output layout; bumped when a key changes meaning or goes away (docs/launchers.md).
SCHEMA_VERSION = 1


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{shown}'") from None


def _shown(v: int) -> str:
    """A whole number as shown in a message: its digits, or how many there are when it is huge."""
    digits = str(abs(v))
    return str(v) if len(digits) <= 30 else f"a {len(digits)}-digit number"


def positive_int(text: str) -> int:
    v = _whole(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {v}")
    return v


def count(bound: str, low: int = 1):
    """argparse type: a whole number from ``low`` to autopar's bound ``bound`` (autopar/specs/bounds.py)."""
    def parse(text: str) -> int:
        v = _whole(text)
        if not low <= v <= limit(bound):
            raise argparse.ArgumentTypeError(f"must be between {low} and {BOUNDS[bound]} (bound: {BOUNDS[bound].why}), "
                                             f"got {_shown(v)}")
        return v
    parse.__name__ = f"whole number ({bound})"   # argparse names the type in its messages
    return parse


def seconds(bound: str):
    """argparse type: a finite positive number of seconds, at most autopar's bound ``bound``."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected seconds, got '{text[:40]}'") from None
        if not (math.isfinite(v) and 0 < v <= limit(bound)):
            raise argparse.ArgumentTypeError(f"must be a finite number of seconds above 0 and at most "
                                             f"{BOUNDS[bound]} ({BOUNDS[bound].why}), got {text[:40]}")
        return v
    parse.__name__ = "seconds"
    return parse


def fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 1, got '{text[:40]}'") from None
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {v}")
    return v


def margin(text: str) -> float:
    """--memory-margin: a share of HBM from 0 to 0.5."""
    from autopar.search.space import MAX_MEMORY_MARGIN
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share of HBM such as 0.08, got '{text[:40]}'") from None
    if not (math.isfinite(v) and 0 <= v <= MAX_MEMORY_MARGIN):
        raise argparse.ArgumentTypeError(f"must be between 0 and {MAX_MEMORY_MARGIN}, got {text[:40]}")
    return v


def add_problem_args(p: argparse.ArgumentParser, gpus_required: bool = True, gpus_range: bool = False,
                     cluster: bool = False) -> None:
    g = p.add_argument_group("problem")
    g.add_argument("--model", required=True, help="zoo name (see `autopar zoo`), a model YAML, or a HF config.json")
    g.add_argument("--hardware", default=DEFAULT_HARDWARE, help=f"zoo name or YAML (default: {DEFAULT_HARDWARE})")
    if cluster:   # --gpus or --cluster: load_problem checks that one is given
        gpus_required = False
        g.add_argument("--cluster", default=None, metavar="NODESxGPUS[:FABRIC]",
                       help="the cluster instead of --gpus: e.g. 32x8 or 32x8:rail (rail-optimised), 32x8:2:1 "
                            "(2:1 oversubscribed scale-out; approximation: every inter-node collective at 1/2 of the "
                            "NIC bandwidth)")
    if gpus_range:
        g.add_argument("--gpus", required=gpus_required, metavar="N|A-B",
                       help="number of GPUs, or a range A-B searched at A, 2A, 4A, ... and B (see --objective)")
    else:
        g.add_argument("--gpus", type=count("gpus"), required=gpus_required, help="number of GPUs")
    g.add_argument("--seq-len", type=count("seq_len"), default=DEFAULT_SEQ_LEN,
                   help=f"sequence length (default: {DEFAULT_SEQ_LEN})")
    g.add_argument("--global-batch", type=count("global_batch"), default=None,
                   help="sequences per step (default: by model size, GPT-3 Table 2.1 scaling: 0.5M-4M tokens)")
    g.add_argument("--precision", choices=PRECISIONS, default=DEFAULT_PRECISION,
                   help=f"GEMM precision (default: {DEFAULT_PRECISION})")
    g.add_argument("--grad-dtype", choices=("bf16", "fp32"), default=None,
                   help="gradient buffer and reduction dtype (default: fp32, as Megatron-LM does for bf16 weights "
                        "unless --grad-reduce-in-bf16, and FSDP2 always; bf16 = --grad-reduce-in-bf16, as NVIDIA's "
                        "performance recipes run; fp16 under --precision fp16)")
    g.add_argument("--stack", default=None,
                   help=f"software stack: zoo name (see `autopar zoo stacks`) or YAML (default: the --emit target's, "
                        f"else {DEFAULT_STACK}, Megatron-Core as NVIDIA's recipes run it)")
    g.add_argument("--knobs", default="", metavar="K[,K=V...]",
                   help="stack knobs over the stack file's, e.g. compile,async_tp,fp8_recipe=rowwise,dp_overlap=off, "
                        "compiled_loss=off (torchtitan before 2025-04: compile leaves the loss eager) "
                        "(`autopar zoo stacks` lists them)")
    g.add_argument("--linear-cp", choices=("all_to_all", "state_pass"), default="all_to_all",
                   help="context parallelism of linear-attention / SSM layers (default: all_to_all, as Megatron-Core "
                        "runs it: heads split over tp·cp; state_pass: recurrent states passed between CP ranks, as "
                        "autopar's runner)")
    g.add_argument("--overlap", type=overlap_set, default=None, metavar="none|tp,dp,ep,cp",
                   help="which communication the framework overlaps with compute (default: tp,dp,ep,cp, as "
                        "Megatron-Core's performance recipes run; real runs often have some off): the others are "
                        "priced exposed (TP without overlap still hides each input-gradient reduce-scatter behind its "
                        "weight-gradient GEMM, as Transformer Engine runs it: knob tp_dgrad_overlap)")


def overlap_set(text: str) -> tuple[str, ...]:
    """'--overlap none' / 'tp,dp' -> the overlaps switched on; names outside tp, dp, ep, cp are refused."""
    from autopar.specs.training import OVERLAPS
    t = text.strip().lower()
    if t == "none":
        return ()
    parts = [x.strip() for x in t.split(",") if x.strip()]
    bad = [x for x in parts if x not in OVERLAPS]
    if bad or not parts:
        raise argparse.ArgumentTypeError(f"expected 'none' or a comma-separated subset of tp,dp,ep,cp, got "
                                         f"'{text[:40]}'")
    return tuple(dict.fromkeys(parts))


def overlap_fields(args: argparse.Namespace) -> dict[str, bool]:
    """TrainingSpec's ``*_comm_overlap`` switches from ``--overlap`` (absent: the spec's defaults)."""
    from autopar.specs.training import OVERLAPS
    on = getattr(args, "overlap", None)
    return {} if on is None else {f"{k}_comm_overlap": k in on for k in OVERLAPS}


# The stack each launcher runs: --emit NAME prices that framework, so the launcher and the prediction agree.
EMIT_STACK = {"torchtitan": "torchtitan", "megatron": "megatron_core", "bridge": "megatron_core",
              "megatron_hybrid": "megatron_core"}


def stack_for(stack: str | None, emit: str | None) -> str:
    """The stack to price: --stack, else the --emit target's, else the default; a --stack another framework's
    launcher cannot run is an error."""
    want = EMIT_STACK.get(emit or "")
    if stack is None:
        return want or DEFAULT_STACK
    if want and stack in EMIT_STACK.values() and stack != want:
        raise AutoparInputError(f"--stack {stack} with --emit {emit}: the {emit} launcher runs the {want} stack; "
                                f"drop --stack or pick --stack {want}")
    return stack


def load_problem(args: argparse.Namespace) -> tuple[ModelSpec, HardwareSpec, TrainingSpec, list[str]]:
    """Model, hardware and training from the parsed flags; notes on the defaults that were applied."""
    model = load_model(args.model)
    hw = load_hardware(args.hardware)
    notes = []
    if getattr(args, "cluster", None):
        from autopar.specs.cluster import parse_cluster
        cl = parse_cluster(args.cluster)
        if args.gpus is not None and str(args.gpus) != str(cl.gpus):
            raise AutoparInputError(f"--gpus {args.gpus} and --cluster {args.cluster} ({cl.gpus} GPUs) disagree; "
                                    "give one")
        args.gpus = cl.gpus
        hw, cluster_notes = cl.apply(hw)
        notes += cluster_notes
    elif hasattr(args, "cluster") and args.gpus is None:
        raise AutoparInputError("give --gpus N or --cluster NODESxGPUS")
    gb = args.global_batch
    if gb is None:
        gb, why = default_global_batch(model, args.seq_len)
        notes.append(why)
    # The software stack: its knobs set the TrainingSpec switches (a flag here > the stack file > the built-in
    # default) and its fitted efficiency constants replace the hardware file's.
    stack = load_stack(stack_for(getattr(args, "stack", None), getattr(args, "emit", None)))
    knobs = stack.with_knobs(parse_knobs(getattr(args, "knobs", "") or ""))
    hw = stack.on(hw)
    args.stack_spec, args.stack_knobs = stack, knobs
    fields = knobs.training_fields()
    training = build_spec(TrainingSpec, dict(
        seq_len=args.seq_len, global_batch=gb, precision=args.precision,
        # unset: TrainingSpec's default for the weight dtype and the stack (fp32 for bf16 weights, FSDP2's fp32)
        **({} if args.grad_dtype is None else {"grad_dtype": args.grad_dtype}),
        weight_dtype="fp16" if args.precision == "fp16" else "bf16",
        linear_cp=getattr(args, "linear_cp", "all_to_all"),
        **{**fields, **overlap_fields(args)}), "training flags")   # --overlap over the stack's
    hw.peak_tflops(training.precision)  # fails early, naming the precision, if the chip lacks it
    return model, hw, training, notes


def _finite(obj: object) -> object:
    """NaN and infinities (an empty mean, an unreachable time) as null: JSON has no spelling for them."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def dump_json(obj: object) -> str:
    """Strict JSON (RFC 8259): non-finite numbers become null."""
    return json.dumps(_finite(obj), indent=2, sort_keys=False, allow_nan=False)


def parse_int_list(text: str, name: str, bound: str = "degree", low: int = 1) -> list[int]:
    """'2,4,8' -> [2, 4, 8]; each value from ``low`` to autopar's ``bound``."""
    parts = [x for x in text.split(",") if x.strip()]
    if len(parts) > 4096:
        raise AutoparInputError(f"{name}: {len(parts):,} values; give at most 4,096")
    try:
        vals = [int(x) for x in parts]
    except ValueError:
        raise AutoparInputError(f"{name}: expected comma-separated whole numbers, got '{text[:60]}'") from None
    if not vals:
        raise AutoparInputError(f"{name}: no value given")
    bad = [v for v in vals if not low <= v <= limit(bound)]
    if bad:
        shown = ", ".join(_shown(v) for v in bad[:5])
        raise AutoparInputError(f"{name}: values must be between {low} and {BOUNDS[bound]}, got {shown}")
    return vals


# Flags that scale a model down for a real run (`autopar profile`, `autopar tune`) -> their bounds.
SCALE_BOUNDS = {"layers": "layers", "hidden": "hidden", "ffn": "ffn", "heads": "heads", "kv_heads": "heads",
                "experts": "experts", "vocab": "vocab"}
SEARCH_AXES = ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs")


def _commas(values) -> str:
    return ",".join(map(str, values))


def add_search_args(p: argparse.ArgumentParser, title: str, time_limit_default: float) -> argparse._ArgumentGroup:
    """The solver's pins and ranges, the same flags for `autopar solve` and `autopar tune`."""
    g = p.add_argument_group(title)
    searched = {"vpp": _commas(DEFAULT_VPP), "mbs": _commas(DEFAULT_MBS)}
    for ax in SEARCH_AXES:
        g.add_argument(f"--{ax}", default=None, help=f"allowed {ax} values, e.g. --{ax} 2,4 (default: "
                       + (searched[ax] if ax in searched else "the divisors of the GPU count the rules allow") + ")")
    g.add_argument("--zero", default=None, help=f"allowed ZeRO stages, e.g. 1,3 (default: {_commas(DEFAULT_ZERO)})")
    g.add_argument("--fsdp", action="store_true", help="only FSDP (ZeRO-3) layouts")
    g.add_argument("--recompute", default=None, help="allowed policies separated by ';' (default: none;selective;full)")
    g.add_argument("--max-tp", type=count("degree"), default=None, help="largest TP to consider")
    g.add_argument("--no-cp", action="store_true", help="no context parallelism")
    g.add_argument("--no-sp", action="store_true", help="no sequence parallelism")
    g.add_argument("--allow-cross-domain", action="store_true",
                   help="let TP and ETP span NVLink domains (default: forbidden; EP may always span domains)")
    g.add_argument("--memory-margin", type=margin, default=None, metavar="SHARE",
                   help="share of HBM kept free beyond the memory model (default: the largest under-prediction "
                        "of peak memory on the published runs of the plan's stack, data/error_bars.yaml, where it has "
                        f"5 or more; else {DEFAULT_MEMORY_MARGIN:g}, {MEMORY_MARGIN_SOURCE.replace('%', '%%')}; "
                        "0 fills HBM up to the prediction)")
    g.add_argument("--time-limit", type=seconds("time_limit_s"), default=time_limit_default,
                   help=f"wall-clock seconds for the search (default: {time_limit_default:g}): the cost tables, CP-SAT "
                        "and the infeasibility explanation; tune gives it to each of its solves. Start-up, loading "
                        "and printing are outside it, the tables stop at it only once one layout is found, and a "
                        "mesh's table in progress finishes first (see README, bounds)")
    return g


def search_options(args: argparse.Namespace, **extra):
    """SearchOptions from the flags of :func:`add_search_args` (``extra``: fields a command sets itself).
    One builder for solve and tune: this parses the text (whole numbers, no absurd sizes); SearchOptions checks
    every value (each axis's bound, ZeRO stages 0-3, recompute policies) for the CLI and the library alike."""
    from autopar.search.space import SearchOptions
    pins = {k: parse_int_list(getattr(args, k), f"--{k}") if getattr(args, k) else None for k in SEARCH_AXES}
    if args.no_cp:
        if pins["cp"] and pins["cp"] != [1]:
            raise AutoparInputError(f"--no-cp contradicts --cp {args.cp}")
        pins["cp"] = [1]
    if args.fsdp:
        if args.zero and parse_int_list(args.zero, "--zero", low=0) != [3]:
            raise AutoparInputError(f"--fsdp (ZeRO-3) contradicts --zero {args.zero}")
        zero = [3]
    else:
        zero = parse_int_list(args.zero, "--zero", low=0) if args.zero else None
    rc = None
    if args.recompute is not None:
        rc = [x.strip() for x in args.recompute.split(";") if x.strip()]
        if not rc:
            raise AutoparInputError(f"--recompute: no policy given in '{args.recompute[:60]}' (e.g. none;full)")
    if getattr(args, "memory_margin", None) is not None:
        extra = {"memory_margin": args.memory_margin, **extra}
        args.memory_margin_source = "--memory-margin"
    elif getattr(args, "stack_spec", None) is not None:
        # derived from the measured memory errors of the plan's stack (autopar.measure.intervals.memory_margin)
        from autopar.measure.intervals import memory_margin
        margin, args.memory_margin_source = memory_margin(args.stack_spec.name)
        extra = {"memory_margin": margin, **extra}
    return SearchOptions(**pins, zero=zero, recompute=rc, max_tp=args.max_tp,
                         allow_cross_domain=args.allow_cross_domain, time_limit_s=args.time_limit,
                         sequence_parallel=False if args.no_sp else None, **extra)


EMIT_CHOICES = ("megatron", "bridge", "torchtitan", "env")
TORCHTITAN_VERSIONS = ("0.3.0", "0.2.2")   # autopar.emit.torchtitan.TORCHTITAN_VERSIONS (not imported: start-up time)


def add_emit_args(g, what: str) -> None:
    """--emit and --torchtitan-version (docs/launchers.md describes each target and its version)."""
    g.add_argument("--emit", choices=EMIT_CHOICES, default=None,
                   help=f"print launcher settings for {what}: megatron (Megatron-Core 0.20 pretrain_gpt.py args), "
                        "bridge (Megatron-Bridge 0.7 recipe overrides), torchtitan (0.3.0 Trainer.Config), env")
    g.add_argument("--torchtitan-version", choices=TORCHTITAN_VERSIONS, default=TORCHTITAN_VERSIONS[0],
                   help="torchtitan release to emit for (default: %(default)s; 0.2.2 = the old TOML job file)")


def prediction_intervals(model: ModelSpec, hw: HardwareSpec, stack: str, est) -> dict:
    """The 80% intervals (autopar/measure/intervals.py, data/error_bars.yaml) of a prediction's throughput and
    memory, as a JSON-ready dict ({} when the file is missing or has no entry)."""
    from autopar.measure.intervals import memory_interval, regime_of, throughput_interval
    reg = regime_of(model, hw, stack)
    try:
        t = throughput_interval(est.tokens_per_s_per_gpu, reg)
        # memory errors are measured against the allocator's printed peak, which holds no CUDA context or NCCL
        # buffers (autopar.measure.published_memory): the band is taken on the prediction less the reserve that
        # stands for them, and the reserve added back, so it reads in the prediction's own units
        m = memory_interval(est.memory_gib.total - hw.reserve_gib, reg)
    except AutoparInputError:
        return {}
    out = {}
    if t:
        out["tokens_per_s_per_gpu"] = t.to_dict()
        step = est.step_time_s
        # the step time moves inversely with the throughput
        out["step_time_s"] = {**t.to_dict(), "predicted": step, "low": step * t.predicted / t.high,
                              "high": step * t.predicted / t.low,
                              "median": step * t.predicted / t.median if t.median else None}
    if m:
        r = hw.reserve_gib
        out["memory_gib"] = {**m.to_dict(), "predicted": m.predicted + r, "low": m.low + r, "high": m.high + r,
                             "median": m.median + r if m.median is not None else None}
    return out


def interval_line(iv: dict) -> str:
    """One line for the text output: the measured figure's interval (bias-corrected by the held-out errors of runs
    like this one, autopar/measure/intervals.py: not centred on the point prediction) with its median and the
    regime it comes from, and where the point prediction lies outside it, which way the model errs there."""
    if not iv:
        return "interval: none (data/error_bars.yaml missing; autopar validate --fit --cv --write-intervals)"
    parts = []
    t = iv.get("tokens_per_s_per_gpu")
    if t:
        med = f", median {t['median']:,.0f}" if t.get("median") else ""
        side = ("" if t.get("contains_prediction", True) else
                "; the point prediction lies " + ("above: the model runs fast" if t["high"] < t["predicted"] else
                                                  "below: the model runs slow") + " on such runs")
        parts.append(f"{t['low']:,.0f}-{t['high']:,.0f} tokens/s/GPU{med} ({t['rows']} held-out runs: "
                     f"{t['regime']}{side})")
    m = iv.get("memory_gib")
    if m:
        parts.append(f"memory {m['low']:.1f}-{m['high']:.1f} GiB ({m['rows']} runs: {m['regime']})")
    else:
        parts.append("no memory interval (no published run of this stack prints its peak memory)")
    share = (t or m)["share"]
    return (f"{share:.0%} interval of the measured figure, bias-corrected by how published runs like this one "
            "erred: " + "; ".join(parts))
