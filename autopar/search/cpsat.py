"""The CP-SAT model: the fastest layouts that fit, with named constraint groups.

1. Term tables. For every valid mesh m = (tp, cp, pp, ep, etp) the Estimator's own per-stage functions fill
   tables keyed by the few axes each term depends on (j = micro-batch, r = recompute, k = vpp, z = ZeRO):
     t_mb[m,j,r] (compute + tp + cp + ep + offload of the slowest stage, ``Estimator.stage_times``)
     t_mb_v[m,j,r] the same with virtual stages (vpp > 1): it differs only where the EP all-to-all overlap needs
        them (MoE, EP > 1, PP > 1: ``autopar.cost.ep.ep_overlap_blockers``), and is timed only there
     p2p[m,j,k] (``p2p_time``)      tail[m,z,j] = max over stages of ``Estimator.stage_tail`` (DP/FSDP + optimizer)
     per distinct stage s: states[m,z,s] + max(activations[m,j,r,k,s] + buffers[m,z,j,s], step copy[m,z,s])
     (memory; the optimizer step's fp32 gradient copy, ``step_grad_copy_bytes``)
   The memory and tail terms are filled one mesh per call: the term functions (``model_state_bytes``,
   ``activation_bytes``, ``buffer_bytes``, ``stage_tail``, ``p2p_time``) take the knobs that vary inside a mesh
   as numpy arrays (``Space.layout_grid``). ``stage_times`` (compute) is called per (mesh, micro-batch, recompute).
2. Candidates. ``step_seconds`` (the cost model's sum of the terms) over the broadcast tables gives the step time,
   and the fullest stage's memory, of every (m, j, r, k, z): each is exactly ``Estimator.estimate`` of that
   layout (tested). Within a mesh and a batch/interleaving status only the top_k fastest layouts that fit, and the
   smallest one that does not, can ever be an answer; the rest are dropped (exact pruning, see ``_prune``), and
   so is every candidate slower than the top_k-th fully valid one (an incumbent cutoff). Meshes are tabulated in
   order of a step-time lower bound, and a mesh (or a micro-batch/recompute pair of it) that cannot beat the
   incumbent or cannot fit is not timed at all (branch and bound over meshes; exact, see ``build_candidates``).
3. CP-SAT. One Boolean per remaining candidate, ``ExactlyOne`` of them; objective Σ step_i·x_i in integer
   microseconds. This is the one-hot (linear) form of an element constraint: CP-SAT's presolve spends
   minutes probing large element/table constraints over these tables, while the one-hot model solves in
   milliseconds with its LP relaxation. Constraint groups, each behind an assumption literal so an
   infeasible model names the groups to blame:
     world size, min_gpus, tensor parallel, sequence parallel, context parallel, experts, pipeline layers,
     recompute, topology, sharding .... candidates whose mesh breaks the group are off  (Σ x_i = 0)
     batch ........................... global batch = dp·mbs·GA
     interleaving .................... vpp > 1 needs pp > 1 and GA % pp == 0
     hbm capacity .................... Σ mem_i·x_i <= (HBM·(1 − margin) − reserve)/(1 + fragmentation)
   Top-K: re-solve with the previous answers forbidden (no-good cuts). The model is written straight into
   OR-Tools' CpModelProto (``cp_model_helper``): the ``cp_model`` convenience layer imports pandas, which
   doubles the start-up of ``autopar solve``.
4. Infeasibility, from the same candidates (no re-solve): a set of groups is infeasible exactly when every
   candidate breaks one of them (a hitting set over the candidates' broken groups, which pruning keeps
   intact). ``binding_groups`` shrinks CP-SAT's core to a minimal one with that test and adds every group that
   is infeasible on its own; ``smallest_memory_candidate`` is the least memory over candidates that break no
   other group; ``layout_fits`` answers "does anything fit on N GPUs" from the memory tables alone.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
from ortools.sat.python import cp_model_helper as _cp

from autopar.cost import Estimator
from autopar.cost.estimator import microbatch_seconds, step_seconds
from autopar.cost.memory import (activation_bytes, activation_elems_per_token, buffer_bytes, linear_input_scale,
                                 model_state_bytes, step_grad_copy_bytes)
from autopar.cost.pipeline import p2p_time
from autopar.cost.result import GIB
from autopar.search.space import Space
from autopar.specs.layout import check_layout_groups, max_vpp

SCALE_T = 1e6      # objective unit: microseconds
SCALE_M = 1024.0   # memory unit: MiB
# Placeholder micro-batch time for what the branch and bound did not time (cannot fit, or cannot beat the
# incumbent): such candidates are then cut by the incumbent cutoff, or, when nothing fits, never chosen. Also the
# clip for absurd but valid inputs (31 years of step time, 1 EB of memory): still integers CP-SAT sums safely.
UNREACHABLE_S = 1e9
UNREACHABLE_BYTES = 1e18
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
    # The deadline stopped the branch and bound: seconds no unvisited mesh goes below (None: not stopped)
    stopped_bound_s: float | None = None

    def violations(self) -> dict[str, np.ndarray]:
        """group -> (n,) bool: the candidate breaks the group (HBM: does not fit)."""
        v = {g: self.broken[g] for g in ALL_GROUPS if g != "hbm capacity"}
        v["hbm capacity"] = self.mem_mib > self.mem_cap
        return v


def _mesh_validity(space: Space, only_valid_meshes: bool = True) -> tuple[list[int], list[set], dict[str, str]]:
    """(mesh indices to tabulate, the mesh groups each breaks, the first message per broken group)."""
    first_problem: dict[str, str] = {}
    meshes, mesh_bad = [], []
    cross = space.options.allow_cross_domain
    for mi, (tp, cp, pp, ep, etp) in enumerate(space.meshes):
        if space.splits.get(pp) is None:
            first_problem.setdefault("pipeline layers", f"{space.model.num_layers} layers cannot be split over pp={pp}")
            continue
        rep = space.layout(mi, space.mbs[0], space.recompute[0], 1, space.zero[0])
        bad = set()
        for g, msg in check_layout_groups(rep, space.model, space.training, space.gpus, space.hardware, cross):
            if g in MESH_GROUPS:
                bad.add(g)
                first_problem.setdefault(g, msg)
        if only_valid_meshes and bad:
            continue
        meshes.append(mi)
        mesh_bad.append(bad)
    return meshes, mesh_bad, first_problem


def _cap_mib(space: Space) -> int:
    """The modelled bytes (before the reserve) that keep a layout's total within ``space.usable_hbm_gib``."""
    hw = space.hardware
    return int((space.usable_hbm_gib - hw.reserve_gib) / (1 + hw.fragmentation) * SCALE_M)


