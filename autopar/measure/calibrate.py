"""The one fitter of the cost model's efficiency constants, with the one table of their bounds.

Used by ``autopar validate --fit`` (published runs, :mod:`autopar.measure.calibration` builds the rows) and by
``autopar profile compare`` (layouts run on this machine, :func:`fit_efficiency`).

What is fitted
  Named constants of a hardware file's ``efficiency`` section (pipeline-send overlap, per-layer overhead, dropless imbalance)
  or ``kernel_model`` section (kernel and link speeds); never anything per row. Which ones is data, not code: a
  list of :class:`Constant` (a field, a key for the per-precision ``gemm`` table, and optionally the chips it
  belongs to, so one constant can be per (chip, precision) and shared by sibling chips). Each is bounded by
  :data:`BOUNDS` (name -> lo, hi, why, which fits move it), read from the :class:`~autopar.specs.hardware.FitBound`
  its hardware-file field carries; a constant whose bounds are equal is held there. A constant that moves
  no prediction of the given rows is left as it is and reported as not identifiable.

Loss
  ``"mae"`` (default): mean |predicted / measured - 1|, the figure ``autopar validate`` reports. Solved as a
  robust least-squares problem (``scipy.optimize.least_squares``, ``loss="soft_l1"``, ``f_scale`` 1%): errors
  above 1% weigh linearly (the mean absolute error), below 1% quadratically, so the problem is smooth; the
  reported figures are the exact mean |error|. ``"log"``: least squares on log(predicted / measured), which
  weighs over- and under-prediction alike.

How
  Bounded trust-region reflective solver (``least_squares(method="trf")``, forward-difference Jacobian) from
  several starting points: the file's current constants, then the best points of a fixed-seed Latin hypercube
  over the bounds. Deterministic: the same rows give the same constants.

After the fit
  Each constant is printed with its bounds; a constant that ends at a bound is flagged (the cost model may lack
  a term that constant stands in for). Standard errors and constants the rows only determine in combination
  come from the Jacobian at the solution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, get_origin

import numpy as np

from autopar.errors import AutoparInputError
from autopar.measure.record import rank_agreement
from autopar.specs.hardware import Efficiency, FitBound, HardwareSpec, KernelModel, fit_bounds

Estimator = Callable[..., Any]  # (model, hardware, training, layout, gpus) -> object with .step_time_s


Bound = FitBound   # lo, hi, why, fitted_by


# The one bounds table, read from the hardware spec, where each calibrated constant is declared once: its field in
# HardwareSpec.efficiency (what only training runs show: the per-layer overheads, the dropless
# imbalance) or HardwareSpec.kernel_model (kernel and link speeds, measured by microbenchmarks; `autopar profile
# compare` can refit them to runs on the machine at hand) carries its valid range and its FitBound together. The
# per-precision ``gemm`` table shares one entry.
BOUNDS: dict[str, Bound] = fit_bounds()


def fitted_by(fit: str) -> tuple[str, ...]:
    """The constants one fit moves, in field order: ``"runs"`` (``autopar validate --fit``) or ``"layouts"``
    (``autopar profile compare``)."""
    return tuple(name for name, b in BOUNDS.items() if fit in b.fitted_by)


def section_of(fld: str) -> str:
    """The HardwareSpec section holding constant ``fld``: 'efficiency' or 'kernel_model'."""
    if fld in Efficiency.model_fields:
        return "efficiency"
    if fld in KernelModel.model_fields:
        return "kernel_model"
    raise AutoparInputError(f"'{fld}' is neither an efficiency nor a kernel_model field of a hardware file")


@dataclass(frozen=True)
class Constant:
    """One fitted number: ``<section>.<field>`` (``kernel_model.gemm[<key>]`` for the per-precision table; the
    section is the one that has the field), applying to the rows whose hardware is one of ``chips`` (empty:
    every row)."""

    field: str
    key: str | None = None
    chips: tuple[str, ...] = ()
    stack: str = ""         # only rows run on this software stack (autopar/specs/stack.py); "" = every stack

    @property
    def name(self) -> str:
        base = f"{self.field}[{self.key}]" if self.key else self.field
        base = f"{self.chips[0]}:{base}" if self.chips else base
        return f"{self.stack}/{base}" if self.stack else base

    @property
    def bound(self) -> Bound:
        return Bound(*BOUNDS[self.field])

    def applies_to(self, hardware: HardwareSpec, stack: str = "") -> bool:
        return (not self.chips or hardware.name in self.chips) and (not self.stack or self.stack == stack)

    def get(self, hardware: HardwareSpec) -> float:
        sec = getattr(hardware, section_of(self.field))
        if self.key is not None:
            return float(getattr(sec, self.field).get(self.key, 1.0))
        return float(getattr(sec, self.field))


def parse_constant(name: str) -> Constant:
    """``'nvlink'``, ``'gemm[bf16]'`` or ``'h100_sxm:gemm[bf16]'`` as a :class:`Constant`."""
    chip, _, rest = name.rpartition(":")
    fld, key = (rest[:-1].split("[", 1) if rest.endswith("]") else (rest, None))
    if fld not in BOUNDS:
        raise AutoparInputError(f"no bounds for efficiency constant '{fld}' (bounded: {', '.join(BOUNDS)})")
    return Constant(fld, key, (chip,) if chip else ())


def with_values(hardware: HardwareSpec, values: dict[Constant, float], stack: str = "") -> HardwareSpec:
    """A copy of ``hardware`` with the constants that apply to it (on ``stack``) set to ``values``; a per-stack
    constant is set after the shared one of the same field, so it wins."""
    sections = {name: getattr(hardware, name).model_dump() for name in ("efficiency", "kernel_model")}
    for c, v in sorted(values.items(), key=lambda cv: bool(cv[0].stack)):
        if not c.applies_to(hardware, stack):
            continue
        sec = sections[section_of(c.field)]
        if c.key is not None:
            sec[c.field] = {**sec[c.field], c.key: float(v)}
        else:
            sec[c.field] = float(v)
    return hardware.model_copy(update={name: type(getattr(hardware, name)).model_validate(d)
                                       for name, d in sections.items()})


def with_constants(hardware: HardwareSpec, values: dict[str, float]) -> HardwareSpec:
    """:func:`with_values` with constants given by name (``'gemm[bf16]'``, ``'nvlink'``, ...)."""
    return with_values(hardware, {parse_constant(k): v for k, v in values.items()})


@dataclass
class FitRow:
    """One measurement to fit: ``predict(hardware)`` is the cost model's figure for it on that hardware."""

    label: str
    hardware: HardwareSpec
    measured: float
    predict: Callable[[HardwareSpec], float]
    group: str = ""         # rows of one group are held out together by cross_validate (a source, a layout)
    stack: str = ""         # the software stack the row ran (per-stack constants apply only to its rows)


