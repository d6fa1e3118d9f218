"""``autopar profile hardware`` and ``autopar profile compare``: the command lines of the measurement package.

The work is in :mod:`autopar.measure.hwfile` (microbenchmarks into a hardware file) and
:mod:`autopar.measure.compare` (real runs against the cost model, then :mod:`autopar.measure.calibrate`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from autopar.cli.common import overlap_fields, overlap_set
from autopar.errors import AutoparInputError
from autopar.fileio import OutputFile, read_input, show_path
from autopar.measure import ProfileError
from autopar.measure.collectives import OP_LABELS, OPS, busbw_table, measured_collectives
from autopar.specs.hardware import HardwareSpec
from autopar.specs.training import TrainingSpec


# ---- hardware ------------------------------------------------------------------------------------------------
def parse_float_list(text: str, what: str) -> list[float]:
    try:
        vals = [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise AutoparInputError(f"{what}: expected comma-separated numbers, got '{text}'") from None
    if not vals or any(v <= 0 or not math.isfinite(v) for v in vals):
        raise AutoparInputError(f"{what}: expected positive numbers, got '{text}'")
    return vals


def register_hardware(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``hardware`` to the ``autopar profile`` subparsers."""
    p = subparsers.add_parser(
        "hardware", help="measure kernels and collective bus bandwidth; write a hardware file",
        description="Measure each kernel class the cost model prices (GEMM by shape, grouped GEMM, flash attention "
                    "forward/backward, memory-bound kernels, pinned host copies; tiny shapes on a CPU) and "
                    "all-reduce / all-gather / reduce-scatter / all-to-all / send-recv bus bandwidth (nccl-tests "
                    "definitions) with real processes on this machine (gloo on CPU, NCCL on CUDA), and write a "
                    "hardware YAML with the measured tables (docs/measurement.md).")
    p.add_argument("--out", required=True, type=Path, help="hardware YAML to write (never overwritten without --force)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--base", default=None,
                   help="hardware zoo name or file to start from (default: describe this machine from the measurements)")
    p.add_argument("--name", default=None, help="name of the written hardware (default: base's, or cpu_gloo_<N>p)")
    p.add_argument("--world", type=int, default=2, help="processes (group sizes 2, 4, ... up to this; default 2)")
    p.add_argument("--sizes", default="1,4,16,64", help="message sizes in MiB, comma-separated (default 1,4,16,64); "
                   "the spec keeps the largest")
    p.add_argument("--ops", default=",".join(OPS), help=f"collectives, comma-separated (default all: {','.join(OPS)})")
    p.add_argument("--model", default=None, help="model zoo name or file: measure GEMMs at its shapes")
    p.add_argument("--tokens", type=int, default=4096, help="GEMM rows for --model: micro-batch x seq_len (default 4096)")
    p.add_argument("--no-kernels", action="store_true",
                   help="skip the kernel-class tables (GEMM by shape, grouped GEMM, flash attention, memory-bound "
                        "kernels, host copies) written to the file's 'kernels:' section")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per measurement group (default 300)")
    p.add_argument("--cpu-math", choices=("fp32", "bf16"), default="fp32",
                   help="CPU only: the measured rate to store as peak_tflops_bf16/fp16 (default fp32: autopar's CPU "
                        "runner computes in fp32)")
    p.add_argument("--results-from", type=Path, default=None,
                   help="merge collective records (JSON lines) written by a torchrun multi-node worker run")
    p.set_defaults(func=_cmd_hardware)
    return p


