"""``autopar profile compare``: run layouts for real, set predicted against measured, calibrate.

For each layout: the cost model's prediction (``autopar.cost.estimate``: step time, per-GPU memory) and a
real run (``autopar.run.launch.run_layout``: median step time, peak memory per rank), side by side with
the relative error. Then the hardware file's efficiency constants are fitted to the measured step times
(:func:`autopar.profile.calibrate.fit_efficiency`) and, with ``--out``, written to a new hardware file, so the
next ``autopar solve`` on that file is calibrated. Rank agreement is Kendall's tau-b between predicted and
measured step times, before and after the fit, and out of sample (leave-one-out) when there are enough layouts.

Layouts come from ``--layouts "tp=2,pp=1;tp=1,pp=2,mbs=2"``, a JSON/YAML file (a list of mappings of Layout
fields), or ``--from-solve K`` (the solver's top K, when the search is available).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from autopar.errors import AutoparInputError
from autopar.profile.calibrate import FitReport, fit_efficiency, kendall_tau, leave_one_out
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import Layout, check_layout, resolve_layout
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

__all__ = ["ComparisonRow", "compare_layouts", "fit_efficiency", "format_comparison", "kendall_tau",
           "parse_layouts", "register_compare"]

# Short names accepted in --layouts, mapped to Layout fields.
_ALIASES = {"mbs": "micro_batch", "mb": "micro_batch", "ga": "grad_accum", "zero": "zero_stage", "z": "zero_stage",
            "sp": "sequence_parallel", "rc": "recompute", "remat": "recompute", "hsdp": "hsdp_shard"}
_BOOLS = {"true": True, "on": True, "yes": True, "1": True, "false": False, "off": False, "no": False, "0": False}


@dataclass
class ComparisonRow:
    """One layout: prediction, measurement and their relative errors (predicted / measured - 1)."""

    label: str
    layout: Layout                       # resolved (dp, grad_accum, stage_layers filled in)
    model: ModelSpec
    training: TrainingSpec
    gpus: int
    predicted_step_s: float | None = None
    predicted_mem_gib: float | None = None  # per-GPU memory without the reserve (what the runner can see)
    measured_step_s: float | None = None
    measured_mem_gib: float | None = None  # the fullest rank
    ok: bool = False
    failure: str = ""
    estimate: Any = None                 # autopar.cost.Estimate
    run: Any = None                      # autopar.run.launch.RunResult
    notes: list[str] = field(default_factory=list)

    @property
    def step_err(self) -> float | None:
        if self.predicted_step_s is None or not self.measured_step_s:
            return None
        return self.predicted_step_s / self.measured_step_s - 1.0

    @property
    def mem_err(self) -> float | None:
        if self.predicted_mem_gib is None or not self.measured_mem_gib:
            return None
        return self.predicted_mem_gib / self.measured_mem_gib - 1.0

    def to_dict(self) -> dict:
        return {"label": self.label, "layout": self.layout.model_dump(mode="json"), "gpus": self.gpus,
                "predicted_step_s": self.predicted_step_s, "measured_step_s": self.measured_step_s,
                "step_err": self.step_err, "predicted_mem_gib": self.predicted_mem_gib,
                "measured_mem_gib": self.measured_mem_gib, "mem_err": self.mem_err, "ok": self.ok,
                "failure": self.failure,
                "predicted_time_s": self.estimate.time_s.to_dict() if self.estimate is not None else None,
                "measured_tokens_per_s": getattr(self.run, "tokens_per_s", None), "notes": self.notes}


# ---- layouts ---------------------------------------------------------------------------------------------
def _value(key: str, text: str) -> Any:
    t = text.strip()
    if key == "recompute":
        return t.replace("+", ",")  # 'recompute=mlp+layernorm': a module list inside the comma-separated spec
    if key in ("sequence_parallel", "fsdp"):
        if t.lower() not in _BOOLS:
            raise AutoparInputError(f"layout field {key}: expected true/false, got '{text}'")
        return _BOOLS[t.lower()]
    if key == "stage_layers":
        return [int(x) for x in t.replace("/", " ").split()]
    try:
        return int(t)
    except ValueError:
        raise AutoparInputError(f"layout field {key}: expected an integer, got '{text}'") from None


def _layout(data: Any, where: str) -> Layout:
    from autopar.specs.loaders import build_spec
    if isinstance(data, dict):
        data = {_ALIASES.get(k, k): v for k, v in data.items()}
    return build_spec(Layout, data, where)


def parse_layouts(text: str) -> list[Layout]:
    """Layouts from 'tp=2,pp=1;tp=1,pp=2,mbs=2': ';' between layouts, ',' between fields. Short names: mbs,
    ga, zero, sp, rc (recompute modules joined with '+'), hsdp; stage_layers as '6/10'."""
    layouts = []
    for i, chunk in enumerate(c for c in text.split(";") if c.strip()):
        data: dict[str, Any] = {}
        for part in (p for p in chunk.split(",") if p.strip()):
            if "=" not in part:
                raise AutoparInputError(f"--layouts: layout {i + 1}: '{part.strip()}' is not key=value")
            k, v = part.split("=", 1)
            key = _ALIASES.get(k.strip().lower(), k.strip().lower())
            if key not in Layout.model_fields:
                raise AutoparInputError(f"--layouts: layout {i + 1}: unknown field '{k.strip()}' (Layout fields: "
                                        f"{', '.join(Layout.model_fields)}; short names: {', '.join(_ALIASES)})")
            data[key] = _value(key, v)
        layouts.append(_layout(data, f"--layouts: layout {i + 1}"))
    if not layouts:
        raise AutoparInputError("--layouts: no layout given")
    return layouts


def load_layouts_file(path: Path) -> list[Layout]:
    """Layouts from a JSON or YAML file: a list of mappings, or a mapping with a 'layouts' list."""
    from autopar.specs.loaders import read_structured_file
    if not path.exists():
        raise AutoparInputError(f"layouts file not found: {path}")
    data = read_structured_file(path)
    if isinstance(data, dict) and "layouts" in data:
        data = data["layouts"]
    if not isinstance(data, list) or not data:
        raise AutoparInputError(f"{path}: expected a non-empty list of layouts (mappings of Layout fields)")
    return [_layout(d.get("layout", d) if isinstance(d, dict) else d, f"{path}: layout {i + 1}")
            for i, d in enumerate(data)]


def layouts_from_solve(model: ModelSpec, hardware: HardwareSpec, training: TrainingSpec, gpus: int,
                       k: int) -> list[Layout]:
    """The solver's top ``k`` layouts (``autopar.solve`` with ``SearchOptions(top_k=k)``), best first."""
    import importlib.util
    if importlib.util.find_spec("autopar.search") is None:
        raise AutoparInputError("--from-solve needs the search (autopar.search), which is not installed here; "
                                "give --layouts instead")
    from autopar.search import SearchOptions, solve
    result = solve(model, hardware, training, gpus, SearchOptions(top_k=k), with_heuristic=False)
    out = [p.layout for p in result.plans[:k]]
    if not out:
        raise AutoparInputError(f"--from-solve: the solver found no layout of {model.name} that fits {gpus} "
                                f"GPUs of {hardware.name}")
    return out


