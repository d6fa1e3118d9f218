"""The CP-SAT model: the fastest layouts that fit, with named constraint groups.

1. Term tables. For every valid mesh m = (tp, cp, pp, ep, etp) the Estimator's own per-stage functions fill
   tables keyed by the few axes each term depends on (j = micro-batch, r = recompute, k = vpp, z = ZeRO):
     steady[m,j,r] = M·t_mb (compute + tp + cp + ep of the slowest stage)   bubble[m,j,r,k] = (pp−1)·t_mb/v
     p2p[m,j,k]    tail[m,z,j] = max over stages of (exposed DP/FSDP + optimizer)
     per distinct stage s: states[m,z,s] + activations[m,j,r,k,s] + buffers[m,z,j,s]   (memory)
2. Candidates. The tables are summed (numpy broadcasting) into the step time and the fullest stage's memory
   of every (m, j, r, k, z): each is exactly ``Estimator.estimate`` of that layout (tested). Within a mesh and
   a batch/interleaving status only the top_k fastest layouts that fit, and the smallest one that does not,
   can ever be an answer; the rest are dropped (exact pruning, see ``_prune``), and so is every candidate slower
   than the top_k-th fully valid one (an incumbent cutoff).
3. CP-SAT. One Boolean per remaining candidate, ``ExactlyOne`` of them; objective Σ step_i·x_i in integer
   microseconds. This is the one-hot (linear) form of an element constraint: CP-SAT's presolve spends
   minutes probing large element/table constraints over these tables, while the one-hot model solves in
   milliseconds with its LP relaxation. Constraint groups, each behind an assumption literal so an
   infeasible model names the groups to blame:
     world size, min_gpus, tensor parallel, sequence parallel, context parallel, experts, pipeline layers,
     recompute, topology, sharding .... candidates whose mesh breaks the group are off  (Σ x_i = 0)
     batch ........................... global batch = dp·mbs·GA
     interleaving .................... vpp > 1 needs pp > 1 and GA % pp == 0
     hbm capacity .................... Σ mem_i·x_i <= (HBM − reserve)/(1 + fragmentation)
   Top-K: re-solve with the previous answers forbidden (no-good cuts).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from autopar.cost import Estimator
from autopar.cost.memory import (activation_bytes, activation_elems_per_token, buffer_bytes, linear_input_scale,
                                 model_state_bytes)
from autopar.cost.pipeline import p2p_time
from autopar.cost.result import GIB
from autopar.search.space import Space
from autopar.specs.layout import check_layout_groups

SCALE_T = 1e6      # objective unit: microseconds
SCALE_M = 1024.0   # memory unit: MiB
MESH_GROUPS = ("world size", "min_gpus", "tensor parallel", "sequence parallel", "context parallel", "experts",
               "pipeline layers", "recompute", "topology", "sharding")
ALL_GROUPS = MESH_GROUPS + ("batch", "interleaving", "hbm capacity")


@dataclass
class Candidates:
    """Layouts the CP-SAT model chooses from, with their step time, peak memory and broken groups."""

    assignment: np.ndarray      # (n, 5): mesh index in space.meshes, mbs, recompute, vpp, zero indices
    step_us: np.ndarray         # (n,) integer microseconds
    mem_mib: np.ndarray         # (n,) integer MiB, modelled bytes of the fullest stage before the reserve
    broken: dict[str, np.ndarray]  # group -> (n,) bool
    mem_cap: int
    total: int                  # layouts before pruning
    build_s: float = 0.0
    first_problem: dict[str, str] = field(default_factory=dict)


def build_candidates(space: Space, est: Estimator, top_k: int, only_valid_meshes: bool = True) -> Candidates:
    t0 = time.perf_counter()
    J, R, K, Z = len(space.mbs), len(space.recompute), len(space.vpp), len(space.zero)
    hw, tr, prof = space.hardware, space.training, est.profile
    cross = space.options.allow_cross_domain
    first_problem: dict[str, str] = {}
    meshes, mesh_bad = [], []
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
        meshes.append(mi)
        mesh_bad.append(bad)
    nm = len(meshes)
    cap = int((hw.hbm_gib - hw.reserve_gib) / (1 + hw.fragmentation) * SCALE_M)
    if nm == 0:   # every mesh breaks a rule: nothing to choose from (the caller explains why)
        empty = np.zeros(0, np.int64)
        return Candidates(np.zeros((0, 5), np.int64), empty, empty,
                          {g: np.zeros(0, bool) for g in ALL_GROUPS}, cap, 0, time.perf_counter() - t0, first_problem)
    slots = max((len(est.stages(space.layout(mi, 1, "none", 1, 1).stage_layers)) for mi in meshes), default=1)
    steady = np.zeros((nm, J, R))
    bubble = np.zeros((nm, J, R, K))
    p2p = np.zeros((nm, J, K))
    tail = np.zeros((nm, Z, J))
    states = np.zeros((slots, nm, Z))
    act = np.zeros((slots, nm, J, R, K))
    buf = np.zeros((slots, nm, Z, J))
    batch_ok = np.zeros((nm, J), bool)
    inter_ok = np.zeros((nm, J, K), bool)
    B = tr.global_batch
    for pos, mi in enumerate(meshes):
        tp, cp, pp, ep, etp = space.meshes[mi]
        dp = space.gpus // (tp * cp * pp)
        stages = est.stages(space.layout(mi, 1, "none", 1, 1).stage_layers)
        slot_stage = [stages[min(s, len(stages) - 1)] for s in range(slots)]
        for z_i, z in enumerate(space.zero):
            L = space.layout(mi, space.mbs[0], "none", 1, z)
            for s, st in enumerate(slot_stage):
                states[s, pos, z_i] = sum(model_state_bytes(prof, st, L, tr))
        elems = {}
        for r, rc in enumerate(space.recompute):
            L = space.layout(mi, 1, rc, 1, 1)
            for s, st in enumerate(slot_stage):
                elems[r, s] = activation_elems_per_token(prof, st, L, linear_input_scale(tr))
        for j, mbs in enumerate(space.mbs):
            batch_ok[pos, j] = B % (dp * mbs) == 0
            M = max(1, B // (dp * mbs))
            for k, v in enumerate(space.vpp):
                inter_ok[pos, j, k] = v == 1 or (pp > 1 and M % pp == 0)
                p2p[pos, j, k] = p2p_time(space.layout(mi, mbs, "none", v, 1), tr, prof.hidden, hw, est.net)
            t_fwd = {}   # forward time per stage: the same for every recompute policy
            for r, rc in enumerate(space.recompute):
                L = space.layout(mi, mbs, rc, 1, 1)
                t_mb = 0.0
                for st in stages:
                    times = est.stage_times(L, st)
                    t_mb = max(t_mb, times[0] + times[1] + times[2] + times[3])
                    t_fwd[st.index] = times[4]
                steady[pos, j, r] = M * t_mb
                for k, v in enumerate(space.vpp):
                    bubble[pos, j, r, k] = (pp - 1) * t_mb / v
                    Lv = space.layout(mi, mbs, rc, v, 1) if v > 1 else L
                    for s, st in enumerate(slot_stage):
                        act[s, pos, j, r, k] = activation_bytes(prof, st, Lv, tr, elems[r, s])
            for z_i, z in enumerate(space.zero):
                L = space.layout(mi, mbs, "none", 1, z)
                tail[pos, z_i, j] = max(sum(est.stage_tail(L, st, t_fwd[st.index])) for st in stages)
                for s, st in enumerate(slot_stage):
                    buf[s, pos, z_i, j] = buffer_bytes(prof, st, L, tr)
    # Compose every (m, j, r, k, z): axes order of the candidate grid.
    step = (steady[:, :, :, None, None] + bubble[:, :, :, :, None] + p2p[:, :, None, :, None]
            + np.transpose(tail, (0, 2, 1))[:, :, None, None, :])
    mem = (states[:, :, None, None, None, :] + act[:, :, :, :, :, None]
           + np.transpose(buf, (0, 1, 3, 2))[:, :, :, None, None, :]).max(axis=0)
    shape = step.shape
    step_us = np.rint(step * SCALE_T).astype(np.int64).reshape(nm, -1)
    mem_mib = np.ceil(mem / GIB * SCALE_M).astype(np.int64).reshape(nm, -1)
    b_bad = np.broadcast_to(~batch_ok[:, :, None, None, None], shape).reshape(nm, -1)
    i_bad = np.broadcast_to(~inter_ok[:, :, None, :, None], shape).reshape(nm, -1)
    keep = _prune(step_us, mem_mib, b_bad, i_bad, top_k, cap)
    # Cutoff (an incumbent bound, as a branch-and-bound solver would use): when at least top_k candidates break
    # no rule and fit, nothing slower than the top_k-th of them can be an answer.
    all_ok = np.array([not bad for bad in mesh_bad], bool)[:, None] & ~b_bad & ~i_bad & (mem_mib <= cap)
    ok_steps = np.sort(step_us[all_ok])
    if len(ok_steps) >= top_k:
        keep &= step_us <= ok_steps[top_k - 1]
    grid = np.stack(np.unravel_index(np.arange(step_us.shape[1]), shape[1:]), axis=1)   # (J·R·K·Z, 4)
    pos_idx, flat_idx = np.nonzero(keep)
    assignment = np.column_stack([np.asarray(meshes, dtype=np.int64)[pos_idx], grid[flat_idx]]) if nm else \
        np.zeros((0, 5), np.int64)
    broken = {g: np.array([g in mesh_bad[p] for p in pos_idx], bool) for g in MESH_GROUPS}
    broken["batch"] = b_bad[pos_idx, flat_idx]
    broken["interleaving"] = i_bad[pos_idx, flat_idx]
    return Candidates(assignment, step_us[pos_idx, flat_idx], mem_mib[pos_idx, flat_idx], broken, cap,
                      int(step_us.size), time.perf_counter() - t0, first_problem)


def _prune(step: np.ndarray, mem: np.ndarray, b_bad: np.ndarray, i_bad: np.ndarray, top_k: int, cap: int
           ) -> np.ndarray:
    """Candidates that can be an answer, per mesh row and per batch/interleaving status: the top_k fastest
    that fit in HBM, and the smallest that does not fit (so an infeasible model can still blame HBM and the
    memory-minimising explanation finds the true minimum). Exact: any layout left out is slower than top_k
    fitting layouts of the same mesh and status, or is not the smallest of the non-fitting ones."""
    keep = np.zeros_like(step, dtype=bool)
    status = b_bad.astype(np.int8) * 2 + i_bad
    fits = mem <= cap
    order = np.lexsort((np.arange(step.shape[1])[None, :].repeat(step.shape[0], 0), step), axis=1)
    for p in range(step.shape[0]):
        for st in np.unique(status[p]):
            sel = order[p][status[p][order[p]] == st]
            good = sel[fits[p][sel]][:top_k]
            keep[p, good] = True
            over = sel[~fits[p][sel]]
            if len(over):
                keep[p, over[np.argmin(mem[p][over])]] = True
    return keep


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
    """The CP-SAT model over one set of candidates. ``drop`` removes constraint groups (for explanations);
    ``objective='memory'`` minimises the fullest stage's memory instead of the step time."""

    def __init__(self, cands: Candidates, drop: tuple[str, ...] = (), objective: str = "time"):
        self.cands = c = cands
        m = self.model = cp_model.CpModel()
        n = len(c.step_us)
        self.x = [m.NewBoolVar(f"x{i}") for i in range(n)]
        m.AddExactlyOne(self.x)
        self.lits: dict[str, cp_model.IntVar] = {}
        for g in ALL_GROUPS:
            if g in drop:
                continue
            lit = self.lits[g] = m.NewBoolVar(g)
            if g == "hbm capacity":
                m.Add(cp_model.LinearExpr.WeightedSum(self.x, c.mem_mib.tolist()) <= c.mem_cap).OnlyEnforceIf(lit)
            else:
                bad = [self.x[i] for i in np.nonzero(c.broken[g])[0]]
                if bad:
                    m.Add(sum(bad) == 0).OnlyEnforceIf(lit)
        self.objective = objective
        weights = (c.mem_mib if objective == "memory" else c.step_us).tolist()
        m.Minimize(cp_model.LinearExpr.WeightedSum(self.x, weights))

    def _minimal_core(self, core: list[str], workers: int) -> list[str]:
        """Shrink CP-SAT's infeasible assumption set to a minimal one (deletion filter), then add every group that
        is infeasible on its own, so the message names the groups that really bind."""
        m = self.model
        keep = list(core)
        for g in list(core):
            trial = [x for x in keep if x != g]
            m.ClearAssumptions()
            m.AddAssumptions([self.lits[x] for x in trial])
            solver = cp_model.CpSolver()
            solver.parameters.num_workers = workers
            solver.parameters.max_time_in_seconds = 5.0
            if solver.Solve(m) == cp_model.INFEASIBLE:
                keep = trial
        # A minimal core is one explanation among several: also name every group that is infeasible on its own.
        for g in self.lits:
            if g in keep:
                continue
            m.ClearAssumptions()
            m.AddAssumptions([self.lits[g]])
            solver = cp_model.CpSolver()
            solver.parameters.num_workers = workers
            solver.parameters.max_time_in_seconds = 5.0
            if solver.Solve(m) == cp_model.INFEASIBLE:
                keep.append(g)
        m.ClearAssumptions()
        m.AddAssumptions(list(self.lits.values()))
        return keep

    def solve(self, top_k: int, time_limit_s: float, workers: int = 2) -> CpResult:
        m = self.model
        m.AddAssumptions(list(self.lits.values()))
        sols: list[CpSolution] = []
        t0 = time.perf_counter()
        status_name, gap, blamed = "INFEASIBLE", 0.0, []
        scale = SCALE_M if self.objective == "memory" else SCALE_T
        for rank in range(top_k):
            solver = cp_model.CpSolver()
            solver.parameters.max_time_in_seconds = max(0.05, time_limit_s - (time.perf_counter() - t0))
            solver.parameters.num_workers = workers
            solver.parameters.random_seed = 0
            st = solver.Solve(m)
            if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                if rank == 0:
                    status_name = solver.StatusName(st)
                    if st == cp_model.INFEASIBLE:
                        names = {lit.Index(): g for g, lit in self.lits.items()}
                        core = [names[i] for i in solver.SufficientAssumptionsForInfeasibility() if i in names]
                        blamed = self._minimal_core(core, workers)
                break
            chosen = next(i for i, x in enumerate(self.x) if solver.BooleanValue(x))
            if rank == 0:
                status_name = solver.StatusName(st)
                obj = solver.ObjectiveValue()
                gap = (obj - solver.BestObjectiveBound()) / max(abs(obj), 1e-9)
            elif st != cp_model.OPTIMAL:
                status_name = "FEASIBLE"
            sols.append(CpSolution(tuple(int(v) for v in self.cands.assignment[chosen]),
                                   solver.ObjectiveValue() / scale))
            m.Add(self.x[chosen] == 0)   # no-good cut: the next solve finds the next-best layout
            if time.perf_counter() - t0 > time_limit_s:
                break
        return CpResult(sols, status_name, gap, time.perf_counter() - t0, blamed)