@dataclass
class FittedConstant:
    name: str
    before: float
    after: float
    bound: Bound
    rows: int               # rows whose prediction it moves
    sd: float = math.nan    # standard error from the Jacobian at the solution

    @property
    def pinned(self) -> str | None:
        """'lower' or 'upper' when the fit ended at that bound (within 0.1% of the range: the bounded solver
        approaches a bound from inside)."""
        tol = 1e-3 * (self.bound.hi - self.bound.lo)
        if self.after <= self.bound.lo + tol:
            return "lower"
        if self.after >= self.bound.hi - tol:
            return "upper"
        return None


@dataclass
class FitReport:
    """What a fit changed and how well the constants explain the measurements."""

    loss: str
    constants: list[FittedConstant]
    not_identifiable: dict[str, float]      # name -> value left as it was (moves no prediction of these rows)
    labels: list[str]
    measured: list[float]
    predicted_before: list[float]
    predicted_after: list[float]
    values: dict[Constant, float]           # every constant after the fit (the not identifiable at their start)
    predictions: int = 0                    # cost-model calls
    notes: list[str] = field(default_factory=list)

    def _errs(self, pred: list[float]) -> np.ndarray:
        return np.asarray(pred) / np.asarray(self.measured) - 1.0

    @property
    def mae_before(self) -> float:
        return float(np.mean(np.abs(self._errs(self.predicted_before))))

    @property
    def mae_after(self) -> float:
        return float(np.mean(np.abs(self._errs(self.predicted_after))))

    @property
    def rms_log_err_before(self) -> float:
        return float(np.sqrt(np.mean(np.log(np.asarray(self.predicted_before) / self.measured) ** 2)))

    @property
    def rms_log_err_after(self) -> float:
        return float(np.sqrt(np.mean(np.log(np.asarray(self.predicted_after) / self.measured) ** 2)))

    @property
    def max_err_after(self) -> float:
        e = self._errs(self.predicted_after)
        return float(e[np.argmax(np.abs(e))])

    @property
    def tau_before(self) -> float:
        return rank_agreement(self.predicted_before, self.measured)

    @property
    def tau_after(self) -> float:
        return rank_agreement(self.predicted_after, self.measured)

    @property
    def pinned(self) -> list[FittedConstant]:
        return [c for c in self.constants if c.pinned]

    def constant(self, name: str) -> FittedConstant:
        return next(c for c in self.constants if c.name == name)

    def format(self) -> str:
        loss = {"mae": "mean |relative error|", "log": "sum of squared log errors"}[self.loss]
        lines = [f"fit of {len(self.constants)} constants to {len(self.measured)} measurements, minimising {loss} "
                 f"({self.predictions} cost-model calls)",
                 f"  {'constant':<24}{'before':>9}{'after':>9}{'+/- sd':>9}{'bounds':>15}{'rows':>6}"]
        for c in self.constants:
            sd = f"{c.sd:>9.3f}" if c.sd < 10 else f"{'>10':>9}"
            flag = f"  PINNED at its {c.pinned} bound" if c.pinned else ""
            lines.append(f"  {c.name:<24}{c.before:>9.3f}{c.after:>9.3f}{sd}"
                         f"{f'[{c.bound.lo:g}, {c.bound.hi:g}]':>15}{c.rows:>6}{flag}")
        for c in self.pinned:
            lines.append(f"  {c.name} ended at its {c.pinned} bound ({c.bound.why}): the cost model may lack a "
                         "term this constant is standing in for")
        if self.not_identifiable:
            lines.append("  not identifiable from these rows (kept): "
                         + ", ".join(f"{k}={v:g}" for k, v in self.not_identifiable.items()))
        lines.append(f"  mean |error| {self.mae_before:.2%} -> {self.mae_after:.2%}; rms log error "
                     f"{math.expm1(self.rms_log_err_before):.1%} -> {math.expm1(self.rms_log_err_after):.1%}; "
                     f"largest error after {self.max_err_after:+.1%}")
        if len(self.measured) >= 2:
            lines.append(f"  Kendall tau-b (predicted vs measured ranking): {self.tau_before:+.3f} -> "
                         f"{self.tau_after:+.3f}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


class _Problem:
    """Residuals of every row as a function of the free constants' values."""

    def __init__(self, rows: Sequence[FitRow], constants: Sequence[Constant], loss: str):
        self.rows, self.constants, self.loss = list(rows), list(constants), loss
        self.meas = np.array([r.measured for r in self.rows], dtype=float)
        self.applies = [[c for c in self.constants if c.applies_to(r.hardware, r.stack)] for r in self.rows]
        self.calls = 0

    def predict(self, theta: np.ndarray) -> np.ndarray:
        values = dict(zip(self.constants, theta))
        out = np.empty(len(self.rows))
        for i, r in enumerate(self.rows):
            self.calls += 1
            out[i] = r.predict(with_values(r.hardware, {c: values[c] for c in self.applies[i]}, r.stack))
        return out

    def residuals_of(self, pred: np.ndarray) -> np.ndarray:
        if np.any(~np.isfinite(pred)) or np.any(pred <= 0):
            return np.full(len(self.rows), 1e3)
        return np.log(pred / self.meas) if self.loss == "log" else pred / self.meas - 1.0

    def residuals(self, theta: np.ndarray) -> np.ndarray:
        return self.residuals_of(self.predict(theta))

    def jacobian(self, theta: np.ndarray, r0: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        J = np.empty((len(r0), len(theta)))
        for k in range(len(theta)):
            if hi[k] <= lo[k]:      # held at its bound
                J[:, k] = 0.0
                continue
            h = 1e-5 * (hi[k] - lo[k])
            step = h if theta[k] + h <= hi[k] else -h
            t = theta.copy()
            t[k] += step
            J[:, k] = (self.residuals(t) - r0) / step
        return J


LOSSES = ("mae", "log")


def fit(rows: Sequence[FitRow], constants: Sequence[Constant], *, loss: str = "mae", starts: int = 6,
        samples: int = 24, seed: int = 0, max_nfev: int = 80) -> FitReport:
    """Fit ``constants`` to ``rows`` within :data:`BOUNDS`; see the module docstring. ``starts``: solver runs
    (the current constants, then the best of ``samples`` Latin-hypercube points); ``max_nfev``: residual
    evaluations per run, besides the Jacobian's.

    Raises AutoparInputError with fewer than two rows, an unknown loss, or a constant without bounds."""
    if loss not in LOSSES:
        raise AutoparInputError(f"unknown loss '{loss}' (choose from {', '.join(LOSSES)})")
    rows = [r for r in rows if r.measured is not None and math.isfinite(r.measured) and r.measured > 0]
    if len(rows) < 2:
        raise AutoparInputError(f"a fit needs at least 2 measurements (got {len(rows)})")
    for c in constants:
        if c.field not in BOUNDS:
            raise AutoparInputError(f"no bounds for efficiency constant '{c.field}' (bounded: {', '.join(BOUNDS)})")
    from scipy.optimize import least_squares

    constants = list(dict.fromkeys(constants))
    lo = np.array([c.bound.lo for c in constants])
    hi = np.array([c.bound.hi for c in constants])

    def start_of(c: Constant) -> float:
        r = next((r for r in rows if c.applies_to(r.hardware, r.stack)), rows[0])
        return c.get(r.hardware)

    start = np.clip([start_of(c) for c in constants], lo, hi)
    prob = _Problem(rows, constants, loss)
    pred0 = prob.predict(start)
    r0 = prob.residuals_of(pred0)

    # Which constants move any prediction? Probe at the start and at a fixed-seed Latin hypercube's best points.
    rng = np.random.default_rng(seed)
    k = len(constants)
    lhs = (np.argsort(rng.random((k, samples)), axis=1).T + rng.random((samples, k))) / samples
    cand = lo + lhs * (hi - lo)
    costs = [float(np.sum(prob.residuals(c) ** 2)) for c in cand]
    order = [int(i) for i in np.argsort(costs)]
    moved = np.zeros((len(rows), k), dtype=bool)      # row i's prediction moves with constant j
    for theta, r in [(start, r0)] + [(cand[i], prob.residuals(cand[i])) for i in order[:2]]:
        moved |= np.abs(prob.jacobian(theta, r, lo, hi)) > 1e-7
    moves, touches = moved.any(axis=0), moved.sum(axis=0)
    held = hi <= lo                                     # bounds that leave one value: held there, not fitted
    free = np.flatnonzero(moves & ~held)
    notes: list[str] = []
    theta = start.copy()
    if len(free) == 0:
        notes.append("no constant changes any prediction for these rows; nothing fitted")
    else:
        def sub(x: np.ndarray) -> np.ndarray:
            t = start.copy()
            t[free] = x
            return prob.residuals(t)

        kw = dict(bounds=(lo[free], hi[free]), method="trf", x_scale=hi[free] - lo[free], diff_step=1e-6,
                  ftol=1e-12, xtol=1e-12, gtol=1e-12, max_nfev=max_nfev)
        if loss == "mae":
            kw.update(loss="soft_l1", f_scale=0.01)
        best = None
        for x0 in [start[free]] + [cand[i][free] for i in order[:max(0, starts - 1)]]:
            # least_squares needs a strictly interior start
            x0 = np.clip(x0, lo[free] + 1e-9 * (hi[free] - lo[free]), hi[free] - 1e-9 * (hi[free] - lo[free]))
            res = least_squares(sub, x0, **kw)
            if best is None or res.cost < best.cost - 1e-15:
                best = res
        theta[free] = best.x
        if len(rows) < len(free):
            notes.append(f"{len(rows)} measurements for {len(free)} constants: the fit is underdetermined; "
                         "constants the data cannot separate stay near their starting values")
    pred1 = prob.predict(theta)

    # Standard errors from the Jacobian at the solution: sd = sqrt(diag((J^T J)^-1) s^2), s^2 from the residuals.
    sd: dict[int, float] = {}
    if len(free):
        r1 = prob.residuals_of(pred1)
        J = prob.jacobian(theta, r1, lo, hi)[:, free]
        s2 = max(float(np.sum(r1 ** 2)) / max(1, len(rows) - len(free)), 1e-12)
        lam, vec = np.linalg.eigh(J.T @ J)
        lam = np.maximum(lam, 1e-12 * max(float(lam.max()), 1e-30))
        cov = (vec / lam) @ vec.T * s2
        for j, i in enumerate(free):
            sd[int(i)] = float(math.sqrt(max(cov[j, j], 0.0)))
        # Constants the data only determine in combination: their share of the near-null eigenvectors of J^T J.
        tiny = lam <= 1e-8 * float(lam.max())
        weak = [constants[i].name for j, i in enumerate(free) if tiny.any() and np.max(np.abs(vec[j, tiny])) > 0.3]
        if weak:
            notes.append("only a combination of these is determined by these rows (they trade off): "
                         + ", ".join(weak) + "; add measurements that separate them")
    keep = set(free.tolist()) | set(np.flatnonzero(held).tolist())
    fitted = [FittedConstant(c.name, float(start[i]), float(theta[i]), c.bound, int(touches[i]),
                             sd.get(int(i), math.nan)) for i, c in enumerate(constants) if i in keep]
    return FitReport(loss=loss, constants=fitted,
                     not_identifiable={constants[i].name: float(start[i]) for i in np.flatnonzero(~moves & ~held)},
                     labels=[r.label for r in rows], measured=prob.meas.tolist(),
                     predicted_before=pred0.tolist(), predicted_after=pred1.tolist(),
                     values=dict(zip(constants, theta.tolist())), predictions=prob.calls, notes=notes)


@dataclass
class HeldOut:
    """Out-of-sample predictions of each group's rows by constants fitted to the other groups."""

    predicted: dict[str, float]             # row label -> prediction
    skipped: dict[str, str]                 # row label -> why it could not be predicted out of sample

    def by_group(self, rows: Sequence[FitRow]) -> dict[str, float]:
        """Mean |relative error| per held-out group."""
        out: dict[str, list[float]] = {}
        for r in rows:
            if r.label in self.predicted:
                out.setdefault(r.group, []).append(abs(self.predicted[r.label] / r.measured - 1))
        return {g: sum(v) / len(v) for g, v in out.items()}


def cross_validate(rows: Sequence[FitRow], constants: Sequence[Constant], *, loss: str = "mae",
                   starts: int = 2, progress: Callable[[str], None] | None = None) -> HeldOut:
    """Leave one group out: refit without each group and predict its rows with those constants.

    A held-out row that depends on a constant no training row can move (a chip or precision only that group
    has) is skipped: its only value would come from a fit that saw it."""
    groups = list(dict.fromkeys(r.group for r in rows))
    pred: dict[str, float] = {}
    skipped: dict[str, str] = {}
    for g in groups:
        train = [r for r in rows if r.group != g]
        test = [r for r in rows if r.group == g]
        rep = fit(train, constants, loss=loss, starts=starts)
        for r in test:
            unseen = [c.name for c in constants
                      if c.applies_to(r.hardware, r.stack) and not any(c.applies_to(t.hardware, t.stack) for t in train)]
            if unseen:
                skipped[r.label] = f"{', '.join(unseen)} only in this group"
                continue
            pred[r.label] = r.predict(with_values(r.hardware, rep.values, r.stack))
        if progress:
            errs = [abs(pred[r.label] / r.measured - 1) for r in test if r.label in pred]
            progress(f"held out {g}: " + (f"{sum(errs) / len(errs):.1%}" if errs else "nothing predictable"))
    return HeldOut(pred, skipped)


# ---- predicted-vs-measured step times of layouts (autopar profile compare) --------------------------------
class Observation(Protocol):
    """What a compare row must carry to take part in a fit (compare.ComparisonRow does)."""

    label: str
    model: Any
    training: Any
    layout: Any
    gpus: int
    measured: float | None




def default_estimator() -> Estimator:
    """The cost model's ``autopar.cost.estimate`` (imported on first use)."""
    try:
        from autopar.cost import estimate
    except ImportError as err:  # pragma: no cover - the cost model is part of the package
        raise AutoparInputError(f"the cost model (autopar.cost.estimate) is not available: {err}") from None
    return estimate


def step_rows(hardware: HardwareSpec, rows: Sequence[Observation], estimator: Estimator | None = None) -> list[FitRow]:
    """Fit rows of measured step times: the prediction is ``estimator(...).step_time_s``."""
    est = estimator or default_estimator()
    out = []
    for i, r in enumerate(rows):
        if r.measured is None or not r.measured > 0:
            continue
        out.append(FitRow(label=f"{i + 1}:{getattr(r, 'label', '')}", hardware=hardware, measured=float(r.measured),
                          group=str(i),
                          predict=lambda hw, r=r: est(r.model, hw, r.training, r.layout, r.gpus).step_time_s))
    return out


def layout_constants(rows: Sequence[Observation]) -> list[Constant]:
    """What ``profile compare`` fits (:func:`fitted_by` ``"layouts"``: gemm, the link and HBM speeds, the
    pipeline-send overlap, the per-layer overhead); a per-precision table (gemm) once per precision of the
    rows."""
    precisions = sorted({r.training.precision for r in rows})
    return [c for f in fitted_by("layouts")
            for c in ([Constant(f, p) for p in precisions] if _per_precision(f) else [Constant(f)])]


def _per_precision(fld: str) -> bool:
    """Whether constant ``fld`` is a table keyed by precision (``kernel_model.gemm``)."""
    sec = Efficiency if section_of(fld) == "efficiency" else KernelModel
    return get_origin(sec.model_fields[fld].annotation) is dict


def fit_efficiency(hardware: HardwareSpec, rows: Sequence[Observation], *, estimator: Estimator | None = None,
                   loss: str = "mae", **kw: Any) -> tuple[HardwareSpec, FitReport]:
    """Fit the efficiency constants of ``hardware`` to the measured step times of ``rows`` (failed runs, with
    no measurement, are skipped). Returns the hardware with the fitted constants and the :class:`FitReport`."""
    report = fit(step_rows(hardware, rows, estimator), layout_constants(rows), loss=loss, **kw)
    fitted = {c: v for c, v in report.values.items() if any(fc.name == c.name for fc in report.constants)}
    return with_values(hardware, fitted), report


def leave_one_out(hardware: HardwareSpec, rows: Sequence[Observation], *, estimator: Estimator | None = None,
                  loss: str = "mae") -> list[float]:
    """Out-of-sample predictions: each measured row's step time predicted with constants fitted to the others.

    The honest measure of a calibration: the rank agreement of these with the measurements cannot be raised
    by fitting the very layouts it ranks."""
    frows = step_rows(hardware, rows, estimator)
    held = cross_validate(frows, layout_constants(rows), loss=loss)
    return [held.predicted[r.label] for r in frows]