def _cmd_hardware(args: argparse.Namespace) -> int:
    from autopar.specs.loaders import load_hardware, load_model
    out: Path = args.out
    OutputFile(out, "--out", overwrite=args.force)    # fail before minutes of measuring, and again before writing
    if args.world < 1:
        raise AutoparInputError(f"--world must be at least 1 (got {args.world})")
    extra = _json_lines(args.results_from) if args.results_from is not None else None   # read before measuring
    base = load_hardware(args.base) if args.base else None
    model = load_model(args.model) if args.model else None
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    sizes = parse_float_list(args.sizes, "--sizes")
    from autopar.measure.hwfile import compute_summary, file_header, profile_hardware, write_new_file
    try:
        spec, raw = profile_hardware(base, world=args.world, sizes_mib=sizes, ops=ops, model=model,
                                     timeout_s=args.timeout, tokens=args.tokens, name=args.name,
                                     cpu_math=args.cpu_math, kernels=not args.no_kernels)
    except ProfileError as err:
        print(f"autopar: profile failed: {err}", file=sys.stderr)
        return 1
    if extra is not None:
        raw["records"].extend(extra)
        raw["nodes"] = "see --results-from"
        raw["cross_node"] = f"merged from {args.results_from}"
        raw["busbw_gbps"] = busbw_table(raw["records"])
        table = measured_collectives(raw["records"], max(raw["sizes_mib"]))
        spec = HardwareSpec.model_validate({**spec.model_dump(), "measured_busbw_gbps":
                                            table.model_dump() if table else None})
    if spec.measured_busbw_gbps is not None:
        m = spec.measured_busbw_gbps
        parts = [f"{OP_LABELS[op]}={dict(getattr(m, op))}" for op in OPS if getattr(m, op)]
        print(f"Measured BW (GB/s, {m.message_mib:g} MiB): " + ", ".join(parts))
    for line in compute_summary(raw):
        print(line)
    write_new_file(spec, out, file_header(spec, raw), force=args.force)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _json_lines(path: Path) -> list[dict]:
    """The records of a JSON-lines file (--results-from), read through the bounded input reader."""
    out = []
    try:
        text = read_input(path).decode("utf-8")
    except UnicodeDecodeError as err:
        raise AutoparInputError(f"--results-from {show_path(path)}: not UTF-8 text (byte {err.start})") from None
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise AutoparInputError(f"--results-from {show_path(path)} line {i}: not JSON ({err.msg})") from None
        if not isinstance(rec, dict):
            raise AutoparInputError(f"--results-from {show_path(path)} line {i}: expected a JSON object")
        out.append(rec)
    return out