def build_candidates(space: Space, est: Estimator, top_k: int, only_valid_meshes: bool = True,
                     bound: bool = True, deadline: float | None = None) -> Candidates:
    """Candidates of every valid mesh (see the module docstring).

    With ``bound`` (branch and bound over meshes, exact): meshes are visited in order of a step-time lower bound;
    a mesh's memory tables are filled whole (vectorised), its time tables only for the (micro-batch, recompute)
    pairs that fit in HBM at some vpp and ZeRO stage, and only when their lower bound is not slower than the
    top_k-th fully valid layout found so far. Nothing left out could survive the incumbent cutoff below. When
    nothing fits, no mesh is timed at all (the explanation needs memory only). ``deadline``
    (``time.perf_counter()`` seconds) stops the visit early with the lower bound of what was left
    (``stopped_bound_s``)."""
    t0 = time.perf_counter()
    J, R, K, Z = len(space.mbs), len(space.recompute), len(space.vpp), len(space.zero)
    meshes, mesh_bad, first_problem = _mesh_validity(space, only_valid_meshes)
    nm = len(meshes)
    cap = _cap_mib(space)
    if nm == 0:   # every mesh breaks a rule: nothing to choose from (the caller explains why)
        empty = np.zeros(0, np.int64)
        return Candidates(np.zeros((0, 5), np.int64), empty, empty,
                          {g: np.zeros(0, bool) for g in ALL_GROUPS}, cap, 0, time.perf_counter() - t0, first_problem)
    t = _Tables(space, est, meshes)
    stopped = None
    if not (bound and only_valid_meshes):
        for pos in range(nm):
            t.fill(pos)
    else:
        # 1. Memory of every mesh, vectorised over the meshes of one pipeline depth; the (micro-batch,
        #    recompute) pairs with some fully valid layout (batch, interleaving) that fits.
        fit = t.fit_pairs(cap)   # (nm, J, R): some fully valid layout of the pair fits
        fit_jr = {pos: fit[pos] for pos in range(nm) if fit[pos].any()}
        any_fit = bool(fit_jr)
        if any_fit:   # (when nothing fits, nothing is timed: the explanation needs memory only)
            # 2. Branch and bound over the meshes that can fit, in order of a step-time lower bound of their
            #    (micro-batch, recompute) pairs that fit (see _bound): bubble + p2p at the best valid vpp, plus the
            #    least DP/optimizer tail over the ZeRO stages (_tail). That bound times every stage of the mesh, so
            #    a cheaper floor under it comes first (the layers' kernels alone, see floors), and each micro-batch's
            #    key is raised (refine) only when it is the lowest key left: meshes are still visited in the order
            #    of their bounds. A mesh visited times only the pairs whose bound can beat the incumbent. Every
            #    layout that can beat the final incumbent is tabulated whatever the order, so the candidates after
            #    the cutoff do not depend on the bounds used.
            #    tests/search/test_solver.py checks that bounded and unbounded builds agree.
            fitting = list(fit_jr)
            t.start_bounds(fitting, fit[fitting])
            heap = [(t.key(pos)[0], i) for i, pos in enumerate(fitting)]
            heapq.heapify(heap)
            best: list[int] = []   # step_us of the fastest fully valid fitting layouts so far (at most top_k)
            while heap:
                key, i = heap[0]
                pos = fitting[i]
                incumbent = best[top_k - 1] if len(best) >= top_k else None
                if incumbent is not None and np.rint(key * SCALE_T) > incumbent + 1:
                    break   # the lowest key left: no mesh left can beat the incumbent
                j = t.key(pos)[1]
                if j is not None:   # the mesh's lowest key is below its full bound: raise it
                    t.refine(pos, j)
                    heapq.heapreplace(heap, (t.key(pos)[0], i))
                    continue
                if deadline is not None and best and time.perf_counter() > deadline:
                    stopped = key
                    break
                heapq.heappop(heap)
                jr = fit_jr[pos] if incumbent is None else t.pairs_within(pos, fit_jr[pos], incumbent + 1)
                if not jr.any():
                    continue
                t.fill_time(pos, jr)
                step_us, mem_mib, b_bad, i_bad = t.compose(np.array([pos]))
                ok = ~b_bad & ~i_bad & (mem_mib <= cap)
                best = sorted(best + step_us[ok].tolist())[:top_k]
    # candidates: the meshes timed; when nothing fits (or without bound), every mesh
    rows = np.nonzero(t.done)[0] if t.done.any() else np.nonzero(t.mem_done)[0]
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
                      nm * J * R * K * Z, time.perf_counter() - t0, first_problem, int(t.done.sum()), nm, stopped)


