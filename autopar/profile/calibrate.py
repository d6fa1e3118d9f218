"""Fit the cost model's physical constants to measured step times, and rank agreement (Kendall's tau-b).

What is fitted
  The ``efficiency`` section of a hardware file and nothing else: ``gemm[<precision>]`` (achieved/peak math),
  ``nvlink`` and ``scaleout`` (achieved/peak link bandwidth), ``hbm`` (optimizer step) and the five overlap
  fractions. These are properties of the machine and the software stack, shared by every layout; nothing is
  fitted per layout, so a fit that explains six layouts has to explain them with one set of constants.

  A constant the cost model does not react to for the given layouts (e.g. ``ep_overlap`` without experts, or
  ``nvlink`` when the hardware file carries a measured bandwidth table, which the cost model uses instead) is
  left as it is and reported as not identifiable.

How
  Least squares on log step time, r_i = log(predicted_i / measured_i), so that every layout weighs the same
  whatever its size, plus a weak pull towards the starting constants (weight ``prior_weight`` per constant,
  in units of its valid range) that only matters along directions the data do not determine. Bounded by each
  constant's valid range: a coarse space-filling sample of the box picks starting points, then projected
  Levenberg-Marquardt (forward-difference Jacobian; constants at a bound whose gradient points outwards are
  frozen for that iteration) refines each. numpy only.

The prediction is ``autopar.cost.estimate(model, hardware, training, layout, gpus).step_time_s``; any
function of that signature returning an object with ``step_time_s`` can stand in (tests use one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from autopar.errors import AutoparInputError
from autopar.specs.hardware import HardwareSpec

Estimator = Callable[..., Any]  # (model, hardware, training, layout, gpus) -> object with .step_time_s

# Valid range of each constant. Efficiencies are fractions of a peak (the spec requires > 0); a floor of 0.02
# keeps the search away from the pole of 1/eff. Overlaps are fractions of traffic hidden.
BOUNDS: dict[str, tuple[float, float]] = {
    "gemm": (0.02, 1.0), "nvlink": (0.02, 1.0), "scaleout": (0.02, 1.0), "hbm": (0.02, 1.0),
    "dp_overlap": (0.0, 1.0), "tp_overlap": (0.0, 1.0), "ep_overlap": (0.0, 1.0), "cp_overlap": (0.0, 1.0),
    "pp_overlap": (0.0, 1.0),
}
SCALAR_FIELDS = ("nvlink", "scaleout", "hbm", "dp_overlap", "tp_overlap", "ep_overlap", "cp_overlap", "pp_overlap")


class Observation(Protocol):
    """What a row must carry to take part in a fit (compare.ComparisonRow does)."""

    model: Any
    training: Any
    layout: Any
    gpus: int
    measured_step_s: float | None


# ---- Kendall's tau ---------------------------------------------------------------------------------------
def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-b rank correlation of two equally long sequences (Kendall 1945, "The treatment of ties
    in ranking problems"; as scipy.stats.kendalltau's default):

        tau_b = (n_c - n_d) / sqrt((n_0 - n_1)(n_0 - n_2))

    n_c / n_d: concordant / discordant pairs, n_0 = n(n-1)/2, n_1 and n_2: pairs tied in a and in b.
    With s_a = sign(a_i - a_j) and s_b likewise over pairs i < j this is sum(s_a s_b) / sqrt(sum s_a^2 sum s_b^2).
    1 for the same order, -1 for the reverse; NaN when either sequence is constant (or shorter than 2)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"kendall_tau needs two 1-D sequences of the same length (got {x.shape}, {y.shape})")
    i, j = np.triu_indices(len(x), k=1)
    sa, sb = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
    den = math.sqrt(float(np.sum(sa * sa)) * float(np.sum(sb * sb)))
    return float(np.sum(sa * sb) / den) if den > 0 else float("nan")


# ---- parameters ------------------------------------------------------------------------------------------
def _param_names(hardware: HardwareSpec, rows: Sequence[Observation]) -> list[str]:
    precisions = sorted({r.training.precision for r in rows})
    return [f"gemm[{p}]" for p in precisions] + list(SCALAR_FIELDS)


def _bounds(name: str) -> tuple[float, float]:
    return BOUNDS["gemm" if name.startswith("gemm[") else name]


KERNEL_FIELDS = ("nvlink", "scaleout", "hbm")   # live in hardware.kernel_model; the rest in hardware.efficiency


def _get(hardware: HardwareSpec, name: str) -> float:
    km = hardware.kernel_model
    if name.startswith("gemm["):
        return float(km.gemm.get(name[5:-1], 1.0))
    if name in KERNEL_FIELDS:
        return float(getattr(km, name))
    return float(getattr(hardware.efficiency, name))


def with_constants(hardware: HardwareSpec, values: dict[str, float]) -> HardwareSpec:
    """A copy of ``hardware`` with ``values`` (names as in FitReport: 'gemm[bf16]', 'nvlink', 'dp_overlap', ...)
    set in its kernel_model (GEMM, link and HBM fractions) or efficiency (overlaps) section."""
    eff = hardware.efficiency.model_dump()
    km = hardware.kernel_model.model_dump()
    for name, v in values.items():
        if name.startswith("gemm["):
            km["gemm"][name[5:-1]] = float(v)
        elif name in KERNEL_FIELDS:
            km[name] = float(v)
        else:
            eff[name] = float(v)
    return hardware.model_copy(update={"efficiency": type(hardware.efficiency).model_validate(eff),
                                       "kernel_model": type(hardware.kernel_model).model_validate(km)})


def _default_estimator() -> Estimator:
    try:
        from autopar.cost import estimate
    except ImportError as err:  # pragma: no cover - the cost model is part of the package
        raise AutoparInputError(f"the cost model (autopar.cost.estimate) is not available: {err}") from None
    return estimate


class _Objective:
    """log(predicted / measured) per row as a function of the free constants."""

    def __init__(self, hardware: HardwareSpec, rows: Sequence[Observation], names: list[str],
                 estimator: Estimator):
        self.hw, self.rows, self.names, self.est = hardware, list(rows), names, estimator
        self.log_meas = np.log([r.measured_step_s for r in self.rows])
        self.calls = 0

    def predict(self, theta: np.ndarray) -> np.ndarray:
        hw = with_constants(self.hw, dict(zip(self.names, theta)))
        self.calls += len(self.rows)
        return np.array([self.est(r.model, hw, r.training, r.layout, r.gpus).step_time_s for r in self.rows])

    def residuals(self, theta: np.ndarray) -> np.ndarray:
        pred = self.predict(theta)
        if np.any(~np.isfinite(pred)) or np.any(pred <= 0):
            return np.full(len(self.rows), 1e3)
        return np.log(pred) - self.log_meas

    def jacobian(self, theta: np.ndarray, r0: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        J = np.empty((len(r0), len(theta)))
        for k in range(len(theta)):
            h = 1e-5 * (hi[k] - lo[k])
            step = h if theta[k] + h <= hi[k] else -h
            t = theta.copy()
            t[k] += step
            J[:, k] = (self.residuals(t) - r0) / step
        return J


def _lm(obj: _Objective, theta0: np.ndarray, lo: np.ndarray, hi: np.ndarray, prior: np.ndarray,
        prior_w: np.ndarray, max_iter: int = 60) -> tuple[np.ndarray, float, int]:
    """Projected Levenberg-Marquardt on the residuals plus the prior; returns (theta, cost, iterations)."""
    span = hi - lo

    def full(theta: np.ndarray, r: np.ndarray) -> np.ndarray:
        return np.concatenate([r, prior_w * (theta - prior) / span])

    theta = np.clip(theta0, lo, hi)
    r = obj.residuals(theta)
    cost = float(np.sum(full(theta, r) ** 2))
    lam = 1e-2
    it = 0
    for it in range(1, max_iter + 1):
        J = np.vstack([obj.jacobian(theta, r, lo, hi), np.diag(prior_w / span)])
        f = full(theta, r)
        g = J.T @ f
        # Active set: a constant at a bound whose descent direction leaves the box stays put this iteration.
        free = ~(((theta <= lo + 1e-12) & (g > 0)) | ((theta >= hi - 1e-12) & (g < 0)))
        if not free.any():
            break
        Jf = J[:, free]
        A = Jf.T @ Jf
        improved = False
        for _ in range(12):
            step = np.zeros_like(theta)
            try:
                step[free] = np.linalg.solve(A + lam * (np.diag(np.diag(A)) + 1e-9 * np.eye(len(A))), -g[free])
            except np.linalg.LinAlgError:
                lam *= 10
                continue
            cand = np.clip(theta + step, lo, hi)
            rc = obj.residuals(cand)
            cc = float(np.sum(full(cand, rc) ** 2))
            if cc < cost:
                moved = float(np.max(np.abs(cand - theta) / span))
                theta, r, gain, cost = cand, rc, cost - cc, cc
                lam = max(lam / 3, 1e-9)
                improved = True
                break
            lam *= 4
        if not improved or gain <= 1e-12 * max(cost, 1e-12) or moved < 1e-9:
            break
    return theta, cost, it


@dataclass
class FitReport:
    """What a fit changed and how well the constants explain the measurements."""

    constants: dict[str, tuple[float, float]]      # name -> (before, after), the constants that were fitted
    sd: dict[str, float]                            # name -> standard error from the Jacobian at the solution
    not_identifiable: dict[str, float]              # name -> value left as it was (no effect on these layouts)
    rows: int
    rms_log_err_before: float
    rms_log_err_after: float
    max_rel_err_before: float
    max_rel_err_after: float
    tau_before: float
    tau_after: float
    predicted_before: list[float]
    predicted_after: list[float]
    measured: list[float]
    estimator_calls: int = 0
    notes: list[str] = field(default_factory=list)

    def format(self) -> str:
        lines = [f"fit of {len(self.constants)} constants to {self.rows} measured step times "
                 f"({self.estimator_calls} cost-model calls)"]
        lines.append(f"  {'constant':<14}{'before':>9}{'after':>9}{'+/- sd':>9}")
        for name, (b, a) in self.constants.items():
            sd = self.sd.get(name, float("nan"))
            sd_text = f"{sd:>9.3f}" if sd < 10 else f"{'>10':>9}"
            lines.append(f"  {name:<14}{b:>9.3f}{a:>9.3f}{sd_text}")
        if self.not_identifiable:
            lines.append("  not identifiable from these layouts (kept): "
                         + ", ".join(f"{k}={v:g}" for k, v in self.not_identifiable.items()))
        lines.append(f"  step-time error: rms {_pct(self.rms_log_err_before)} -> {_pct(self.rms_log_err_after)} "
                     f"(log), max {self.max_rel_err_before:+.1%} -> {self.max_rel_err_after:+.1%}")
        lines.append(f"  Kendall tau-b (predicted vs measured ranking): {self.tau_before:+.3f} -> {self.tau_after:+.3f}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _pct(log_err: float) -> str:
    return f"{math.expm1(log_err):.1%}"


def _max_rel(pred: np.ndarray, meas: np.ndarray) -> float:
    rel = pred / meas - 1.0
    return float(rel[np.argmax(np.abs(rel))])


def fit_efficiency(hardware: HardwareSpec, rows: Sequence[Observation], *, estimator: Estimator | None = None,
                   prior_weight: float = 1e-10, samples: int = 48, starts: int = 4,
                   seed: int = 0) -> tuple[HardwareSpec, FitReport]:
    """Fit the efficiency constants of ``hardware`` to the measured step times of ``rows``.

    Rows without a positive measured step time (failed runs) are skipped. Returns the hardware with the fitted
    constants (everything else unchanged) and a :class:`FitReport`. Raises AutoparInputError with fewer than
    two usable rows."""
    est = estimator or _default_estimator()
    use = [r for r in rows if r.measured_step_s is not None and r.measured_step_s > 0
           and math.isfinite(r.measured_step_s)]
    if len(use) < 2:
        raise AutoparInputError(f"a fit needs at least 2 layouts with a measured step time (got {len(use)})")
    names = _param_names(hardware, use)
    start = np.array([min(max(_get(hardware, n), _bounds(n)[0]), _bounds(n)[1]) for n in names])
    lo = np.array([_bounds(n)[0] for n in names])
    hi = np.array([_bounds(n)[1] for n in names])
    obj = _Objective(hardware, use, names, est)
    meas = np.array([r.measured_step_s for r in use])

    # Coarse sample of the box (a fixed-seed Latin hypercube) for starting points and for the sensitivity check.
    rng = np.random.default_rng(seed)
    k = len(names)
    lhs = (np.argsort(rng.random((k, samples)), axis=1).T + rng.random((samples, k))) / samples
    cand = np.vstack([start, lo + lhs * (hi - lo)])
    costs, res = [], []
    for c in cand:
        rr = obj.residuals(c)
        res.append(rr)
        costs.append(float(np.sum(rr ** 2)))

    # Which constants move any prediction? Probe at the start and at the three best samples.
    probe = [0] + [int(i) for i in np.argsort(costs)[:3]]
    moves = np.zeros(k, dtype=bool)
    for i in probe:
        J = obj.jacobian(cand[i], res[i], lo, hi)
        moves |= np.any(np.abs(J) > 1e-7, axis=0)
    fit_idx = np.flatnonzero(moves)
    report_fixed = {names[i]: float(start[i]) for i in np.flatnonzero(~moves)}
    pred0 = obj.predict(start)
    notes: list[str] = []
    if len(fit_idx) == 0:
        notes.append("no efficiency constant changes any prediction for these layouts; nothing fitted")
        theta = start.copy()
    else:
        sub_names = [names[i] for i in fit_idx]
        # The sub-problem: fitted constants free, the others held at their start values.
        sub = _Objective(with_constants(hardware, dict(zip(names, start.tolist()))), use, sub_names, est)

        def embed(x: np.ndarray) -> np.ndarray:
            t = start.copy()
            t[fit_idx] = x
            return t

        slo, shi, sprior = lo[fit_idx], hi[fit_idx], start[fit_idx]
        pw = np.full(len(fit_idx), math.sqrt(prior_weight))
        order = [0] + [int(i) for i in np.argsort(costs) if i != 0][:starts]
        best = None
        for i in order:
            x, c, _ = _lm(sub, cand[i][fit_idx], slo, shi, sprior, pw)
            if best is None or c < best[1]:
                best = (x, c)
        theta = embed(best[0])
        obj.calls += sub.calls
        if len(use) < len(fit_idx):
            notes.append(f"{len(use)} layouts for {len(fit_idx)} constants: the fit is underdetermined; "
                         "constants the data cannot separate stay near their starting values")
    pred1 = obj.predict(theta)
    # Standard errors from the Jacobian at the solution: sd = sqrt(diag((J^T J)^-1) * s^2), s^2 from the residuals.
    sd: dict[str, float] = {}
    if len(fit_idx):
        r1 = np.log(pred1) - np.log(meas)
        J = obj.jacobian(theta, r1, lo, hi)[:, fit_idx]
        dof = max(1, len(use) - len(fit_idx))
        s2 = max(float(np.sum(r1 ** 2)) / dof, 1e-6 ** 2)
        # Directions the data do not constrain (a zero or collinear Jacobian column) get a huge variance
        # instead of pinv's silent zero.
        lam, vec = np.linalg.eigh(J.T @ J)
        lam = np.maximum(lam, 1e-12 * max(float(lam.max()), 1e-30))
        cov = (vec / lam) @ vec.T * s2
        for j, i in enumerate(fit_idx):
            sd[names[i]] = float(math.sqrt(max(cov[j, j], 0.0)))
        # Constants the data only determine in combination: their share of the near-null eigenvectors of J^T J.
        tiny = lam <= 1e-8 * float(lam.max())
        weak = [names[i] for j, i in enumerate(fit_idx) if tiny.any() and np.max(np.abs(vec[j, tiny])) > 0.3]
        if weak:
            notes.append("only a combination of these is determined by these layouts (they trade off): "
                         + ", ".join(weak) + "; add layouts that separate them")
    pinned = [f"{names[i]}={theta[i]:g}" for i in fit_idx
              if (theta[i] <= lo[i] + 1e-9 or theta[i] >= hi[i] - 1e-9) and abs(theta[i] - start[i]) > 1e-9]
    if pinned:
        notes.append("ended at the bound of its valid range: " + ", ".join(pinned)
                     + " (the cost model may lack a term this constant is standing in for)")
    fitted_hw = with_constants(hardware, {names[i]: float(theta[i]) for i in fit_idx})
    report = FitReport(
        constants={names[i]: (float(start[i]), float(theta[i])) for i in fit_idx},
        sd=sd, not_identifiable=report_fixed, rows=len(use),
        rms_log_err_before=float(np.sqrt(np.mean((np.log(pred0) - np.log(meas)) ** 2))),
        rms_log_err_after=float(np.sqrt(np.mean((np.log(pred1) - np.log(meas)) ** 2))),
        max_rel_err_before=_max_rel(pred0, meas), max_rel_err_after=_max_rel(pred1, meas),
        tau_before=kendall_tau(pred0, meas), tau_after=kendall_tau(pred1, meas),
        predicted_before=pred0.tolist(), predicted_after=pred1.tolist(), measured=meas.tolist(),
        estimator_calls=obj.calls, notes=notes)
    return fitted_hw, report


def leave_one_out(hardware: HardwareSpec, rows: Sequence[Observation], *, estimator: Estimator | None = None,
                  **kw: Any) -> list[float]:
    """Out-of-sample predictions: row i's step time predicted with constants fitted to the other rows.

    The honest measure of a calibration: Kendall tau of these against the measurements cannot be raised by
    fitting the very layouts it ranks."""
    est = estimator or _default_estimator()
    use = [r for r in rows if r.measured_step_s is not None and r.measured_step_s > 0]
    out = []
    for i, r in enumerate(use):
        hw_i, _ = fit_efficiency(hardware, use[:i] + use[i + 1:], estimator=est, **kw)
        out.append(est(r.model, hw_i, r.training, r.layout, r.gpus).step_time_s)
    return out