# ---- compare ------------------------------------------------------------------------------------------------
def register_compare(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``compare`` to the ``autopar profile`` subparsers."""
    p = subparsers.add_parser(
        "compare", help="run layouts for real, compare with the cost model, fit the hardware's efficiency constants",
        description="Run each layout with real processes, print predicted vs measured step time and memory, fit "
                    "the hardware file's efficiency constants (GEMM, collectives, per-layer overhead) to the measured step "
                    "times (autopar/measure/calibrate.py: the one fitter, bounded, mean |error| by default) and, with --out, write the calibrated hardware file.")
    p.add_argument("--model", required=True, help="model zoo name or file (a small one: it really runs)")
    p.add_argument("--hardware", required=True, help="hardware zoo name or file (e.g. from 'autopar profile hardware')")
    p.add_argument("--training", type=Path, default=None, help="TrainingSpec YAML (default: TrainingSpec defaults "
                   "with the overrides below)")
    p.add_argument("--seq-len", type=int, default=None, help="override training seq_len")
    p.add_argument("--global-batch", type=int, default=None, help="override training global_batch")
    p.add_argument("--precision", default=None, help="override training precision")
    p.add_argument("--overlap", type=overlap_set, default=None, metavar="none|tp,dp,ep,cp",
                   help="communication the predictions count as overlapped (default: the training's switches)")
    p.add_argument("--world", type=int, default=2, help="processes (GPUs) to run on (default 2)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--layouts", default=None, help="'tp=2,pp=1;tp=1,pp=2,mbs=2;...' (';' between layouts)")
    src.add_argument("--layouts-file", type=Path, default=None, help="JSON/YAML list of layouts")
    src.add_argument("--from-solve", type=int, default=None, metavar="K",
                     help="the solver's top K layouts (needs the search)")
    p.add_argument("--steps", type=int, default=4, help="training steps per layout (default 4)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per layout run (default 600)")
    p.add_argument("--repeats", type=int, default=1, help="run the list this many times in alternating order and "
                   "keep each layout's fastest run (for shared machines; default 1)")
    p.add_argument("--out", type=Path, default=None, help="write the calibrated hardware file here (never "
                   "overwritten without --force)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--no-fit", action="store_true", help="only compare; do not fit")
    p.add_argument("--loss", choices=("mae", "log"), default="mae",
                   help="fit loss: mean |relative error| of step time (default) or squared log error")
    p.add_argument("--json", type=Path, default=None, help="also write the rows and the fit as JSON here")
    p.set_defaults(func=_cmd_compare)
    return p


def _training(args: argparse.Namespace) -> TrainingSpec:
    from autopar.specs.loaders import build_spec, read_structured_file
    data: dict[str, Any] = {}
    if args.training is not None:
        if not args.training.exists():
            raise AutoparInputError(f"training file not found: {args.training}")
        data = read_structured_file(args.training) or {}
        if not isinstance(data, dict):
            raise AutoparInputError(f"{args.training}: expected a mapping of TrainingSpec fields")
    for key, val in (("seq_len", args.seq_len), ("global_batch", args.global_batch), ("precision", args.precision)):
        if val is not None:
            data[key] = val
    data.update(overlap_fields(args))
    return build_spec(TrainingSpec, data, str(args.training or "training"))


def _cmd_compare(args: argparse.Namespace) -> int:
    from autopar.measure.compare import (calibrate, compare_layouts, format_comparison, layouts_from_solve,
                                         load_layouts_file, parse_layouts)
    from autopar.measure.hwfile import write_new_file
    from autopar.specs.loaders import load_hardware, load_model
    json_out = OutputFile(args.json, "--json", overwrite=args.force) if args.json is not None else None
    if args.out is not None:
        OutputFile(args.out, "--out", overwrite=args.force)   # checked again when written
    if args.no_fit and args.out is not None:
        raise AutoparInputError("--out writes the fitted hardware file; it cannot go with --no-fit")
    model = load_model(args.model)
    hardware = load_hardware(args.hardware)
    training = _training(args)
    if args.layouts is not None:
        layouts = parse_layouts(args.layouts)
    elif args.layouts_file is not None:
        layouts = load_layouts_file(args.layouts_file)
    else:
        if args.from_solve < 1:
            raise AutoparInputError(f"--from-solve K needs K >= 1 (got {args.from_solve})")
        layouts = layouts_from_solve(model, hardware, training, args.world, args.from_solve)
    rows = compare_layouts(model, hardware, training, layouts, world=args.world, steps=args.steps,
                           timeout_s=args.timeout, repeats=args.repeats)
    ok = [r for r in rows if r.ok and r.measured]
    report = None
    after = loo = None
    if not args.no_fit and len(ok) >= 2:
        fitted, report, loo = calibrate(hardware, rows, loss=args.loss)
        after = report.predicted_after
    print(format_comparison(rows, after, loo))
    if report is not None:
        print()
        print(report.format())
    elif not args.no_fit:
        print(f"no fit: {len(ok)} layout(s) ran successfully, a fit needs at least 2", file=sys.stderr)
    if args.json is not None:
        doc = {"rows": [r.to_dict() for r in rows],
               "fit": None if report is None else {
                   "loss": report.loss,
                   "constants": {c.name: {"before": c.before, "after": c.after, "sd": c.sd, "lo": c.bound.lo,
                                          "hi": c.bound.hi, "pinned": c.pinned} for c in report.constants},
                   "not_identifiable": report.not_identifiable, "tau_before": report.tau_before,
                   "tau_after": report.tau_after, "mae_before": report.mae_before, "mae_after": report.mae_after,
                   "loo_predicted": loo, "notes": report.notes}}
        json_out.write(json.dumps(doc, indent=1))
    if args.out is not None:
        if report is None:
            print("autopar: nothing written: no fit", file=sys.stderr)
            return 1
        header = "\n".join(
            [f"# Calibrated by 'autopar profile compare' from {args.hardware} on {len(ok)} layouts of {model.name} "
             f"({args.world} processes, seq_len {training.seq_len}, global_batch {training.global_batch})."]
            + [f"#   {c.name}: {c.before:.4g} -> {c.after:.4g} (bounds [{c.bound.lo:g}, {c.bound.hi:g}]"
               + (f", PINNED at its {c.pinned} bound)" if c.pinned else ")") for c in report.constants]
            + [f"#   step-time mean |error| {report.mae_before:.1%} -> {report.mae_after:.1%}; Kendall tau-b "
               f"{report.tau_before:+.3f} -> {report.tau_after:+.3f}"])
        write_new_file(fitted, args.out, header, force=args.force)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0 if ok else 1
