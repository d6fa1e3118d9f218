"""The CP-SAT model: the fastest layouts that fit, over the whole search space, with named constraint groups.

Decision variables (one integer each): ``mesh`` (index of a (tp, cp, pp, ep, etp) world factorisation),
``mbs``, ``recompute``, ``vpp`` and ``zero`` (indices into their candidate lists).

Constraint groups (each behind an assumption literal, so an infeasible model names the groups to blame):
  world size, min_gpus .......... dp = N/(tp·cp·pp), edp = N/(pp·ep·etp) whole; N >= PP·max(TP·CP, EP·ETP)
  tensor parallel ............... heads, KV heads, FFN widths divisible by tp
  sequence parallel, context parallel, experts, pipeline layers, recompute, topology (TP and EP·ETP inside
  the NVLink domain unless crossing is allowed) .. table constraints on ``mesh`` (rules from check_layout)
  batch ......................... global batch = dp·mbs·GA: table on (mesh, mbs)
  interleaving .................. vpp > 1 needs pp > 1 and GA % pp == 0: table on (mesh, mbs, vpp)
  hbm capacity .................. for every distinct pipeline stage: weights+grads+optimizer(mesh, zero)
                                  + activations(mesh, mbs, recompute, vpp) + buffers(mesh, mbs, zero)
                                  <= (HBM − reserve)/(1 + fragmentation)

Objective: the step time of :class:`autopar.cost.Estimator`, as the sum of four element lookups into
precomputed term tables — steady state M·t_mb(mesh, mbs, recompute), bubble(mesh, mbs, recompute, vpp),
p2p(mesh, mbs, vpp), DP + optimizer tail(mesh, zero, mbs) — in integer microseconds. Every table entry comes
from the Estimator's own per-stage term functions, so the objective equals ``estimate(layout)`` up to the
integer rounding (tested).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from autopar.cost import Estimator
from autopar.cost.memory import stage_memory
from autopar.cost.pipeline import p2p_time
from autopar.search.space import Space
from autopar.specs.layout import check_layout_groups

SCALE_T = 1e6      # objective unit: microseconds
SCALE_M = 1024.0   # memory unit: MiB
MESH_GROUPS = ("world size", "min_gpus", "tensor parallel", "sequence parallel", "context parallel", "experts",
               "pipeline layers", "recompute", "topology", "sharding")
ALL_GROUPS = MESH_GROUPS + ("batch", "interleaving", "hbm capacity")


@dataclass
class Tables:
    meshes: list[int]                       # indices into space.meshes that are modelled
    mesh_ok: dict[str, list[int]]           # group -> allowed positions in ``meshes``
    batch_ok: list[tuple[int, int]]
    inter_ok: list[tuple[int, int, int]]
    steady: list[int]
    bubble: list[int]
    p2p: list[int]
    tail: list[int]
    states: list[list[int]]                 # per stage slot
    act: list[list[int]]
    buf: list[list[int]]
    mem_cap: int
    build_s: float = 0.0
    first_problem: dict[str, str] = field(default_factory=dict)  # group -> an example message


def build_tables(space: Space, est: Estimator, only_valid_meshes: bool = True) -> Tables:
    t0 = time.perf_counter()
    J, R, K, Z = len(space.mbs), len(space.recompute), len(space.vpp), len(space.zero)
    hw, tr = space.hardware, space.training
    cross = space.options.allow_cross_domain
    positions: list[int] = []
    mesh_ok: dict[str, list[int]] = {g: [] for g in MESH_GROUPS}
    first_problem: dict[str, str] = {}
    for mi, (tp, cp, pp, ep, etp) in enumerate(space.meshes):
        if space.splits.get(pp) is None:
            first_problem.setdefault("pipeline layers", f"{space.model.num_layers} layers cannot be split over pp={pp}")
            continue
        rep = space.layout(mi, space.mbs[0], space.recompute[0], 1, space.zero[0])
        bad = set()
        for g, msg in check_layout_groups(rep, space.model, tr, space.gpus, hw, cross):
            if g in MESH_GROUPS:
                bad.add(g)
                first_problem.setdefault(g, msg)
        if only_valid_meshes and bad:
            continue
        pos = len(positions)
        positions.append(mi)
        for g in MESH_GROUPS:
            if g not in bad:
                mesh_ok[g].append(pos)
    nm = len(positions)
    slots = max((len(est.stages(space.layout(mi, 1, "none", 1, 1).stage_layers)) for mi in positions), default=1)
    steady, bubble, p2p, tail = [0] * (nm * J * R), [0] * (nm * J * R * K), [0] * (nm * J * K), [0] * (nm * Z * J)
    states = [[0] * (nm * Z) for _ in range(slots)]
    act = [[0] * (nm * J * R * K) for _ in range(slots)]
    buf = [[0] * (nm * Z * J) for _ in range(slots)]
    batch_ok, inter_ok = [], []
    B = tr.global_batch
    for pos, mi in enumerate(positions):
        tp, cp, pp, ep, etp = space.meshes[mi]
        dp = space.gpus // (tp * cp * pp)
        stages = est.stages(space.layout(mi, 1, "none", 1, 1).stage_layers)
        stage_of_slot = [stages[min(s, len(stages) - 1)] for s in range(slots)]
        for z_i, z in enumerate(space.zero):
            L = space.layout(mi, space.mbs[0], "none", 1, z)
            for s, st in enumerate(stage_of_slot):
                m = stage_memory(est.profile, st, L, tr, hw)
                states[s][pos * Z + z_i] = round((m.weights + m.grads + m.optimizer) * SCALE_M)
        for j, mbs in enumerate(space.mbs):
            if B % (dp * mbs) == 0:
                batch_ok.append((pos, j))
            M = max(1, B // (dp * mbs))
            for k, v in enumerate(space.vpp):
                if v == 1 or (pp > 1 and M % pp == 0):
                    inter_ok.append((pos, j, k))
                p2p[(pos * J + j) * K + k] = round(p2p_time(space.layout(mi, mbs, "none", v, 1), tr, est.profile.hidden,
                                                            hw, est.net) * SCALE_T)
            for z_i, z in enumerate(space.zero):
                L = space.layout(mi, mbs, "none", 1, z)
                worst = 0.0
                for st in stages:
                    d, o = est.stage_tail(L, st)
                    worst = max(worst, d + o)
                tail[(pos * Z + z_i) * J + j] = round(worst * SCALE_T)
                for s, st in enumerate(stage_of_slot):
                    buf[s][(pos * Z + z_i) * J + j] = round(stage_memory(est.profile, st, L, tr, hw).buffers * SCALE_M)
            for r, rc in enumerate(space.recompute):
                L = space.layout(mi, mbs, rc, 1, 1)
                t_mb = max(sum(est.stage_times(L, st)[:4]) for st in stages)
                a = (pos * J + j) * R + r
                steady[a] = round(M * t_mb * SCALE_T)
                for k, v in enumerate(space.vpp):
                    bubble[a * K + k] = round((pp - 1) * t_mb / v * SCALE_T)
                    Lv = space.layout(mi, mbs, rc, v, 1) if v > 1 else L
                    for s, st in enumerate(stage_of_slot):
                        act[s][a * K + k] = round(stage_memory(est.profile, st, Lv, tr, hw).activations * SCALE_M)
    cap = int((hw.hbm_gib - hw.reserve_gib) / (1 + hw.fragmentation) * SCALE_M)
    return Tables(positions, mesh_ok, batch_ok, inter_ok, steady, bubble, p2p, tail, states, act, buf, cap,
                  time.perf_counter() - t0, first_problem)


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
    """The CP-SAT model over one space's tables. ``drop`` removes constraint groups (for explanations);
    ``objective='memory'`` minimises the fullest stage's memory instead of the step time."""

    def __init__(self, space: Space, tables: Tables, drop: tuple[str, ...] = (), objective: str = "time"):
        self.space, self.tables = space, tables
        T = tables
        m = self.model = cp_model.CpModel()
        nm = len(T.meshes)
        J, R, K, Z = len(space.mbs), len(space.recompute), len(space.vpp), len(space.zero)
        self.mesh = m.NewIntVar(0, max(nm - 1, 0), "mesh")
        self.j = m.NewIntVar(0, J - 1, "mbs")
        self.r = m.NewIntVar(0, R - 1, "recompute")
        self.k = m.NewIntVar(0, K - 1, "vpp")
        self.z = m.NewIntVar(0, Z - 1, "zero")
        self.lits: dict[str, cp_model.IntVar] = {}

        def group(name: str) -> cp_model.IntVar | None:
            if name in drop:
                return None
            lit = self.lits[name] = m.NewBoolVar(name)
            return lit

        # Named constraint groups -------------------------------------------------------------------------
        for g in MESH_GROUPS:
            lit = group(g)
            if lit is not None:
                m.AddAllowedAssignments([self.mesh], [(p,) for p in T.mesh_ok[g]]).OnlyEnforceIf(lit)
        lit = group("batch")
        if lit is not None:
            m.AddAllowedAssignments([self.mesh, self.j], T.batch_ok).OnlyEnforceIf(lit)
        lit = group("interleaving")
        if lit is not None:
            m.AddAllowedAssignments([self.mesh, self.j, self.k], T.inter_ok).OnlyEnforceIf(lit)

        # Term lookups: table constraints (value, *indices) over the precomputed term tables. CP-SAT
        # propagates tables to arc consistency, far better than element constraints on a computed index.
        def lookup(keys: list, shape: tuple[int, ...], values: list[int], name: str) -> cp_model.IntVar:
            v = m.NewIntVar(min(values, default=0), max(values, default=0), name)
            tuples = []
            for flat, val in enumerate(values):
                idx, rest = [], flat
                for size in reversed(shape):
                    idx.append(rest % size)
                    rest //= size
                tuples.append((*reversed(idx), val))
            m.AddAllowedAssignments([*keys, v], tuples)
            return v

        mesh, j, r, k, z = self.mesh, self.j, self.r, self.k, self.z
        self.step = (lookup([mesh, j, r], (nm, J, R), T.steady, "steady")
                     + lookup([mesh, j, r, k], (nm, J, R, K), T.bubble, "bubble")
                     + lookup([mesh, j, k], (nm, J, K), T.p2p, "p2p")
                     + lookup([mesh, z, j], (nm, Z, J), T.tail, "tail"))
        lit = group("hbm capacity")
        mems = []
        for s in range(len(T.states)):
            mem = (lookup([mesh, z], (nm, Z), T.states[s], f"states{s}")
                   + lookup([mesh, j, r, k], (nm, J, R, K), T.act[s], f"act{s}")
                   + lookup([mesh, z, j], (nm, Z, J), T.buf[s], f"buf{s}"))
            mems.append(mem)
            if lit is not None:
                m.Add(mem <= T.mem_cap).OnlyEnforceIf(lit)
        if objective == "memory":
            peak = m.NewIntVar(0, 10 ** 12, "peak_mem")
            for mem in mems:
                m.Add(peak >= mem)
            m.Minimize(peak)
            self.peak = peak
        else:
            m.Minimize(self.step)
        # Deterministic tie-break hint order: smaller indices first (fewer degrees, smaller mbs).
        m.AddDecisionStrategy([self.mesh, self.j, self.r, self.k, self.z], cp_model.CHOOSE_FIRST,
                              cp_model.SELECT_MIN_VALUE)

    def solve(self, top_k: int, time_limit_s: float, workers: int = 1) -> CpResult:
        m = self.model
        m.AddAssumptions(list(self.lits.values()))
        sols: list[CpSolution] = []
        t0 = time.perf_counter()
        status_name, gap = "INFEASIBLE", 0.0
        blamed: list[str] = []
        for rank in range(top_k):
            solver = cp_model.CpSolver()
            left = time_limit_s - (time.perf_counter() - t0)
            solver.parameters.max_time_in_seconds = max(0.05, left)
            solver.parameters.num_workers = workers
            solver.parameters.random_seed = 0
            st = solver.Solve(m)
            if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                if rank == 0:
                    status_name = solver.StatusName(st)
                    if st == cp_model.INFEASIBLE:
                        idx = {lit.Index(): name for name, lit in self.lits.items()}
                        blamed = [idx[i] for i in solver.SufficientAssumptionsForInfeasibility() if i in idx]
                break
            vals = tuple(int(solver.Value(v)) for v in (self.mesh, self.j, self.r, self.k, self.z))
            if rank == 0:
                status_name = solver.StatusName(st)
                bound = solver.BestObjectiveBound()
                gap = (solver.ObjectiveValue() - bound) / max(abs(solver.ObjectiveValue()), 1e-9)
            obj = solver.ObjectiveValue() / (SCALE_T if not hasattr(self, "peak") else SCALE_M)
            sols.append(CpSolution((self.tables.meshes[vals[0]],) + vals[1:], obj))
            m.AddForbiddenAssignments([self.mesh, self.j, self.r, self.k, self.z], [vals])
            if time.perf_counter() - t0 > time_limit_s:
                status_name = "FEASIBLE" if status_name == "OPTIMAL" and rank + 1 < top_k else status_name
                break
        return CpResult(sols, status_name, gap, time.perf_counter() - t0, blamed)