# ---- compare ---------------------------------------------------------------------------------------------
def _default_runner() -> Callable[..., Any]:
    try:
        from autopar.run.launch import run_layout
    except ImportError as err:
        raise AutoparInputError(f"the real runner (autopar.run.launch.run_layout) is not available: {err}") from None
    return run_layout


def _default_estimator() -> Callable[..., Any]:
    from autopar.profile.calibrate import _default_estimator as d
    return d()


def compare_layouts(model: ModelSpec, hardware: HardwareSpec, training: TrainingSpec, layouts: Sequence[Layout], *,
                    world: int, steps: int, timeout_s: float, repeats: int = 1,
                    estimator: Callable[..., Any] | None = None, runner: Callable[..., Any] | None = None,
                    progress: Callable[[str], None] | None = None) -> list[ComparisonRow]:
    """Predict and run each layout on ``world`` processes; one row per layout, in the given order.

    Every layout is validated before anything runs (AutoparInputError listing the broken rules). A run that
    fails (out of memory, timeout, crash) gives a row with ``ok=False`` and its failure; the others go on.
    ``repeats`` > 1 runs the whole list that many times, alternating the order (forward, backward, ...), and
    keeps each layout's fastest run: on a shared machine, load that comes and goes then hits every layout
    alike instead of whichever happened to run during it."""
    if world < 1:
        raise AutoparInputError(f"world must be at least 1 (got {world})")
    if steps < 1:
        raise AutoparInputError(f"steps must be at least 1 (got {steps})")
    if repeats < 1:
        raise AutoparInputError(f"repeats must be at least 1 (got {repeats})")
    if not layouts:
        raise AutoparInputError("no layouts to compare")
    say = progress or (lambda m: print(m, file=sys.stderr, flush=True))
    resolved = []
    for i, lay in enumerate(layouts):
        problems = check_layout(lay, model, training, world, hardware)
        if problems:
            raise AutoparInputError(f"layout {i + 1} ({_label(lay)}) is invalid on {world} processes: "
                                    + "; ".join(problems))
        resolved.append(resolve_layout(lay, model, training, world, hardware))
    est = estimator or _default_estimator()
    run = runner or _default_runner()
    rows = []
    for lay in resolved:
        row = ComparisonRow(label=lay.short(), layout=lay, model=model, training=training, gpus=world)
        e = est(model, hardware, training, lay, world)
        # Memory is compared without the reserve: the runner measures what the training allocates (CUDA
        # max_memory_allocated; on CPU the peak-RSS growth after process-group init), not the context.
        row.estimate, row.predicted_step_s = e, e.step_time_s
        row.predicted_mem_gib = e.memory_gib.total - e.memory_gib.reserve
        rows.append(row)
    n = len(rows)
    for rep in range(repeats):
        order = range(n) if rep % 2 == 0 else range(n - 1, -1, -1)
        for i in order:
            row = rows[i]
            tag = f"[{i + 1}/{n}" + (f", round {rep + 1}/{repeats}]" if repeats > 1 else "]")
            say(f"{tag} {row.label}: predicted {row.predicted_step_s:.4g} s; running {steps} steps ...")
            res = run(model, row.layout, training, world=world, steps=steps, timeout_s=timeout_s)
            if not res.ok:
                say(f"    failed: {res.failure}")
                if row.run is None:
                    row.run, row.failure = res, res.failure or "failed"
                continue
            t = float(res.step_time_s)
            say(f"    measured {t:.4g} s ({row.predicted_step_s / t - 1:+.0%})")
            if row.measured_step_s is None or t < row.measured_step_s:
                mems = [m for m in (res.peak_mem_gib or []) if m is not None]
                row.run, row.ok, row.failure = res, True, ""
                row.measured_step_s = t
                row.measured_mem_gib = float(max(mems)) if mems else None
    for row in rows:
        applied = getattr(row.run, "applied", None)
        if row.ok and applied:
            row.notes.append(f"applied: {applied}")
    dtypes = {str(r.run.applied.get("dtype")) for r in rows if r.ok and isinstance(getattr(r.run, "applied", None), dict)}
    if "fp32" in dtypes and (training.weight_dtype, training.activation_dtype) != ("fp32", "fp32"):
        say("note: the runs computed in fp32 (the CPU runner) but the training spec stores "
            f"{training.weight_dtype} weights and {training.activation_dtype} activations: predicted memory and "
            "communication bytes follow the spec (set weight_dtype/activation_dtype fp32 and "
            "master_weights_dtype none to match the runs)")
    return rows


