"""``autopar profile compare``: run layouts for real, set predicted against measured, calibrate.

For each layout: the cost model's prediction (``autopar.cost.estimate``: step time, per-GPU memory) and a
real run (``autopar.run.launch.run_layout``: median step time, peak memory per rank), side by side with
the relative error. Then the hardware file's efficiency constants are fitted to the measured step times
(:func:`autopar.measure.calibrate.fit_efficiency`) and, with ``--out``, written to a new hardware file, so the
next ``autopar solve`` on that file is calibrated. Rank agreement is Kendall's tau-b between predicted and
measured step times, before and after the fit, and out of sample (leave-one-out) when there are enough layouts.

Layouts come from ``--layouts "tp=2,pp=1;tp=1,pp=2,mbs=2"``, a JSON/YAML file (a list of mappings of Layout
fields), or ``--from-solve K`` (the solver's top K, when the search is available).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from autopar.errors import AutoparInputError
from autopar.measure.calibrate import FitReport, default_estimator, fit_efficiency, leave_one_out
from autopar.measure.record import Comparison, max_abs_error, mean_abs_error, rank_agreement, relative_error
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import Layout, check_layout, resolve_layout
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

__all__ = ["ComparisonRow", "compare_layouts", "fit_efficiency", "format_comparison", "parse_layouts"]

# Short names accepted in --layouts, mapped to Layout fields.
_ALIASES = {"mbs": "micro_batch", "mb": "micro_batch", "ga": "grad_accum", "zero": "zero_stage", "z": "zero_stage",
            "sp": "sequence_parallel", "rc": "recompute", "remat": "recompute", "hsdp": "hsdp_shard"}
_BOOLS = {"true": True, "on": True, "yes": True, "1": True, "false": False, "off": False, "no": False, "0": False}


@dataclass(kw_only=True)
class ComparisonRow(Comparison):
    """One layout run for real: the :class:`Comparison` of predicted and measured seconds per step and per-GPU
    memory (predicted without the reserve: what the runner can see; measured: the fullest rank)."""

    layout: Layout                       # resolved (dp, grad_accum, stage_layers filled in)
    model: ModelSpec
    training: TrainingSpec
    gpus: int
    ok: bool = False
    failure: str = ""
    estimate: Any = None                 # autopar.cost.Estimate
    run: Any = None                      # autopar.run.launch.RunResult
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"label": self.label, "layout": self.layout.model_dump(mode="json"), "gpus": self.gpus,
                "predicted_step_s": self.predicted, "measured_step_s": self.measured,
                "step_err": self.error, "predicted_mem_gib": self.predicted_mem_gib,
                "measured_mem_gib": self.measured_mem_gib, "mem_err": self.mem_error, "ok": self.ok,
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
        from autopar.run import run_layout
    except ImportError as err:
        raise AutoparInputError(f"the real runner (autopar.run.run_layout) is not available: {err}") from None
    return run_layout


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
    from autopar.run import runner_training
    training = runner_training(training, model)      # predictions of what the runner runs (its linear-layer CP)
    resolved = []
    for i, lay in enumerate(layouts):
        problems = check_layout(lay, model, training, world, hardware)
        if problems:
            raise AutoparInputError(f"layout {i + 1} ({_label(lay)}) is invalid on {world} processes: "
                                    + "; ".join(problems))
        resolved.append(resolve_layout(lay, model, training, world, hardware))
    est = estimator or default_estimator()
    run = runner or _default_runner()
    rows = []
    for lay in resolved:
        e = est(model, hardware, training, lay, world)
        # Memory is compared without the reserve: the runner measures what the training allocates (CUDA
        # max_memory_allocated; on CPU the peak-RSS growth after process-group init), not the context.
        row = ComparisonRow(label=lay.short(), layout=lay, model=model, training=training, gpus=world, estimate=e,
                            predicted=e.step_time_s, fits=e.fits,
                            predicted_mem_gib=e.memory_gib.total - e.memory_gib.reserve)
        rows.append(row)
    n = len(rows)
    for rep in range(repeats):
        order = range(n) if rep % 2 == 0 else range(n - 1, -1, -1)
        for i in order:
            row = rows[i]
            tag = f"[{i + 1}/{n}" + (f", round {rep + 1}/{repeats}]" if repeats > 1 else "]")
            say(f"{tag} {row.label}: predicted {row.predicted:.4g} s; running {steps} steps ...")
            res = run(model, row.layout, training, world=world, steps=steps, timeout_s=timeout_s)
            if not res.ok:
                say(f"    failed: {res.failure}")
                if row.run is None:
                    row.run, row.failure = res, res.failure or "failed"
                continue
            t = float(res.step_time_s)
            say(f"    measured {t:.4g} s ({row.predicted / t - 1:+.0%})")
            if row.measured is None or t < row.measured:
                mems = [m for m in (res.peak_mem_gib or []) if m is not None]
                row.run, row.ok, row.failure = res, True, ""
                row.measured = t
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
    ok = [r for r in rows if r.ok and r.measured]
    after = dict(zip((id(r) for r in ok), predicted_after or []))
    loo_d = dict(zip((id(r) for r in ok), loo or []))
    for i, r in enumerate(rows, 1):
        line = (f"{i:>2} {r.label:<{w}} {_fmt(r.predicted, '9.4g')} {_fmt(r.measured, '9.4g')} "
                f"{_fmt(r.error, '+7.1%')} {_fmt(r.predicted_mem_gib, '9.3f')} {_fmt(r.measured_mem_gib, '9.3f')} "
                f"{_fmt(r.mem_error, '+7.1%')}")
        for extra, on in ((after, predicted_after is not None), (loo_d, loo is not None)):
            if on:
                v = extra.get(id(r))
                err = relative_error(v, r.measured)
                line += f" {_fmt(v, '9.4g')} {_fmt(err, '+7.1%')}"
        if not r.ok:
            line += f"  FAILED: {r.failure}"
        lines.append(line)
    if ok:
        mem = [Comparison(label=r.label, predicted=r.predicted_mem_gib, measured=r.measured_mem_gib) for r in ok]
        lines.append(f"step time |err| mean {mean_abs_error(ok):.1%} max {max_abs_error(ok):.1%}"
                     + (f"; memory |err| mean {mean_abs_error(mem):.1%} max {max_abs_error(mem):.1%}"
                        if any(m.error is not None for m in mem) else ""))
        if len(ok) >= 2:
            tau = rank_agreement([r.predicted for r in ok], [r.measured for r in ok])
            lines.append(f"Kendall tau-b, predicted vs measured step time ({len(ok)} layouts): {tau:+.3f}")
    return "\n".join(lines)


def calibrate(hardware: HardwareSpec, rows: Sequence[ComparisonRow], *, loo: bool = True, loss: str = "mae",
              estimator: Callable[..., Any] | None = None) -> tuple[HardwareSpec, FitReport, list[float] | None]:
    """Fit the constants to the successful rows; with ``loo`` and at least 4 rows, also the leave-one-out
    predictions (each row predicted by constants fitted without it) and their tau in the report's notes."""
    ok = [r for r in rows if r.ok and r.measured]
    hw, rep = fit_efficiency(hardware, ok, estimator=estimator, loss=loss)
    out_of_sample = None
    if loo and len(ok) >= 4:
        out_of_sample = leave_one_out(hardware, ok, estimator=estimator, loss=loss)
        tau = rank_agreement(out_of_sample, [r.measured for r in ok])
        rep.notes.append(f"leave-one-out (each layout predicted by constants fitted to the others): "
                         f"Kendall tau-b {tau:+.3f}")
    return hw, rep, out_of_sample
