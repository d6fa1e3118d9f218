"""``autopar validate --fit``: the published runs as rows of the one fitter (:mod:`autopar.measure.calibrate`).

What is fitted — only constants of a chip, a precision or the software stack, never anything per row. The list
is data (change it here, not in the fitter):
  * ``PER_CHIP``: ``efficiency.<field>[precision]`` per (chip, precision) present in the data — today
    ``gemm``. A (chip, precision) seen in only one row is tied to its closest sibling (``TIES``: gb300 mxfp8 =
    gb200 mxfp8) so that no constant is fitted to a single run;
  * ``SHARED``: one value for every chip.
Bounds, loss (mean |predicted / measured − 1| of tokens/s/GPU, the figure ``autopar validate`` reports) and the
solver are the fitter's. Chips without data inherit from the same silicon when written (``INHERIT``: h200 from
h100_sxm, the same GH100 die; b200/b300 and gb300_nvl72 from gb200_nvl72, Blackwell).

Honesty check (``--cv``): leave one source out (Megatron 2021, Megatron-Core, Llama 3, NeMo, Megatron-MoE):
refit without the source and predict its rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from autopar.cost import Estimator
from autopar.measure.calibrate import Constant, FitReport, FitRow, HeldOut, cross_validate, fit as fit_rows
from autopar.specs.hardware import Efficiency, HardwareSpec
from autopar.validation import Case

PER_CHIP: tuple[str, ...] = ("gemm",)
SHARED: tuple[str, ...] = ("hbm", "nvlink", "scaleout", "dp_overlap", "tp_overlap", "ep_overlap", "cp_overlap",
                           "elementwise_passes", "moe_dropless_imbalance")
TIES = {("gb300_nvl72", "mxfp8"): ("gb200_nvl72", "mxfp8")}
INHERIT = {"h200": "h100_sxm", "b200": "gb200_nvl72", "b300": "gb200_nvl72", "gb300_nvl72": "gb200_nvl72"}


def rows_from_cases(cases: list[Case]) -> list[FitRow]:
    """One fit row per published run: predicted tokens/s/GPU on the given hardware (the model profile is built
    once per row and reused); grouped by source (the row id's prefix)."""
    rows = []
    for c in cases:
        est = Estimator(c.model, c.hardware, c.training, c.gpus)
        rows.append(FitRow(label=c.row_id, hardware=c.hardware, measured=c.measured_tokens,
                           group=c.row_id.split("-")[0],
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
    return ([Constant(f, prec, tuple(keys[chip, prec])) for f in per_chip for chip, prec in sorted(keys)]
            + [Constant(f) for f in shared])


def fit(cases: list[Case], loss: str = "mae", progress: Callable[[str], None] | None = None) -> FitReport:
    """Fit :func:`constants_for` to every case."""
    if progress:
        progress(f"fitting {len(constants_for(cases))} constants to {len(cases)} published runs")
    return fit_rows(rows_from_cases(cases), constants_for(cases), loss=loss)


def cross_validate_sources(cases: list[Case], loss: str = "mae",
                           progress: Callable[[str], None] | None = None) -> HeldOut:
    """Each source's rows predicted by constants fitted to the other sources."""
    return cross_validate(rows_from_cases(cases), constants_for(cases), loss=loss, progress=progress)


def efficiency_for(report: FitReport, hw: HardwareSpec) -> Efficiency:
    """The efficiency section of ``hw`` after the fit: its own fitted constants, else its silicon sibling's
    (``INHERIT``); blockwise FP8 as fast as per-tensor FP8 when no blockwise run was fitted."""
    fitted = {c: v for c, v in report.values.items() if c.name in {fc.name for fc in report.constants}}
    eff = hw.efficiency.model_dump()
    own = {(c.field, c.key) for c in fitted if c.chips and hw.name in c.chips}
    for c, v in fitted.items():
        mine = not c.chips or hw.name in c.chips
        inherited = c.chips and INHERIT.get(hw.name) in c.chips and (c.field, c.key) not in own
        if not (mine or inherited):
            continue
        if c.key is None:
            eff[c.field] = v
        else:
            eff[c.field] = {**eff[c.field], c.key: v}
            if c.field == "gemm" and c.key == "fp8" and not any(
                    k.key == "fp8_block" and (hw.name in k.chips or INHERIT.get(hw.name) in k.chips) for k in fitted):
                eff["gemm"]["fp8_block"] = v   # no blockwise-FP8 run in the data: assumed as fast as per-tensor FP8
    return Efficiency.model_validate(eff)


_BEGIN = "# --- calibrated efficiency (autopar validate --fit --write) ---"


def write_efficiency(path: Path, eff: Efficiency, note: str) -> None:
    """Replace (or append) the calibrated ``efficiency:`` block of a hardware YAML, keeping its comments."""
    import yaml
    text = path.read_text()
    if _BEGIN in text:
        text = text[:text.index(_BEGIN)].rstrip() + "\n"
    elif "\nefficiency:" in text:
        raise ValueError(f"{path}: has a hand-written efficiency section; not overwriting it")
    block = yaml.safe_dump({"efficiency": eff.model_dump(mode="json")}, sort_keys=False)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{text}\n{_BEGIN}\n# {note}\n{block}")
    tmp.replace(path)
