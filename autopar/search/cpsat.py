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
   than the top_k-th fully valid one (an incumbent cutoff). Meshes are tabulated in order of a step-time lower
   bound, and a mesh (or a micro-batch/recompute pair of it) that cannot beat the incumbent or cannot fit is not
   timed at all (branch and bound over meshes; exact, see ``build_candidates``).
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
from autopar.cost.estimator import microbatch_seconds
from autopar.cost.memory import (activation_bytes, activation_elems_per_token, buffer_bytes, linear_input_scale,
                                 model_state_bytes)
from autopar.cost.pipeline import p2p_time
from autopar.cost.result import GIB
from autopar.search.space import Space
from autopar.specs.layout import check_layout_groups

SCALE_T = 1e6      # objective unit: microseconds
SCALE_M = 1024.0   # memory unit: MiB
# Placeholders for what the branch and bound did not tabulate (cannot fit, or cannot beat the incumbent): such
# candidates are then cut by the incumbent cutoff, and when there is no incumbent everything is tabulated.
UNREACHABLE_S = 1e9        # step time
UNREACHABLE_BYTES = 1e18   # activations
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
    tabulated_meshes: int = 0   # meshes whose tables were filled (the rest were bounded out)
    valid_meshes: int = 0


def build_candidates(space: Space, est: Estimator, top_k: int, only_valid_meshes: bool = True,
                     bound: bool = True) -> Candidates:
    """Candidates of every valid mesh (see the module docstring).

    With ``bound`` (branch and bound over meshes, exact): meshes are visited in order of a step-time lower bound;
    a mesh's time tables are filled only for the (micro-batch, recompute) pairs that fit in HBM at some vpp and
    ZeRO stage, and only when their lower bound is not slower than the top_k-th fully valid layout found so far.
    Nothing left out could survive the incumbent cutoff below. When fewer than top_k layouts fit, every mesh is
    tabulated after all (the infeasibility explanation needs the smallest misfits)."""
    t0 = time.perf_counter()
    J, R, K, Z = len(space.mbs), len(space.recompute), len(space.vpp), len(space.zero)
    hw, tr = space.hardware, space.training
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
    t = _Tables(space, est, meshes)
    if not (bound and only_valid_meshes):
        for pos in range(nm):
            t.fill(pos)
    else:
        # Bound: recomputation never makes a micro-batch faster, bubble >= (pp-1)·t_mb/max(vpp), p2p and the
        # DP/optimizer tail >= 0. tests/search/test_solver.py checks that bounded and unbounded builds agree.
        cap_bytes = cap / SCALE_M * GIB * (1 + 1e-9)
        time_lb = np.array([t.time_lower_bound(pos) for pos in range(nm)])
        best: list[int] = []   # step_us of the fastest fully valid fitting layouts so far (at most top_k)
        for pos in np.argsort(time_lb, kind="stable"):
            if len(best) >= top_k and np.rint(time_lb[pos] * SCALE_T) > best[top_k - 1] + 1:
                break   # sorted by the bound: no later mesh can beat the incumbent either
            t.fill_memory(pos, cap_bytes, best[top_k - 1] if len(best) >= top_k else None)
            jr = t.smallest_memory(pos) <= cap_bytes   # (mbs, recompute) pairs with some layout that fits
            if not jr.any() or (len(best) >= top_k and
                                np.rint(t.lower_bound_of(pos, jr) * SCALE_T) > best[top_k - 1] + 1):
                continue
            t.fill_time(pos, jr)
            step_us, mem_mib, b_bad, i_bad = t.compose(np.array([pos]))
            ok = ~b_bad & ~i_bad & (mem_mib <= cap)
            best = sorted(best + step_us[ok].tolist())[:top_k]
        if len(best) < top_k:   # too few layouts fit: tabulate everything (explanations need the smallest misfits)
            for pos in range(nm):
                if not t.done[pos] or t.partial[pos] or t.mem_partial[pos]:
                    t.fill(pos)
    rows = np.nonzero(t.done)[0]
    step_us, mem_mib, b_bad, i_bad = t.compose(rows)
    keep = _prune(step_us, mem_mib, b_bad, i_bad, top_k, cap)
    # Cutoff (an incumbent bound, as a branch-and-bound solver would use): when at least top_k candidates break
    # no rule and fit, nothing slower than the top_k-th of them can be an answer.
    all_ok = np.array([not mesh_bad[p] for p in rows], bool)[:, None] & ~b_bad & ~i_bad & (mem_mib <= cap)
    ok_steps = np.sort(step_us[all_ok])
    if len(ok_steps) >= top_k:
        keep &= step_us <= ok_steps[top_k - 1]
    grid = np.stack(np.unravel_index(np.arange(step_us.shape[1]), (J, R, K, Z)), axis=1)   # (J·R·K·Z, 4)
    pos_idx, flat_idx = np.nonzero(keep)
    assignment = np.column_stack([np.asarray(meshes, dtype=np.int64)[rows[pos_idx]], grid[flat_idx]])
    broken = {g: np.array([g in mesh_bad[rows[p]] for p in pos_idx], bool) for g in MESH_GROUPS}
    broken["batch"] = b_bad[pos_idx, flat_idx]
    broken["interleaving"] = i_bad[pos_idx, flat_idx]
    return Candidates(assignment, step_us[pos_idx, flat_idx], mem_mib[pos_idx, flat_idx], broken, cap,
                      nm * J * R * K * Z, time.perf_counter() - t0, first_problem, int(len(rows)), nm)


