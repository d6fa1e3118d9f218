"""The CP-SAT model: the fastest of the candidates (:func:`autopar.search.bound.build_candidates`), with named
constraint groups.

One Boolean per candidate, ``ExactlyOne`` of them; objective Σ step_i·x_i in integer microseconds. This is the
one-hot (linear) form of an element constraint: CP-SAT's presolve spends minutes probing large element/table
constraints over these tables, while the one-hot model solves in milliseconds with its LP relaxation. Constraint
groups, each behind an assumption literal so an infeasible model names the groups to blame:
  world size, min_gpus, tensor parallel, sequence parallel, context parallel, experts, pipeline layers,
  recompute, topology, sharding .... candidates whose mesh breaks the group are off  (Σ x_i = 0)
  batch ........................... global batch = dp·mbs·GA
  interleaving .................... vpp > 1 needs pp > 1 and GA % pp == 0
  hbm capacity .................... Σ mem_i·x_i <= (HBM·(1 − margin) − reserve)/(1 + fragmentation)
Built as the CP-SAT Primer's coding patterns build a model: ``_build_model`` -> ``_add_variables``,
``_add_constraints`` (one group at a time, :meth:`LayoutModel._add_group`), ``_add_objective``. Top-K: re-solve with
the previous answers forbidden (no-good cuts). On infeasibility the blamed groups come from
:func:`autopar.search.explain.binding_groups`. The model is written straight into OR-Tools' CpModelProto
(``cp_model_helper``): the ``cp_model`` convenience layer imports pandas, which doubles the start-up of
``autopar solve``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model_helper as _cp

from autopar.search.explain import binding_groups
from autopar.search.tables import ALL_GROUPS, SCALE_T, Candidates


@dataclass
class CpSolution:
    assignment: tuple[int, int, int, int, int]   # (mesh index in space.meshes, mbs, recompute, vpp, zero) indices
    objective_s: float


@dataclass
class CpResult:
    solutions: list[CpSolution]
    status: str
    gap: float
    solve_s: float
    blamed_groups: list[str] = field(default_factory=list)


class LayoutModel:
    """The CP-SAT model over one set of candidates, written as a CpModelProto. ``enforce``: the groups whose
    assumption literals are assumed (default all; fewer: what-if checks of an explanation)."""

    def __init__(self, cands: Candidates, enforce: tuple[str, ...] = ALL_GROUPS):
        self.cands = cands
        self.proto = _cp.CpModelProto()
        self.lits: dict[str, int] = {}   # group -> index of its assumption literal
        self._build_model(enforce)

    def _build_model(self, enforce: tuple[str, ...]) -> None:
        self._add_variables()
        self._add_constraints()
        self._add_objective()
        self.proto.assumptions.extend(self.lits[g] for g in enforce)

    def _add_variables(self) -> None:
        """One Boolean per candidate (variable i is candidate i), exactly one of them chosen."""
        n = len(self.cands.step_us)
        for _ in range(n):
            self.proto.variables.add().domain.extend((0, 1))
        self.proto.constraints.add().exactly_one.literals.extend(range(n))

    def _add_constraints(self) -> None:
        """Every constraint group of the module docstring, each behind its own assumption literal."""
        for g in ALL_GROUPS:
            self._add_group(g)

    def _add_group(self, g: str) -> None:
        c, m = self.cands, self.proto
        lit = self.lits[g] = len(m.variables)
        m.variables.add().domain.extend((0, 1))
        if g == "hbm capacity":   # Σ mem_i·x_i <= cap
            self._linear(range(len(c.step_us)), c.mem_mib.tolist(), -(2 ** 62), c.mem_cap, lit)
        else:                     # Σ over the candidates breaking the group of x_i = 0
            bad = np.nonzero(c.broken[g])[0].tolist()
            if bad:
                self._linear(bad, [1] * len(bad), 0, 0, lit)

    def _add_objective(self) -> None:
        """Minimise Σ step_i·x_i (integer microseconds)."""
        n = len(self.cands.step_us)
        self.proto.objective.vars.extend(range(n))
        self.proto.objective.coeffs.extend(self.cands.step_us.tolist())

    def _linear(self, idx, coeffs, lo: int, hi: int, enforce: int | None = None) -> None:
        ct = self.proto.constraints.add()
        ct.linear.vars.extend(idx)
        ct.linear.coeffs.extend(coeffs)
        ct.linear.domain.extend((lo, hi))
        if enforce is not None:
            ct.enforcement_literal.append(enforce)

    def solve(self, top_k: int, time_limit_s: float, workers: int = 2) -> CpResult:
        """The top_k fastest candidates (re-solving with no-good cuts), and on infeasibility the minimal set of
        binding groups (:func:`binding_groups`, from CP-SAT's core)."""
        sols: list[CpSolution] = []
        t0 = time.perf_counter()
        status_name, gap, blamed = "INFEASIBLE", 0.0, []
        n = len(self.cands.step_us)
        for rank in range(top_k):
            params = _cp.SatParameters()
            params.max_time_in_seconds = max(0.05, time_limit_s - (time.perf_counter() - t0))
            params.num_workers = workers
            params.random_seed = 0
            solver = _cp.SolveWrapper()
            solver.set_parameters(params)
            r = solver.solve(self.proto)
            st = r.status
            if st not in (_cp.CpSolverStatus.OPTIMAL, _cp.CpSolverStatus.FEASIBLE):
                if rank == 0:
                    status_name = st.name
                    if st == _cp.CpSolverStatus.INFEASIBLE:
                        names = {lit: g for g, lit in self.lits.items()}
                        core = [names[i] for i in r.sufficient_assumptions_for_infeasibility if i in names]
                        blamed = binding_groups(self.cands, core)
                break
            chosen = int(np.argmax(np.fromiter(r.solution, np.int64, count=n)))
            if rank == 0:
                status_name = st.name
                obj = r.objective_value
                gap = (obj - r.best_objective_bound) / max(abs(obj), 1e-9)
            elif st != _cp.CpSolverStatus.OPTIMAL:
                status_name = "FEASIBLE"
            sols.append(CpSolution(tuple(int(v) for v in self.cands.assignment[chosen]), r.objective_value / SCALE_T))
            self._linear([chosen], [1], 0, 0)   # no-good cut: the next solve finds the next-best layout
            if time.perf_counter() - t0 > time_limit_s:
                break
        return CpResult(sols, status_name, gap, time.perf_counter() - t0, blamed)