def _label(lay: Layout) -> str:
    return ",".join(f"{k}={v}" for k, v in lay.model_dump(exclude_defaults=True).items()) or "defaults"


def _fmt(v: float | None, spec: str) -> str:
    return format(v, spec) if v is not None and math.isfinite(v) else "-"


def format_comparison(rows: Sequence[ComparisonRow], predicted_after: Sequence[float] | None = None,
                      loo: Sequence[float] | None = None) -> str:
    """The predicted-vs-measured table; with a fit, the calibrated prediction and its error as extra columns.
    Memory: the fullest rank, predicted without the hardware's reserve (the runner measures allocations)."""
    w = max([len(r.label) for r in rows] + [6])
    head = (f"{'#':>2} {'layout':<{w}} {'pred s':>9} {'meas s':>9} {'err':>7} {'pred GiB':>9} {'meas GiB':>9} "
            f"{'err':>7}")
    if predicted_after is not None:
        head += f" {'fit s':>9} {'err':>7}"
    if loo is not None:
        head += f" {'LOO s':>9} {'err':>7}"
    lines = [head]
    ok = [r for r in rows if r.ok and r.measured_step_s]
    after = dict(zip((id(r) for r in ok), predicted_after or []))
    loo_d = dict(zip((id(r) for r in ok), loo or []))
    for i, r in enumerate(rows, 1):
        line = (f"{i:>2} {r.label:<{w}} {_fmt(r.predicted_step_s, '9.4g')} {_fmt(r.measured_step_s, '9.4g')} "
                f"{_fmt(r.step_err, '+7.1%')} {_fmt(r.predicted_mem_gib, '9.3f')} {_fmt(r.measured_mem_gib, '9.3f')} "
                f"{_fmt(r.mem_err, '+7.1%')}")
        for extra, on in ((after, predicted_after is not None), (loo_d, loo is not None)):
            if on:
                v = extra.get(id(r))
                err = v / r.measured_step_s - 1 if v is not None and r.measured_step_s else None
                line += f" {_fmt(v, '9.4g')} {_fmt(err, '+7.1%')}"
        if not r.ok:
            line += f"  FAILED: {r.failure}"
        lines.append(line)
    if ok:
        mem = [abs(r.mem_err) for r in ok if r.mem_err is not None]
        step = [abs(r.step_err) for r in ok if r.step_err is not None]
        lines.append(f"step time |err| mean {sum(step) / len(step):.1%} max {max(step):.1%}"
                     + (f"; memory |err| mean {sum(mem) / len(mem):.1%} max {max(mem):.1%}" if mem else ""))
        if len(ok) >= 2:
            tau = kendall_tau([r.predicted_step_s for r in ok], [r.measured_step_s for r in ok])
            lines.append(f"Kendall tau-b, predicted vs measured step time ({len(ok)} layouts): {tau:+.3f}")
    return "\n".join(lines)


