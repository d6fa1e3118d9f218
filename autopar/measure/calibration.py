"""``autopar validate --fit``: the published runs as rows of the one fitter (:mod:`autopar.measure.calibrate`).

Kernel speeds (GEMM by shape, flash attention, grouped GEMM, memory-bound bandwidth) and link bandwidths are
measured or published figures in ``hardware/*.yaml`` (``kernel_model``) and are NOT fitted. What is fitted is
data, declared on each constant's hardware-file field (its ``FitBound`` in :mod:`autopar.specs.hardware`: bounds,
why, and ``"runs"`` among the fits that move it), today shared by every chip and run (nothing per chip, precision
or row). How much TP/DP/EP/CP communication hides is not fitted: the cost model prices it from the
schedule's compute window (autopar.cost.tp, dp, ep, cp).

  * ``layer_overhead_us``: time per layer and micro-batch that no kernel accounts for (launch gaps, host work);
  * ``moe_dropless_imbalance``: busiest expert rank / mean under dropless routing (a property of the trained
    router at that point of training, not of the hardware).

``PER_CHIP`` (empty today) lists fields to fit per (chip, precision) present in the data; a (chip, precision)
seen in only one row is tied to its closest sibling (``TIES``) so that no constant is fitted to a single run.
Bounds (those ``FitBound`` declarations, as :data:`autopar.measure.calibrate.BOUNDS`, each with its reason), loss
(mean |predicted / measured − 1| of tokens/s/GPU, the figure ``autopar validate`` reports) and solver are the
fitter's; any constant that ends at a bound is reported, a finding about the model, not a result. Honesty check
(``--cv``): leave one source out (Megatron 2021, Megatron-Core, Llama 3, NeMo, Megatron-MoE): refit without the
source and predict its rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from autopar.cost import Estimator
from autopar.measure.calibrate import (Constant, FitReport, FitRow, HeldOut, cross_validate, fitted_by,
                                      section_of, fit as fit_rows)
from autopar.specs.hardware import Efficiency, HardwareSpec
from autopar.specs.stack import STACK_CONSTANTS
from autopar.measure.validation import Case

PER_CHIP: tuple[str, ...] = ()
SHARED: tuple[str, ...] = fitted_by("runs")   # the FitBounds of specs/hardware.py with "runs" in fitted_by
TIES = {("gb300_nvl72", "mxfp8"): ("gb200_nvl72", "mxfp8")}
# Per software stack (autopar/specs/stack.py), for every stack other than BASE_STACK that has rows: only what no
# measurement of a kernel or a link sees, the time per layer a framework spends between kernels (eager Python, FSDP2
# hooks, launches; Efficiency.layer_overhead_us, bounded there). Fitted to that stack's rows only; the result goes
# into the stack file's ``efficiency``. Overlap is priced from its window (the stack's knobs set the switches) and
# kernel rates are the hardware files' measured figures: neither is fitted per stack.
BASE_STACK = "megatron_core"
PER_STACK: tuple[str, ...] = STACK_CONSTANTS
INHERIT = {"h200": "h100_sxm", "h100_grand_teton": "h100_sxm", "b200": "gb200_nvl72", "b300": "gb200_nvl72",
           "gb300_nvl72": "gb200_nvl72"}


def rows_from_cases(cases: list[Case]) -> list[FitRow]:
    """One fit row per published run: predicted tokens/s/GPU on the given hardware (the model profile is built
    once per row and reused); grouped by source (the row id's prefix)."""
    rows = []
    for c in cases:
        est = Estimator(c.model, c.hardware, c.training, c.gpus)
        rows.append(FitRow(label=c.row_id, hardware=c.hardware, measured=c.measured_tokens,
                           group=source_of(c), stack=c.stack,
                           predict=lambda hw, est=est, c=c: est.with_hardware(hw).estimate(
                               c.layout, resolved=True).tokens_per_s_per_gpu))
    return rows


def constants_for(cases: list[Case], per_chip: tuple[str, ...] = PER_CHIP,
                  shared: tuple[str, ...] = SHARED) -> list[Constant]:
    """The constants the published runs can fit: per (chip, precision) for ``per_chip`` fields (tied chips
    share one), and the ``shared`` fields."""
    keys: dict[tuple[str, str], list[str]] = {}
    for c in cases:
        own = (c.hardware.name, c.training.precision)
        chips = keys.setdefault(TIES.get(own, own), [TIES.get(own, own)[0]])
        if own[0] not in chips:
            chips.append(own[0])
    stacks = sorted({c.stack for c in cases} - {BASE_STACK})
    return ([Constant(f, prec, tuple(keys[chip, prec])) for f in per_chip for chip, prec in sorted(keys)]
            + [Constant(f) for f in shared]
            + [Constant(f, stack=st) for st in stacks for f in PER_STACK])


def fit(cases: list[Case], loss: str = "mae", progress: Callable[[str], None] | None = None) -> FitReport:
    """Fit :func:`constants_for` to every case."""
    if progress:
        progress(f"fitting {len(constants_for(cases))} constants to {len(cases)} published runs")
    return fit_rows(rows_from_cases(cases), constants_for(cases), loss=loss)


def cross_validate_sources(cases: list[Case], loss: str = "mae",
                           progress: Callable[[str], None] | None = None) -> HeldOut:
    """Each source's rows predicted by constants fitted to the other sources."""
    return cross_validate(rows_from_cases(cases), constants_for(cases), loss=loss, progress=progress)


def source_of(case: Case) -> str:
    return case.row_id.split("-")[0]


def efficiency_for(report: FitReport, hw: HardwareSpec) -> Efficiency:
    """The ``efficiency`` section of ``hw`` after the fit: the shared constants, its own per-chip ones, else its
    silicon sibling's (``INHERIT``). Fitted kernel_model constants are not part of this section."""
    fitted = {c: v for c, v in report.values.items()
              if c.name in {fc.name for fc in report.constants} and section_of(c.field) == "efficiency"}
    eff = hw.efficiency.model_dump()
    own = {(c.field, c.key) for c in fitted if c.chips and hw.name in c.chips}
    for c, v in fitted.items():
        if c.stack:             # a stack's own constant lives in its stack file (stack_efficiency)
            continue
        mine = not c.chips or hw.name in c.chips
        inherited = c.chips and INHERIT.get(hw.name) in c.chips and (c.field, c.key) not in own
        if mine or inherited:
            eff[c.field] = v if c.key is None else {**eff[c.field], c.key: v}
    return Efficiency.model_validate(eff)


def stack_efficiency(report: FitReport, stack: str) -> dict[str, float]:
    """The constants fitted to one stack's rows (empty for the base stack: its constants are the hardware files')."""
    fitted = {fc.name for fc in report.constants}
    return {c.field: float(f"{v:.4g}") for c, v in report.values.items() if c.stack == stack and c.name in fitted}


_BEGIN = "# --- calibrated efficiency (autopar validate --fit --write) ---"


def has_calibrated_block(path: Path) -> bool:
    """Whether a hardware YAML carries a block written by :func:`write_efficiency` (only those are refreshed: a
    file without one keeps the defaults its author chose)."""
    return _BEGIN in path.read_text()


def write_efficiency(path: Path, eff: Efficiency, note: str) -> None:
    """Replace (or append) the calibrated ``efficiency:`` block of a hardware YAML, keeping its comments."""
    import yaml
    text = path.read_text()
    if _BEGIN in text:
        text = text[:text.index(_BEGIN)].rstrip() + "\n"
    elif "\nefficiency:" in text:
        raise ValueError(f"{path}: has a hand-written efficiency section; not overwriting it")
    # Four significant digits: every fitted constant's standard error is far larger than the fifth.
    values = {k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in eff.model_dump(mode="json").items()}
    block = yaml.safe_dump({"efficiency": values}, sort_keys=False)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{text}\n{_BEGIN}\n# {note}\n{block}")
    tmp.replace(path)


_STACK_BEGIN = "# --- fitted stack constants (autopar validate --fit --write) ---"


def write_stack_efficiency(path: Path, values: dict[str, float], note: str) -> None:
    """Replace (or append) the fitted ``efficiency:`` block of a stack YAML, keeping everything above it."""
    import yaml
    text = path.read_text()
    if _STACK_BEGIN in text:
        text = text[:text.index(_STACK_BEGIN)].rstrip() + "\n"
    elif "\nefficiency:" in text:
        raise ValueError(f"{path}: has a hand-written efficiency section; not overwriting it")
    block = yaml.safe_dump({"efficiency": values, "efficiency_source": note}, sort_keys=False, width=1000)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{text}\n{_STACK_BEGIN}\n{block}")
    tmp.replace(path)