def layout_fits(space: Space, est: Estimator, deadline: float | None = None) -> bool | None:
    """Whether some valid layout of the space fits in HBM, from the memory tables alone (no timing, no solve):
    meshes are visited by pipeline depth, deepest first, and the first fit answers. None when ``deadline`` passed
    first."""
    meshes, _, _ = _mesh_validity(space)
    if not meshes:
        return False
    t = _Tables(space, est, meshes)
    cap = _cap_mib(space)
    for group in t.by_depth():
        if deadline is not None and time.perf_counter() > deadline:
            return None
        t.fill_memory(group)
        _, mem_mib, b_bad, i_bad = t.compose(group, with_time=False)
        if (~b_bad & ~i_bad & (mem_mib <= cap)).any():
            return True
    return False


class _Tables:
    """The term tables of the module docstring: memory filled per pipeline depth (all its meshes at once), time
    one mesh (row ``pos``) at a time."""

    def __init__(self, space: Space, est: Estimator, meshes: list[int]):
        self.space, self.est, self.meshes = space, est, meshes
        nm, J, R, K, Z = len(meshes), len(space.mbs), len(space.recompute), len(space.vpp), len(space.zero)
        self.splits = [space.stage_layers(space.meshes[mi][2]) for mi in meshes]
        self.stages = [est.stages(split) for split in self.splits]
        self.slots = slots = max(len(s) for s in self.stages)
        deg = np.array([space.meshes[mi] for mi in meshes], np.int64).reshape(nm, 5)
        self.pp = deg[:, 2]
        self.dp = space.gpus // (deg[:, 0] * deg[:, 1] * deg[:, 2])
        self.mbs, self.vpp, self.zero = (np.array(space.mbs), np.array(space.vpp), np.array(space.zero))
        self.M = np.maximum(1, space.training.global_batch // (self.dp[:, None] * self.mbs[None, :]))   # (nm, J)
        self.t_mb = np.full((nm, J, R), UNREACHABLE_S)
        self.t_mb_v = np.full((nm, J, R), UNREACHABLE_S)   # with vpp > 1 (== t_mb unless _vpp_matters)
        ep_on = est.model.is_moe and space.training.ep_comm_overlap and any(v > 1 for v in space.vpp)
        self._vpp_matters = ep_on & (deg[:, 2] > 1) & (deg[:, 3] > 1)      # (nm,)
        self.p2p = np.zeros((nm, J, K))
        self.tail = np.zeros((nm, Z, J))
        self.states = np.zeros((slots, nm, Z))
        self.act = np.zeros((slots, nm, J, R, K))
        self.buf = np.zeros((slots, nm, Z, J))
        self.copy = np.zeros((slots, nm, Z))    # the optimizer step's fp32 gradient copy
        self.batch_ok = np.zeros((nm, J), bool)
        self.inter_ok = np.zeros((nm, J, K), bool)
        self.done = np.zeros(nm, bool)      # time tables filled
        self.mem_done = np.zeros(nm, bool)
        self._elems_cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._p2p_bound: dict[int, np.ndarray] = {}   # pos -> p2p (J, K)
        self.lb_by_mbs: dict[int, np.ndarray] = {}    # pos -> step-time lower bound per micro-batch (see _level)
        self._floor: dict[int, np.ndarray] = {}       # pos -> step-time floor per micro-batch
        self._fit: dict[int, np.ndarray] = {}         # pos -> (micro-batch, recompute) pairs that can fit
        self._level: dict[int, np.ndarray] = {}       # pos -> per micro-batch: 0 floor, 1 bound, 2 bound + tail
        self._tails: dict[tuple[int, int], np.ndarray] = {}   # (pos, j) -> DP/optimizer tail per ZeRO stage
        self._kernel_s: dict[tuple, np.ndarray] = {}  # (tp, cp, ep, etp, r) -> layer seconds (J, kinds)
        self._kinds_of: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}   # split -> layers per kind and stage
        self._times: dict[tuple, tuple[float, dict[int, float]]] = {}   # (pos, j, r, vpp>1) -> t_mb, t_fwd

    def _slot_stage(self, pos: int) -> list:
        stages = self.stages[pos]
        return [stages[min(s, len(stages) - 1)] for s in range(self.slots)]

    def _stage_max(self, pos: int, j: int, r: int, interleaved: bool = False) -> tuple[float, dict[int, float]]:
        """(t_mb of the slowest stage, forward compute time per stage) at micro-batch j and recompute r, without
        (or, ``interleaved``, with) virtual stages: only the EP overlap's blockers tell them apart."""
        interleaved = bool(interleaved and self._vpp_matters[pos])
        key = (pos, j, r, interleaved)
        if key not in self._times:
            sp = self.space
            L = sp.layout(self.meshes[pos], sp.mbs[j], sp.recompute[r], 2 if interleaved else 1, 1)
            t_mb, t_fwd = 0.0, {}
            for st in self.stages[pos]:
                times = self.est.stage_times(L, st)
                t_mb = max(t_mb, microbatch_seconds(times))
                t_fwd[st.index] = times[4]
            self._times[key] = (t_mb, t_fwd)
        return self._times[key]

    def _bound(self, pos: int, j: int, r: int) -> float:
        """Step-time lower bound of mesh ``pos`` at micro-batch j and recompute r: ``step_seconds`` at the best valid
        vpp with the real p2p and no DP/optimizer tail. (A tail bound, the best ZeRO stage's optimizer step, timed
        no fewer meshes on the zoo and cost more than it saved.)"""
        if pos not in self._p2p_bound:
            sp = self.space
            p2p = p2p_time(sp.layout_grid([self.meshes[pos]], None, "none", micro_batch=self.mbs[:, None],
                                          vpp=self.vpp[None, :]), sp.training, self.est.profile.hidden, sp.hardware,
                           self.est.net)
            self._p2p_bound[pos] = np.broadcast_to(p2p, (len(sp.mbs), len(sp.vpp)))
        lb = SimpleNamespace(grad_accum=self.M[pos, j], pp=self.pp[pos], vpp=self.vpp)
        t_mb = np.where(self.vpp > 1, self._stage_max(pos, j, r, True)[0], self._stage_max(pos, j, r)[0])
        steps = step_seconds(lb, t_mb, self._p2p_bound[pos][j], 0.0)
        return float(np.min(np.where(self.inter_ok[pos, j], steps, np.inf)))   # over the valid interleavings

    def _layer_kernels(self, pos: int, r: int) -> np.ndarray:
        """(J, kinds): ``Estimator.layer_seconds`` of one layer of each kind per micro-batch at recompute r. A layer's
        kernels depend on tp, cp, ep, etp, the micro-batch and recompute, not on pp or dp (``compute.layer_parts``):
        priced once per (tp, cp, ep, etp, r) and shared by the pipeline depths."""
        sp = self.space
        mi = self.meshes[pos]
        tp, cp, _, ep, etp = sp.meshes[mi]
        hit = self._kernel_s.get((tp, cp, ep, etp, r))
        if hit is None:
            kinds = range(len(self.est.profile.kinds))
            hit = self._kernel_s[(tp, cp, ep, etp, r)] = np.array(
                [[self.est.layer_seconds(L, k) for k in kinds] for L in
                 (sp.layout(mi, b, sp.recompute[r], 1, 1) for b in sp.mbs)])
        return hit

    def _stage_kinds(self, pos: int) -> tuple[np.ndarray, np.ndarray]:
        """(layers of each kind per distinct stage (S, kinds), layers per stage (S,)) of the mesh's split."""
        split = self.splits[pos]
        hit = self._kinds_of.get(split)
        if hit is None:
            stages, prof = self.stages[pos], self.est.profile
            counts = np.zeros((len(stages), len(prof.kinds)))
            for s, st in enumerate(stages):
                for k, n in prof.kind_counts(st.first, st.last):
                    counts[s, k] = n
            hit = self._kinds_of[split] = (counts, np.array([st.n_layers for st in stages], float))
        return hit

    def floors(self, positions: list[int], r: int) -> np.ndarray:
        """(n, J): a step-time floor of each mesh and micro-batch at recompute r, never above :meth:`_bound` and
        without a call of ``stage_times``: ``step_seconds`` with t_mb replaced by the slowest stage's layers
        alone, each priced by ``Estimator.layer_seconds`` plus ``layer_overhead_s`` (``stage_times`` adds the
        head, the embedding gradient and the TP/CP/EP/offload communication, none negative, and ``step_seconds``
        grows with t_mb), no p2p, no tail, at the best valid vpp (inf: none valid)."""
        if not positions:
            return np.zeros((0, len(self.space.mbs)))
        layer_s = np.stack([self._layer_kernels(p, r) for p in positions])   # (n, J, kinds)
        t_floor = np.zeros(layer_s.shape[:2])
        for split in dict.fromkeys(self.splits[p] for p in positions):   # meshes of one split share their stages
            sel = np.array([self.splits[p] == split for p in positions])
            counts, n_layers = self._stage_kinds(positions[int(np.argmax(sel))])
            t_floor[sel] = (layer_s[sel] @ counts.T + n_layers * self.est.layer_overhead_s).max(axis=2)
        # 1e-9: the floor sums in another order than stage_times; keep it below the bound in floating point too
        t_floor *= 1.0 - 1e-9
        pos = np.asarray(positions, np.int64)
        grid = SimpleNamespace(grad_accum=self.M[pos][:, :, None], pp=self.pp[pos][:, None, None],
                               vpp=self.vpp[None, None, :])
        return np.where(self.inter_ok[pos], step_seconds(grid, t_floor[:, :, None], 0.0, 0.0), np.inf).min(axis=2)

    def start_bounds(self, positions: list[int], fit: np.ndarray) -> None:
        """Each mesh's floor per micro-batch: the least :meth:`floors` over its recompute policies that can fit
        (``fit`` (n, J, R); inf when none can). Recomputation only adds kernels (``compute.recomputed_parts``: none
        re-runs nothing, full re-runs every part), so a floor at none is below the floor at any policy and full
        is above any: only the policies those orders leave are priced. :meth:`refine` raises them later."""
        rc = self.space.recompute
        need = fit.copy()
        if "none" in rc:   # none fits: nothing else lowers the floor
            need[:, :, [r for r in range(len(rc)) if rc[r] != "none"]] &= ~fit[:, :, [rc.index("none")]]
        if "full" in rc:   # full counts only where it alone fits
            others = [r for r in range(len(rc)) if rc[r] != "full"]
            need[:, :, rc.index("full")] &= ~fit[:, :, others].any(axis=2)
        fl = np.full(fit.shape, np.inf)
        for r in range(len(rc)):
            rows = np.nonzero(need[:, :, r].any(axis=1))[0]
            if len(rows):
                fl[rows, :, r] = np.where(need[rows, :, r], self.floors([positions[g] for g in rows], r), np.inf)
        fl = fl.min(axis=2)
        for g, pos in enumerate(positions):
            self._fit[pos] = fit[g]
            self._floor[pos] = fl[g]
            self.lb_by_mbs[pos] = fl[g].copy()
            self._level[pos] = np.where(np.isinf(fl[g]), 2, 0)

    def key(self, pos: int) -> tuple[float, int | None]:
        """(the mesh's lowest lower bound known now, over its micro-batches; the micro-batch where that value can
        still be raised by :meth:`refine`, None when it is the full bound)."""
        lb = self.lb_by_mbs[pos]
        j = int(np.argmin(lb))
        return float(lb[j]), (None if self._level[pos][j] == 2 else j)

    def refine(self, pos: int, j: int) -> None:
        """Raise micro-batch j's lower bound one level: from its floor to the least :meth:`_bound` of its pairs that
        can fit, then to that plus the least DP/optimizer tail over the ZeRO stages (:meth:`_tail`; it adds to
        every layout of the micro-batch, whatever its recompute and vpp)."""
        rs = np.nonzero(self._fit[pos][j])[0]
        bound = min(self._bound(pos, j, int(r)) for r in rs)
        if self._level[pos][j] == 0:
            self.lb_by_mbs[pos][j] = max(bound, self.lb_by_mbs[pos][j])
        else:
            self.lb_by_mbs[pos][j] = bound + float(self._tail(pos, j, int(rs[0])).min())
        self._level[pos][j] += 1

    def _tail(self, pos: int, j: int, r: int) -> np.ndarray:
        """(Z,): per ZeRO stage, the max over the mesh's stages of exposed DP/FSDP + optimizer seconds
        (``Estimator.stage_tail``) at micro-batch j. It hides behind the forward time, the same for every recompute
        policy: taken from recompute r's timing (any r gives it)."""
        hit = self._tails.get((pos, j))
        if hit is None:
            sp = self.space
            fwd = self._stage_max(pos, j, r)[1]
            L = sp.layout_grid([self.meshes[pos]], None, "none", micro_batch=sp.mbs[j], zero=self.zero)
            hit = np.zeros(len(sp.zero))
            for st in self.stages[pos]:
                dp_t, opt_t = self.est.stage_tail(L, st, fwd[st.index])
                hit = np.maximum(hit, dp_t + opt_t)
            self._tails[(pos, j)] = hit
        return hit

    def pairs_within(self, pos: int, jr: np.ndarray, limit_us: int) -> np.ndarray:
        """The (micro-batch, recompute) pairs of ``jr`` (J, R) whose layouts may be as fast as ``limit_us`` (their
        bound plus their micro-batch's least tail is within it). The others cannot beat the incumbent (the
        incumbent cutoff would drop them)."""
        out = np.zeros_like(jr)
        for j, r in zip(*np.nonzero(jr)):
            j, r = int(j), int(r)
            tail = float(self._tail(pos, j, r).min())
            out[j, r] = np.rint((self._bound(pos, j, r) + tail) * SCALE_T) <= limit_us
        return out

    def fill(self, pos: int) -> None:
        """Every table of one mesh."""
        self.fill_memory([pos])
        self.fill_time(pos)

    def fill_memory(self, positions) -> None:
        """Memory tables and batch/interleaving validity of meshes that share one pipeline depth (the same stages):
        one call of each memory term function per stage, with the meshes' degrees and every micro-batch,
        recompute policy, vpp and ZeRO stage as numpy axes."""
        pos = np.array([p for p in np.atleast_1d(positions) if not self.mem_done[p]], np.int64)
        if not len(pos):
            return
        sp, prof, tr = self.space, self.est.profile, self.space.training
        mis = [self.meshes[p] for p in pos]
        G, R, J, K = len(pos), len(sp.recompute), len(sp.mbs), len(sp.vpp)
        pp, M = self.pp[pos[0]], self.M[pos]
        assert (self.pp[pos] == pp).all(), "one pipeline depth per call"
        by_zero = sp.layout_grid(mis, (G, 1), "none", zero=self.zero[None, :])                          # (G, Z)
        by_zero_mbs = sp.layout_grid(mis, (G, 1, 1), "none", micro_batch=self.mbs[None, None, :],
                                     zero=self.zero[None, :, None])                                       # (G, Z, J)
        by_mbs_vpp = sp.layout_grid(mis, (G, 1, 1, 1), "none", micro_batch=self.mbs[None, None, :, None],
                                    vpp=self.vpp[None, None, None, :])                                    # (G, R, J, K)
        keys = [sp.meshes[mi][:2] for mi in mis]
        rep = dict(zip(keys, pos.tolist()))   # (tp, cp) -> a mesh with them: they share stored elements (_elems)
        col = {k: i for i, k in enumerate(rep)}
        inv = np.array([col[k] for k in keys])
        for s, st in enumerate(self._slot_stage(pos[0])):
            kept, working = (np.stack(x)[inv] for x in zip(*(self._elems(p, st) for p in rep.values())))  # (G, R, 1, 1)
            self.states[s, pos] = sum(model_state_bytes(prof, st, by_zero, tr))
            self.buf[s, pos] = buffer_bytes(prof, st, by_zero_mbs, tr)
            self.copy[s, pos] = step_grad_copy_bytes(prof, st, by_zero, tr)
            act = np.broadcast_to(activation_bytes(prof, st, by_mbs_vpp, tr, (kept, working)), (G, R, J, K))
            self.act[s, pos] = np.swapaxes(act, 1, 2)
        self.batch_ok[pos] = tr.global_batch % (self.dp[pos][:, None] * self.mbs[None, :]) == 0
        vmax = max_vpp(self.splits[pos[0]])
        self.inter_ok[pos] = ((self.vpp[None, None, :] == 1)
                              | ((pp > 1) & (M[:, :, None] % pp == 0) & (self.vpp[None, None, :] <= vmax)))
        self.mem_done[pos] = True

    def fit_pairs(self, cap: int) -> np.ndarray:
        """(meshes, J, R): the (micro-batch, recompute) pairs of each mesh with a fully valid layout (batch,
        interleaving) that fits in ``cap`` MiB at some vpp and ZeRO stage. Fills every memory table."""
        for group in self.by_depth():
            self.fill_memory(group)
        nm, J, R, K, Z = (len(self.meshes), len(self.space.mbs), len(self.space.recompute), len(self.space.vpp),
                          len(self.space.zero))
        _, mem_mib, b_bad, i_bad = self.compose(np.arange(nm), with_time=False)
        return (~b_bad & ~i_bad & (mem_mib <= cap)).reshape(nm, J, R, K, Z).any(axis=(3, 4))

    def by_depth(self) -> list[np.ndarray]:
        """Mesh positions grouped by pipeline depth (deepest first: the most sharded, usually the smallest)."""
        return [np.nonzero(self.pp == p)[0] for p in sorted(set(self.pp.tolist()), reverse=True)]

    def _elems(self, pos: int, st) -> tuple[np.ndarray, np.ndarray]:
        """Stored and working activation elements per token of stage ``st`` per recompute policy, (R, 1, 1) each;
        shared by the meshes with the same tp and cp (they differ in ep, etp or dp only)."""
        sp = self.space
        tp, cp = sp.meshes[self.meshes[pos]][:2]
        key = (tp, cp, st.first, st.last)
        hit = self._elems_cache.get(key)
        if hit is None:
            lin = linear_input_scale(sp.training)
            per_r = [activation_elems_per_token(self.est.profile, st, sp.layout(self.meshes[pos], 1, rc, 1, 0), lin)
                     for rc in sp.recompute]
            hit = self._elems_cache[key] = tuple(np.array(x, float)[:, None, None] for x in zip(*per_r))
        return hit

    def fill_time(self, pos: int, jr: np.ndarray | None = None) -> None:
        """Time tables of one mesh, for the (micro-batch, recompute) pairs marked in ``jr`` (default: all); the
        others keep an unreachable micro-batch time (only used once an incumbent makes them irrelevant)."""
        sp, est, prof, tr, hw = self.space, self.est, self.est.profile, self.space.training, self.space.hardware
        mi, J, R = self.meshes[pos], len(sp.mbs), len(sp.recompute)
        jr = np.ones((J, R), bool) if jr is None else jr
        for j, r in zip(*np.nonzero(jr)):
            self.t_mb[pos, j, r] = self._stage_max(pos, int(j), int(r))[0]
            self.t_mb_v[pos, j, r] = self._stage_max(pos, int(j), int(r), True)[0]
            self.tail[pos, :, j] = self._tail(pos, int(j), int(r))
        self.p2p[pos] = p2p_time(sp.layout_grid([mi], None, "none", micro_batch=self.mbs[:, None],
                                                vpp=self.vpp[None, :]), tr, prof.hidden, hw, est.net)
        self.done[pos] = True

    def compose(self, rows: np.ndarray, with_time: bool = True
                ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray]:
        """Step time (us), fullest stage's memory (MiB) and batch/interleaving breakage of every (m, j, r, k, z)
        of the given rows: axes order of the candidate grid. Summed by the cost model's ``step_seconds``."""
        n = len(rows)
        mem = None   # the fullest stage: max over slots of states + activations + buffers, one slot at a time
        for s in range(self.slots):
            m = self.act[s, rows][:, :, :, :, None] + np.transpose(self.buf[s, rows], (0, 2, 1))[:, :, None, None, :]
            np.maximum(m, self.copy[s, rows][:, None, None, None, :], out=m)
            m += self.states[s, rows][:, None, None, None, :]
            mem = m if mem is None else np.maximum(mem, m, out=mem)
        shape = mem.shape
        step_us = None
        # Clipped at the placeholders (a step of 31 years, 1 EB of memory) so that absurd but valid inputs (a
        # hardware file with a GFLOP/s chip and a 16M-token sequence) stay integers CP-SAT can sum without overflow.
        if with_time:
            grid = SimpleNamespace(grad_accum=self.M[rows][:, :, None, None, None],
                                   pp=self.pp[rows][:, None, None, None, None], vpp=self.vpp[None, None, None, :, None])
            t_mb = np.where(self.vpp[None, None, None, :, None] > 1, self.t_mb_v[rows][:, :, :, None, None],
                            self.t_mb[rows][:, :, :, None, None])
            step = step_seconds(grid, t_mb, self.p2p[rows][:, :, None, :, None],
                                np.transpose(self.tail[rows], (0, 2, 1))[:, :, None, None, :])
            step = np.minimum(np.nan_to_num(np.broadcast_to(step, shape), nan=UNREACHABLE_S), UNREACHABLE_S)
            step_us = np.rint(step * SCALE_T).astype(np.int64).reshape(n, -1)
        mem = np.minimum(np.nan_to_num(mem, copy=False, nan=UNREACHABLE_BYTES), UNREACHABLE_BYTES, out=mem)
        mem /= GIB
        mem *= SCALE_M
        mem_mib = np.ceil(mem, out=mem).astype(np.int64).reshape(n, -1)
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
        for st in np.flatnonzero(np.bincount(status[p], minlength=4)):   # (np.unique would import numpy.ma: 20 ms)
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
    """The CP-SAT model over one set of candidates, written as a CpModelProto. ``enforce``: the groups whose
    assumption literals are assumed (default all; fewer: what-if checks of an explanation)."""

    def __init__(self, cands: Candidates, enforce: tuple[str, ...] = ALL_GROUPS):
        self.cands = c = cands
        self.proto = m = _cp.CpModelProto()
        n = len(c.step_us)
        for _ in range(n):
            m.variables.add().domain.extend((0, 1))
        m.constraints.add().exactly_one.literals.extend(range(n))
        self.lits: dict[str, int] = {}   # group -> index of its assumption literal
        for g in ALL_GROUPS:
            lit = self.lits[g] = len(m.variables)
            m.variables.add().domain.extend((0, 1))
            if g == "hbm capacity":   # Σ mem_i·x_i <= cap
                self._linear(range(n), c.mem_mib.tolist(), -(2 ** 62), c.mem_cap, lit)
            else:                     # Σ over the candidates breaking the group of x_i = 0
                bad = np.nonzero(c.broken[g])[0].tolist()
                if bad:
                    self._linear(bad, [1] * len(bad), 0, 0, lit)
        m.objective.vars.extend(range(n))
        m.objective.coeffs.extend(c.step_us.tolist())
        m.assumptions.extend(self.lits[g] for g in enforce)

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