class _Tables:
    """The term tables of the module docstring, filled one mesh (row ``pos``) at a time."""

    def __init__(self, space: Space, est: Estimator, meshes: list[int]):
        self.space, self.est, self.meshes = space, est, meshes
        nm, J, R, K, Z = len(meshes), len(space.mbs), len(space.recompute), len(space.vpp), len(space.zero)
        self.stages = [est.stages(space.layout(mi, 1, "none", 1, 1).stage_layers) for mi in meshes]
        self.slots = slots = max(len(s) for s in self.stages)
        self.steady = np.zeros((nm, J, R))
        self.bubble = np.zeros((nm, J, R, K))
        self.p2p = np.zeros((nm, J, K))
        self.tail = np.zeros((nm, Z, J))
        self.states = np.zeros((slots, nm, Z))
        self.act = np.zeros((slots, nm, J, R, K))
        self.buf = np.zeros((slots, nm, Z, J))
        self.batch_ok = np.zeros((nm, J), bool)
        self.inter_ok = np.zeros((nm, J, K), bool)
        self.done = np.zeros(nm, bool)      # time tables filled
        self.partial = np.zeros(nm, bool)   # ... only for the (mbs, recompute) pairs that can fit
        self.mem_done = np.zeros(nm, bool)
        self.mem_partial = np.zeros(nm, bool)   # larger micro-batches marked unreachable, not tabulated
        self._lb_by_mbs: dict[int, list[float]] = {}   # pos -> step-time lower bound per micro-batch
        self._elems: dict[int, dict] = {}
        self._times: dict[tuple[int, int, int], tuple[float, dict[int, float]]] = {}   # (pos, j, r) -> t_mb, t_fwd

    def _slot_stage(self, pos: int) -> list:
        stages = self.stages[pos]
        return [stages[min(s, len(stages) - 1)] for s in range(self.slots)]

    def _m(self, pos: int, j: int) -> int:
        tp, cp, pp, _, _ = self.space.meshes[self.meshes[pos]]
        dp = self.space.gpus // (tp * cp * pp)
        return max(1, self.space.training.global_batch // (dp * self.space.mbs[j]))

    def _elems_of(self, pos: int) -> dict:
        """Activation elements per token per (recompute, slot); fills the mesh's model-state table on first use."""
        if pos not in self._elems:
            sp, prof, tr, mi = self.space, self.est.profile, self.space.training, self.meshes[pos]
            slot_stage = self._slot_stage(pos)
            for z_i, z in enumerate(sp.zero):
                L = sp.layout(mi, sp.mbs[0], "none", 1, z)
                for s, st in enumerate(slot_stage):
                    self.states[s, pos, z_i] = sum(model_state_bytes(prof, st, L, tr))
            elems = self._elems[pos] = {}
            for r, rc in enumerate(sp.recompute):
                L = sp.layout(mi, 1, rc, 1, 1)
                for s, st in enumerate(slot_stage):
                    elems[r, s] = activation_elems_per_token(prof, st, L, linear_input_scale(tr))
        return self._elems[pos]

    def _stage_max(self, pos: int, j: int, r: int) -> tuple[float, dict[int, float]]:
        key = (pos, j, r)
        if key not in self._times:
            sp = self.space
            L = sp.layout(self.meshes[pos], sp.mbs[j], sp.recompute[r], 1, 1)
            t_mb, t_fwd = 0.0, {}
            for st in self.stages[pos]:
                times = self.est.stage_times(L, st)
                t_mb = max(t_mb, microbatch_seconds(times))
                t_fwd[st.index] = times[4]
            self._times[key] = (t_mb, t_fwd)
        return self._times[key]

    def _bound(self, pos: int, j: int, r: int) -> float:
        """Step-time lower bound of mesh ``pos`` at micro-batch j and recompute r: M·t_mb + (pp-1)·t_mb/max(vpp)
        (the bubble at the most virtual stages, no p2p, no DP/optimizer tail)."""
        t_mb = self._stage_max(pos, j, r)[0]
        return self._m(pos, j) * t_mb + (self.space.meshes[self.meshes[pos]][2] - 1) * t_mb / max(self.space.vpp)

    def time_lower_bound(self, pos: int) -> float:
        """Seconds no layout of this mesh goes below: the bound without recomputation (it never speeds up a
        micro-batch), at the best micro-batch."""
        sp = self.space
        rs = [sp.recompute.index("none")] if "none" in sp.recompute else range(len(sp.recompute))
        by_mbs = [min(self._bound(pos, j, r) for r in rs) for j in range(len(sp.mbs))]
        self._lb_by_mbs[pos] = by_mbs
        return min(by_mbs)

    def fill(self, pos: int) -> None:
        """Every table of one mesh."""
        self.fill_memory(pos)
        self.fill_time(pos)

    def fill_memory(self, pos: int, cap_bytes: float | None = None, incumbent_us: int | None = None) -> None:
        """Memory tables and batch/interleaving validity of one mesh. With ``cap_bytes``, micro-batches are
        visited in increasing size and the rest are marked unreachable at the first one with nothing that fits:
        activations and buffers never shrink as the micro-batch grows (mbs·min(in-flight, GA) grows while
        GA = B/(dp·mbs) shrinks), so no larger micro-batch fits either. With ``incumbent_us``, a micro-batch
        whose step-time lower bound is slower than the incumbent is marked unreachable without tabulating."""
        if self.mem_done[pos] and not (cap_bytes is None and self.mem_partial[pos]):
            return
        sp, prof, tr = self.space, self.est.profile, self.space.training
        mi = self.meshes[pos]
        tp, cp, pp, _, _ = sp.meshes[mi]
        dp = sp.gpus // (tp * cp * pp)
        slot_stage = self._slot_stage(pos)
        elems = self._elems_of(pos)
        self.mem_partial[pos] = exhausted = False
        for j, mbs in enumerate(sp.mbs):
            self.batch_ok[pos, j] = tr.global_batch % (dp * mbs) == 0
            M = self._m(pos, j)
            for k, v in enumerate(sp.vpp):
                self.inter_ok[pos, j, k] = v == 1 or (pp > 1 and M % pp == 0)
            if exhausted or (incumbent_us is not None and
                             np.rint(self._lb_by_mbs[pos][j] * SCALE_T) > incumbent_us + 1):
                self.act[:, pos, j] = UNREACHABLE_BYTES
                self.mem_partial[pos] = True
                continue
            for r, rc in enumerate(sp.recompute):
                for k, v in enumerate(sp.vpp):
                    Lv = sp.layout(mi, mbs, rc, v, 1)
                    for s, st in enumerate(slot_stage):
                        self.act[s, pos, j, r, k] = activation_bytes(prof, st, Lv, tr, elems[r, s])
            for z_i, z in enumerate(sp.zero):
                L = sp.layout(mi, mbs, "none", 1, z)
                for s, st in enumerate(slot_stage):
                    self.buf[s, pos, z_i, j] = buffer_bytes(prof, st, L, tr)
            if cap_bytes is not None and self.smallest_memory(pos)[j].min() > cap_bytes:
                exhausted = True
        self.mem_done[pos] = True

    def smallest_memory(self, pos: int) -> np.ndarray:
        """(J, R) bytes of the fullest stage at the best vpp and ZeRO stage, per micro-batch and recompute."""
        mem = (self.states[:, pos][:, None, None, None, :] + self.act[:, pos][:, :, :, :, None]
               + np.transpose(self.buf[:, pos], (0, 2, 1))[:, :, None, None, :]).max(axis=0)
        return mem.min(axis=(2, 3))

    def lower_bound_of(self, pos: int, jr: np.ndarray) -> float:
        """Step-time lower bound over the (micro-batch, recompute) pairs marked in ``jr`` (J, R)."""
        return min((self._bound(pos, int(j), int(r)) for j, r in zip(*np.nonzero(jr))), default=float("inf"))

    def fill_time(self, pos: int, jr: np.ndarray | None = None) -> None:
        """Time tables of one mesh, for the (micro-batch, recompute) pairs marked in ``jr`` (default: all); the
        others get an unreachable step time (only used once an incumbent makes them irrelevant)."""
        sp, est, prof, tr, hw = self.space, self.est, self.est.profile, self.space.training, self.space.hardware
        mi = self.meshes[pos]
        pp = sp.meshes[mi][2]
        stages = self.stages[pos]
        for j, mbs in enumerate(sp.mbs):
            M = self._m(pos, j)
            for k, v in enumerate(sp.vpp):
                self.p2p[pos, j, k] = p2p_time(sp.layout(mi, mbs, "none", v, 1), tr, prof.hidden, hw, est.net)
            t_fwd = None   # forward time per stage: the same for every recompute policy
            for r in range(len(sp.recompute)):
                if jr is not None and not jr[j, r]:
                    self.steady[pos, j, r] = UNREACHABLE_S
                    continue
                t_mb, t_fwd = self._stage_max(pos, j, r)
                self.steady[pos, j, r] = M * t_mb
                for k, v in enumerate(sp.vpp):
                    self.bubble[pos, j, r, k] = (pp - 1) * t_mb / v
            for z_i, z in enumerate(sp.zero):
                L = sp.layout(mi, mbs, "none", 1, z)
                self.tail[pos, z_i, j] = 0.0 if t_fwd is None else \
                    max(sum(est.stage_tail(L, st, t_fwd[st.index])) for st in stages)
        self.done[pos] = True
        self.partial[pos] = jr is not None and not jr.all()

    def compose(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step time (us), fullest stage's memory (MiB) and batch/interleaving breakage of every (m, j, r, k, z)
        of the given rows: axes order of the candidate grid."""
        n = len(rows)
        step = (self.steady[rows][:, :, :, None, None] + self.bubble[rows][:, :, :, :, None]
                + self.p2p[rows][:, :, None, :, None] + np.transpose(self.tail[rows], (0, 2, 1))[:, :, None, None, :])
        mem = (self.states[:, rows][:, :, None, None, None, :] + self.act[:, rows][:, :, :, :, :, None]
               + np.transpose(self.buf[:, rows], (0, 1, 3, 2))[:, :, :, None, None, :]).max(axis=0)
        shape = step.shape
        # Clipped at the placeholders (a step of 31 years, 1 EB of memory) so that absurd but valid inputs (a
        # hardware file with a GFLOP/s chip and a 16M-token sequence) stay integers CP-SAT can sum without overflow.
        step_us = np.rint(np.minimum(np.nan_to_num(step, nan=UNREACHABLE_S), UNREACHABLE_S) * SCALE_T
                          ).astype(np.int64).reshape(n, -1)
        mem_mib = np.ceil(np.minimum(np.nan_to_num(mem, nan=UNREACHABLE_BYTES), UNREACHABLE_BYTES) / GIB * SCALE_M
                          ).astype(np.int64).reshape(n, -1)
        b_bad = np.broadcast_to(~self.batch_ok[rows][:, :, None, None, None], shape).reshape(n, -1)
        i_bad = np.broadcast_to(~self.inter_ok[rows][:, :, None, :, None], shape).reshape(n, -1)
        return step_us, mem_mib, b_bad, i_bad


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