def calibrate(hardware: HardwareSpec, rows: Sequence[ComparisonRow], *, loo: bool = True,
              estimator: Callable[..., Any] | None = None) -> tuple[HardwareSpec, FitReport, list[float] | None]:
    """Fit the constants to the successful rows; with ``loo`` and at least 4 rows, also the leave-one-out
    predictions (each row predicted by constants fitted without it) and their tau in the report's notes."""
    ok = [r for r in rows if r.ok and r.measured_step_s]
    hw, rep = fit_efficiency(hardware, ok, estimator=estimator)
    out_of_sample = None
    if loo and len(ok) >= 4:
        out_of_sample = leave_one_out(hardware, ok, estimator=estimator)
        tau = kendall_tau(out_of_sample, [r.measured_step_s for r in ok])
        rep.notes.append(f"leave-one-out (each layout predicted by constants fitted to the others): "
                         f"Kendall tau-b {tau:+.3f}")
    return hw, rep, out_of_sample


# ---- CLI ------------------------------------------------------------------------------------------------
def register_compare(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``compare`` to the ``autopar profile`` subparsers."""
    p = subparsers.add_parser(
        "compare", help="run layouts for real, compare with the cost model, fit the hardware's efficiency constants",
        description="Run each layout with real processes, print predicted vs measured step time and memory, fit "
                    "the hardware file's efficiency constants (GEMM, collectives, overlaps) to the measured step "
                    "times by bounded least squares and, with --out, write the calibrated hardware file.")
    p.add_argument("--model", required=True, help="model zoo name or file (a small one: it really runs)")
    p.add_argument("--hardware", required=True, help="hardware zoo name or file (e.g. from 'autopar profile hardware')")
    p.add_argument("--training", type=Path, default=None, help="TrainingSpec YAML (default: TrainingSpec defaults "
                   "with the overrides below)")
    p.add_argument("--seq-len", type=int, default=None, help="override training seq_len")
    p.add_argument("--global-batch", type=int, default=None, help="override training global_batch")
    p.add_argument("--precision", default=None, help="override training precision")
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
    return build_spec(TrainingSpec, data, str(args.training or "training"))


def _cmd_compare(args: argparse.Namespace) -> int:
    from autopar.profile.hardware import write_new_file
    from autopar.specs.loaders import load_hardware, load_model
    for path in (args.out, args.json):
        if path is not None and path.exists() and not args.force:
            raise AutoparInputError(f"{path} exists; pass --force to overwrite it (or choose another path)")
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
    ok = [r for r in rows if r.ok and r.measured_step_s]
    report = None
    after = loo = None
    if not args.no_fit and len(ok) >= 2:
        fitted, report, loo = calibrate(hardware, rows)
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
                   "constants": {k: {"before": b, "after": a, "sd": report.sd.get(k)}
                                 for k, (b, a) in report.constants.items()},
                   "not_identifiable": report.not_identifiable, "tau_before": report.tau_before,
                   "tau_after": report.tau_after, "rms_log_err_before": report.rms_log_err_before,
                   "rms_log_err_after": report.rms_log_err_after, "loo_predicted": loo, "notes": report.notes}}
        args.json.write_text(json.dumps(doc, indent=1))
    if args.out is not None:
        if report is None:
            print("autopar: nothing written: no fit", file=sys.stderr)
            return 1
        header = "\n".join(
            [f"# Calibrated by 'autopar profile compare' from {args.hardware} on {len(ok)} layouts of {model.name} "
             f"({args.world} processes, seq_len {training.seq_len}, global_batch {training.global_batch})."]
            + [f"#   {k}: {b:.4g} -> {a:.4g}" for k, (b, a) in report.constants.items()]
            + [f"#   step-time rms error {math.expm1(report.rms_log_err_before):.1%} -> "
               f"{math.expm1(report.rms_log_err_after):.1%}; Kendall tau-b {report.tau_before:+.3f} -> "
               f"{report.tau_after:+.3f}"])
        write_new_file(fitted, args.out, header, force=args.force)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0 if ok else 1