def binding_groups(cands: Candidates, core: list[str] | None = None) -> list[str]:
    """The constraint groups that make the candidates infeasible, from the tables alone: a set S of groups is
    infeasible exactly when every candidate breaks some group of S. Deletion filter from ``core`` (CP-SAT's
    sufficient assumptions; default every group some candidate breaks) down to a minimal infeasible set, then
    every group that is infeasible on its own: a minimal core is one explanation among several."""
    viol = cands.violations()

    def infeasible(groups: list[str]) -> bool:
        hit = np.zeros(len(cands.step_us), bool)
        for g in groups:
            hit |= viol[g]
        return bool(hit.all())

    keep = list(core) if core else [g for g in ALL_GROUPS if viol[g].any()]
    if not infeasible(keep):   # a core the tables do not confirm (e.g. a solver time-out): start from all groups
        keep = [g for g in ALL_GROUPS if viol[g].any()]
    for g in list(keep):
        trial = [x for x in keep if x != g]
        if infeasible(trial):
            keep = trial
    keep += [g for g in ALL_GROUPS if g not in keep and viol[g].all()]
    return keep


def smallest_memory_candidate(cands: Candidates) -> int | None:
    """Index of the candidate with the least memory among those that break no group but HBM capacity (ties: the
    first in table order), or None when every candidate breaks another group."""
    viol = cands.violations()
    ok = np.ones(len(cands.step_us), bool)
    for g, v in viol.items():
        if g != "hbm capacity":
            ok &= ~v
    idx = np.nonzero(ok)[0]
    return int(idx[np.argmin(cands.mem_mib[idx])]) if len(idx) else None
