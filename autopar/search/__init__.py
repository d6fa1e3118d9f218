"""Search for the fastest layouts that fit: CP-SAT (default), exhaustive (reference) and heuristic (baseline)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from autopar.cost import Estimator
from autopar.errors import AutoparInputError
from autopar.search.bound import build_candidates
from autopar.search.cpsat import LayoutModel
from autopar.search.explain import explain_infeasible
from autopar.search.exhaustive import exhaustive_search
from autopar.search.plan import Plan
from autopar.search.space import SearchOptions, build_space
from autopar.specs.hardware import HardwareSpec
from autopar.specs.loaders import load_hardware, load_model
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

__all__ = ["Plan", "SearchOptions", "SolveResult", "solve"]


@dataclass
class SolveResult:
    """What a search found. ``plans`` are ranked by predicted step time (best first)."""

    plans: list[Plan]
    status: str                 # OPTIMAL | FEASIBLE | INFEASIBLE | EXHAUSTIVE | HEURISTIC
    gap: float
    solve_s: float
    space_size: int
    meshes: int
    method: str
    heuristic: Plan | None = None
    heuristic_reasons: list[str] = field(default_factory=list)
    explanation: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    memory_margin: float = 0.0  # share of HBM the search kept free beyond the memory model
    # the Estimator the plans were priced with (its memos kept: pricing more layouts of the same problem reuses them)
    estimator: Estimator | None = field(default=None, repr=False, compare=False)

    def status_text(self) -> str:
        """The status as a person should read it: OPTIMAL with its gap; FEASIBLE (the time limit stopped CP-SAT or
        the branch and bound) says that the ranking is not proven, and prints a gap only where a bound proves one,
        never a bare "gap 0.00%" that reads as proof."""
        if self.status != "FEASIBLE":
            return f"status {self.status}" + (f", gap {self.gap:.2%}" if self.method == "cpsat" else "")
        bound = f"#1 within {self.gap:.2%} of the best bound" if self.gap > 0 else "no bound on #1's gap"
        return f"status FEASIBLE (the time limit stopped the search: not proven optimal; {bound})"

    def to_dict(self) -> dict:
        return {"status": self.status, "gap": self.gap, "solve_s": self.solve_s, "space_size": self.space_size,
                "memory_margin": self.memory_margin,
                "meshes": self.meshes, "method": self.method, "plans": [p.to_dict() for p in self.plans],
                "heuristic": self.heuristic.to_dict() if self.heuristic else None,
                "heuristic_reasons": self.heuristic_reasons, "explanation": self.explanation, "notes": self.notes}


def _heuristic(model, hardware, training, gpus, est: Estimator) -> tuple[Plan | None, list[str]]:
    try:
        from autopar.search.heuristic import heuristic_layout_with_reasons
        layout, reasons = heuristic_layout_with_reasons(model, hardware, training, gpus)
    except (AutoparInputError, ImportError) as err:
        return None, [f"no heuristic layout: {err}"]
    return Plan(0, est.estimate(layout, resolved=True), "heuristic"), reasons


def solve(model: ModelSpec | str | Path, hardware: HardwareSpec | str | Path, training: TrainingSpec, gpus: int,
          options: SearchOptions | None = None, *, method: str = "cpsat", explain: bool = True,
          with_heuristic: bool = True, progress=None) -> SolveResult:
    """The fastest layouts that fit, ranked. Every plan is re-scored with the exact float ``estimate``.
    ``options.time_limit_s`` bounds the whole call (table build, CP-SAT and the infeasibility explanation): a
    branch and bound stopped by it answers FEASIBLE with the gap to the bound of what it did not visit."""
    model, hardware = load_model(model), load_hardware(hardware)
    options = options or SearchOptions()
    if method not in ("cpsat", "exhaustive", "heuristic"):
        raise AutoparInputError(f"unknown search method '{method}' (choose cpsat, exhaustive or heuristic)")
    t0 = time.perf_counter()
    deadline = t0 + options.time_limit_s   # the whole search, infeasibility explanation included
    est = Estimator(model, hardware, training, gpus)
    space = build_space(model, hardware, training, gpus, options)
    if not space.meshes:
        pins = ", ".join(f"{k}={v}" for k, v in options.pinned().items()) or "none"
        raise AutoparInputError(f"no (tp, cp, pp, ep, etp) factorises {gpus} GPUs with the pins given ({pins}): "
                                "each degree must divide the GPU count")
    heur, reasons = _heuristic(model, hardware, training, gpus, est) if with_heuristic else (None, [])
    explanation: list[str] = []
    notes: list[str] = []
    if method == "heuristic":
        plans = [heur] if heur else []
        status, gap = "HEURISTIC", 0.0
    elif method == "exhaustive":
        found, _ = exhaustive_search(space, est, options.top_k)
        plans = [Plan(i + 1, e, "exhaustive") for i, e in enumerate(found)]
        status, gap = "EXHAUSTIVE", 0.0
    else:
        if progress:
            progress(f"building cost tables for {len(space.meshes)} meshes x {space.size // max(len(space.meshes), 1)} "
                     "knob settings")
        cands = build_candidates(space, est, options.top_k, deadline=deadline)
        res = None
        if len(cands.step_us):
            if progress:
                progress(f"solving CP-SAT over {len(cands.step_us):,} candidate layouts (of {cands.total:,} on "
                         f"{cands.valid_meshes:,} valid meshes; {cands.tabulated_meshes:,} meshes tabulated after "
                         "branch and bound, then exact Pareto pruning)")
            res = LayoutModel(cands).solve(options.top_k, max(0.1, deadline - time.perf_counter()), options.workers)
        plans = []
        for sol in res.solutions if res else []:
            a = sol.assignment
            L = space.layout(a[0], space.mbs[a[1]], space.recompute[a[2]], space.vpp[a[3]], space.zero[a[4]])
            plans.append(Plan(0, est.estimate(L, resolved=True), "cpsat", objective_s=sol.objective_s))
        plans.sort(key=lambda p: (p.estimate.step_time_s, p.layout.short()))
        for i, p in enumerate(plans):
            p.rank = i + 1
        status = res.status if res else "INFEASIBLE"
        gap = res.gap if res else 0.0
        if cands.stopped_bound_s is not None and plans:   # the time limit stopped the branch and bound
            status = "FEASIBLE"
            best = plans[0].estimate.step_time_s
            gap = max(gap, (best - cands.stopped_bound_s) / best)
            notes.append(f"the time limit stopped the search after {cands.tabulated_meshes:,} of "
                         f"{cands.valid_meshes:,} meshes; no layout left unvisited is faster than "
                         f"{cands.stopped_bound_s:.3f} s/step")
        if not plans and explain:
            blamed = res.blamed_groups if res else sorted(cands.first_problem)
            explanation = explain_infeasible(space, est, cands, blamed, deadline, solve=solve)
    return SolveResult(plans, status, gap, time.perf_counter() - t0, space.size, len(space.meshes), method,
                       heur, reasons, explanation, notes, options.memory_margin, est)
