"""Fit what no kernel microbenchmark can see to the published runs (``autopar validate --fit``).

Kernel speeds (GEMM by shape, flash attention, grouped GEMM, memory-bound bandwidth) and link bandwidths are
measured or published figures in ``hardware/*.yaml`` (``kernel_model``: kernel classes and link efficiencies) and
are NOT fitted. What is fitted, shared by every chip and run (nothing per chip, precision or row):

  * ``dp_overlap``, ``tp_overlap``, ``ep_overlap``, ``cp_overlap``: the share of each communication a framework
    hides behind compute (Megatron-Core's overlap features; no single-kernel benchmark measures them);
  * ``layer_overhead_us``: time per layer and micro-batch that no kernel accounts for (launch gaps, host work);
  * ``moe_dropless_imbalance``: busiest expert rank / mean under dropless routing (a property of the trained
    router at that point of training, not of the hardware).

Each constant has physical bounds (:data:`BOUNDS`, with the reason); the fit reports any constant that ends at a
bound, which is a finding about the model, not a result.

Loss: mean |predicted / measured − 1| tokens/s/GPU, the figure ``autopar validate`` reports, minimised by
coordinate descent over a shrinking grid inside the bounds, then polished by Powell's method within the same
bounds (``scipy.optimize.minimize``; both deterministic). Honesty check: a grouped
cross-validation that refits without each source (Megatron 2021, Megatron-Core, Llama 3, NeMo, Megatron-MoE)
and predicts that source's rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from autopar.cost import Estimator
from autopar.specs.hardware import Efficiency, HardwareSpec
from autopar.validation import Case

# name: (low, high, why these bounds)
BOUNDS: dict[str, tuple[float, float, str]] = {
    "dp_overlap": (0.0, 1.0, "a share of the gradient reduce-scatter / parameter all-gather"),
    "tp_overlap": (0.0, 0.9, "a share; TP comm overlap cannot hide the first and last chunk of a layer"),
    "ep_overlap": (0.0, 0.9, "a share; the dispatch before the first expert GEMM cannot be hidden"),
    "cp_overlap": (0.0, 1.0, "a share of the ring's KV exchange"),
    "layer_overhead_us": (0.0, 3000.0, "per layer and micro-batch; 3 ms is ~100 kernel launches' worth of "
                                       "host time at 30 us each, far beyond a CUDA-graph-free layer's launches"),
    "moe_dropless_imbalance": (1.0, 2.5, "busiest/mean expert rank; 2.5 is beyond what load-balancing losses "
                                         "leave in published traces"),
}


@dataclass
class FitResult:
    shared: dict[str, float]
    loss_before: float
    loss_after: float
    at_bound: list[str] = field(default_factory=list)

    def efficiency_for(self, hw: HardwareSpec) -> Efficiency:
        return hw.efficiency.model_copy(update=self.shared)


class _Rows:
    """Estimators built once per row; hardware swapped per evaluation (the model profile is reused)."""

    def __init__(self, cases: list[Case]):
        self.cases = cases
        self.est = [Estimator(c.model, c.hardware, c.training, c.gpus) for c in cases]

    def errors(self, shared: dict, idx: list[int]) -> list[float]:
        out = []
        for i in idx:
            c = self.cases[i]
            eff = c.hardware.efficiency.model_copy(update=shared)
            est = self.est[i].with_hardware(c.hardware.model_copy(update={"efficiency": eff}))
            pred = est.estimate(c.layout, resolved=True).tokens_per_s_per_gpu
            out.append(pred / c.measured_tokens - 1)
        return out

    def loss(self, shared: dict, idx: list[int]) -> float:
        errs = self.errors(shared, idx)
        return sum(abs(e) for e in errs) / max(len(errs), 1)


def _grid(lo: float, hi: float, centre: float, width: float, n: int = 9) -> list[float]:
    a, b = max(lo, centre - width), min(hi, centre + width)
    return sorted({round(a + (b - a) * i / (n - 1), 4) for i in range(n)} | {centre})


def fit(cases: list[Case], idx: list[int] | None = None, sweeps: int = 6, progress=None,
        rows: _Rows | None = None) -> FitResult:
    rows = rows or _Rows(cases)
    idx = list(range(len(cases))) if idx is None else idx
    base = cases[idx[0]].hardware.efficiency
    shared = {k: min(max(float(getattr(base, k)), lo), hi) for k, (lo, hi, _) in BOUNDS.items()}
    before = best = rows.loss(shared, idx)
    for sweep in range(sweeps):
        width = 0.5 / (2 ** sweep)
        for k, (lo, hi, _) in BOUNDS.items():
            for v in _grid(lo, hi, shared[k], (hi - lo) * width):
                trial = {**shared, k: v}
                val = rows.loss(trial, idx)
                if val < best - 1e-9:
                    best, shared = val, trial
        if progress:
            progress(f"sweep {sweep + 1}/{sweeps}: mean absolute error {best:.2%}")
    shared, best = _polish(rows, shared, best, idx)
    if progress:
        progress(f"polished: mean absolute error {best:.2%}")
    at_bound = [k for k, (lo, hi, _) in BOUNDS.items() if abs(shared[k] - lo) < 1e-9 or abs(shared[k] - hi) < 1e-9]
    return FitResult(shared, before, best, at_bound)


def _polish(rows: _Rows, shared: dict, best: float, idx: list[int]) -> tuple[dict, float]:
    """Powell's method (derivative-free, bounded) from the grid's optimum, on constants scaled to [0, 1]."""
    from scipy.optimize import minimize
    names = list(BOUNDS)
    lo = [BOUNDS[k][0] for k in names]
    span = [max(BOUNDS[k][1] - BOUNDS[k][0], 1e-12) for k in names]

    def unpack(x) -> dict:
        return {k: lo[i] + span[i] * float(x[i]) for i, k in enumerate(names)}

    x0 = [(shared[k] - lo[i]) / span[i] for i, k in enumerate(names)]
    res = minimize(lambda x: rows.loss(unpack(x), idx), x0, method="Powell", bounds=[(0.0, 1.0)] * len(names),
                   options={"xtol": 1e-4, "ftol": 1e-7, "maxfev": 3000})
    if res.fun < best - 1e-9:
        return {k: round(v, 6) for k, v in unpack(res.x).items()}, float(res.fun)
    return shared, best


def source_of(case: Case) -> str:
    return case.row_id.split("-")[0]


def cross_validate(cases: list[Case], sweeps: int = 4, progress=None) -> dict[str, float]:
    """Mean absolute % error of each source's rows predicted by a fit to the other sources."""
    sources = sorted({source_of(c) for c in cases})
    out = {}
    rows = _Rows(cases)
    for src in sources:
        train = [i for i, c in enumerate(cases) if source_of(c) != src]
        test = [i for i, c in enumerate(cases) if source_of(c) == src]
        res = fit(cases, train, sweeps, rows=rows)
        out[src] = rows.loss(res.shared, test)
        if progress:
            progress(f"held out {src}: {out[src]:.1%}")
    return out


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
