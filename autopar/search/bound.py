"""Branch and bound over the meshes: floors, step-time bounds, the heap, and the exact pruning of candidates.

Within a mesh and a batch/interleaving status only the top_k fastest layouts that fit, and the smallest one that does
not, can ever be an answer; the rest are dropped (exact pruning, :func:`prune`), and so is every candidate slower
than the top_k-th fully valid one (an incumbent cutoff). Meshes are tabulated (:class:`~autopar.search.tables.Tables`)
in order of a step-time lower bound, and a mesh (or a micro-batch/recompute pair of it) that cannot beat the
incumbent or cannot fit is not timed at all (:func:`build_candidates`; exact: the bounded and the full build give
the same top_k, tested).
"""

from __future__ import annotations

import heapq
import time
from types import SimpleNamespace

import numpy as np

from autopar.cost import Estimator
from autopar.cost.compute import embedding_grad_time, gpu_tokens, head_time
from autopar.cost.ep import ep_comm_seconds, ep_time_per_microbatch
from autopar.cost.estimator import step_seconds
from autopar.cost.overlap import overlap_cost
from autopar.cost.pipeline import p2p_time
from autopar.search.space import Space
from autopar.search.tables import ALL_GROUPS, MESH_GROUPS, SCALE_T, Candidates, Tables, cap_mib, mesh_validity


def build_candidates(space: Space, est: Estimator, top_k: int, only_valid_meshes: bool = True,
                     bound: bool = True, deadline: float | None = None) -> Candidates:
    """Candidates of every valid mesh (see the module docstring), ready for :class:`~autopar.search.cpsat.LayoutModel`.

    With ``bound`` (branch and bound over meshes, exact): meshes are visited in order of a step-time lower bound;
    a mesh's memory tables are filled whole (vectorised), its time tables only for the (micro-batch, recompute)
    pairs that fit in HBM at some vpp and ZeRO stage, and only when their lower bound is not slower than the
    top_k-th fully valid layout found so far. Nothing left out could survive the incumbent cutoff below. When
    nothing fits, no mesh is timed at all (the explanation needs memory only). ``deadline``
    (``time.perf_counter()`` seconds) stops the visit early with the lower bound of what was left
    (``stopped_bound_s``)."""
    t0 = time.perf_counter()
    J, R, K, Z = len(space.mbs), len(space.recompute), len(space.vpp), len(space.zero)
    meshes, mesh_bad, first_problem = mesh_validity(space, only_valid_meshes)
    nm = len(meshes)
    cap = cap_mib(space)
    if nm == 0:   # every mesh breaks a rule: nothing to choose from (the caller explains why)
        empty = np.zeros(0, np.int64)
        return Candidates(np.zeros((0, 5), np.int64), empty, empty,
                          {g: np.zeros(0, bool) for g in ALL_GROUPS}, cap, 0, time.perf_counter() - t0, first_problem)
    t = Tables(space, est, meshes)
    b = Bounds(t)
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
            #    (micro-batch, recompute) pairs that fit (see Bounds.bound): bubble + p2p at the best valid vpp, plus
            #    the least DP/optimizer tail over the ZeRO stages (Tables.tail_of). That bound times every stage of the
            #    mesh, so a cheaper floor under it comes first (the layers' kernels alone, see Bounds.floors), and each
            #    micro-batch's key is raised (refine) only when it is the lowest key left: meshes are still visited
            #    in the order of their bounds. A mesh visited times only the pairs whose bound can beat the
            #    incumbent. Every layout that can beat the final incumbent is tabulated whatever the order, so the
            #    candidates after the cutoff do not depend on the bounds used.
            #    tests/search/test_solver.py checks that bounded and unbounded builds agree.
            fitting = list(fit_jr)
            b.start_bounds(fitting, fit[fitting])
            heap = [(b.key(pos)[0], i) for i, pos in enumerate(fitting)]
            heapq.heapify(heap)
            best: list[int] = []   # step_us of the fastest fully valid fitting layouts so far (at most top_k)
            while heap:
                key, i = heap[0]
                pos = fitting[i]
                incumbent = best[top_k - 1] if len(best) >= top_k else None
                if incumbent is not None and np.rint(key * SCALE_T) > incumbent + 1:
                    break   # the lowest key left: no mesh left can beat the incumbent
                j = b.key(pos)[1]
                if j is not None:   # the mesh's lowest key is below its full bound: raise it
                    b.refine(pos, j)
                    heapq.heapreplace(heap, (b.key(pos)[0], i))
                    continue
                if deadline is not None and best and time.perf_counter() > deadline:
                    stopped = key
                    break
                heapq.heappop(heap)
                jr = fit_jr[pos] if incumbent is None else b.pairs_within(pos, fit_jr[pos], incumbent + 1)
                if not jr.any():
                    continue
                t.fill_time(pos, jr)
                step_us, mem_mib, b_bad, i_bad = t.compose(np.array([pos]))
                ok = ~b_bad & ~i_bad & (mem_mib <= cap)
                best = sorted(best + step_us[ok].tolist())[:top_k]
    # candidates: the meshes timed; when nothing fits (or without bound), every mesh
    rows = np.nonzero(t.done)[0] if t.done.any() else np.nonzero(t.mem_done)[0]
    step_us, mem_mib, b_bad, i_bad = t.compose(rows)
    keep = prune(step_us, mem_mib, b_bad, i_bad, top_k, cap)
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


class Bounds:
    """Lower bounds of the step time of a mesh's layouts, read from its :class:`Tables` (``t``): a cheap floor per
    micro-batch first (:meth:`floors`), raised on demand (:meth:`refine`) to the full bound (:meth:`bound`, then
    plus the least DP/optimizer tail). :meth:`key` is what the heap of :func:`build_candidates` orders meshes by."""

    def __init__(self, t: Tables):
        self.t = t
        self._p2p_bound: dict[int, np.ndarray] = {}   # pos -> p2p (J, K)
        self.lb_by_mbs: dict[int, np.ndarray] = {}    # pos -> step-time lower bound per micro-batch (see _level)
        self._floor: dict[int, np.ndarray] = {}       # pos -> step-time floor per micro-batch
        self._bound_j: dict[tuple[int, int], tuple[float, int]] = {}   # (pos, j) -> least bound, its recompute r
        self._fit: dict[int, np.ndarray] = {}         # pos -> (micro-batch, recompute) pairs that can fit
        self._level: dict[int, np.ndarray] = {}       # pos -> per micro-batch: 0 floor, 1 bound, 2 bound + tail
        self._kernel_s: dict[tuple, np.ndarray] = {}  # (tp, cp, ep, etp, r) -> layer seconds (J, kinds)
        self._dense_kernel_s: dict[tuple, np.ndarray] = {}   # (tp, cp, r) -> the same, kinds without routed experts
        self._routed_kinds: list[int] | None = None   # the profile's kinds with routed experts
        self._bounds: dict[tuple[int, int, int], float] = {}   # (pos, j, r) -> bound
        self._ends_s: dict[tuple[int, int], tuple] = {}   # (tp, cp) -> embedding gradient, head per micro-batch (J,)
        self._cp_s: dict[tuple, np.ndarray] = {}   # (tp, cp, r, split) -> CP term per micro-batch and stage (J, S)
        self._kinds_of: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}   # split -> layers per kind, overhead
        self._ep_layer_s: dict[tuple, np.ndarray] = {}   # (tp·cp, ep, etp, r) -> T_ep of one MoE layer (J,)

    def bound(self, pos: int, j: int, r: int) -> float:
        """Step-time lower bound of mesh ``pos`` at micro-batch j and recompute r: ``step_seconds`` at the best valid
        vpp with the real p2p and no DP/optimizer tail. (A tail bound, the best ZeRO stage's optimizer step, timed
        no fewer meshes on the zoo and cost more than it saved.) Kept: :meth:`refine` and :meth:`pairs_within` ask
        for the same pairs."""
        hit = self._bounds.get((pos, j, r))
        if hit is None:
            hit = self._bounds[(pos, j, r)] = self._bound(pos, j, r)
        return hit

    def _bound(self, pos: int, j: int, r: int) -> float:
        """:meth:`bound`, computed."""
        if pos not in self._p2p_bound:
            sp = self.t.space
            p2p = p2p_time(sp.layout_grid([self.t.meshes[pos]], None, "none", micro_batch=self.t.mbs[:, None],
                                          vpp=self.t.vpp[None, :]), sp.training, self.t.est.profile.hidden, sp.hardware,
                           self.t.est.net)
            self._p2p_bound[pos] = np.broadcast_to(p2p, (len(sp.mbs), len(sp.vpp)))
        lb = SimpleNamespace(grad_accum=self.t.M[pos, j], pp=self.t.pp[pos], vpp=self.t.vpp)
        t_mb = np.where(self.t.vpp > 1, self.t.stage_max(pos, j, r, True)[0], self.t.stage_max(pos, j, r)[0])
        steps = step_seconds(lb, t_mb, self._p2p_bound[pos][j], 0.0)
        return float(np.min(np.where(self.t.inter_ok[pos, j], steps, np.inf)))   # over the valid interleavings

    def _layer_kernels(self, pos: int, r: int) -> np.ndarray:
        """(J, kinds): ``Estimator.layer_seconds`` of one layer of each kind per micro-batch at recompute r. A layer's
        kernels depend on tp, cp, ep, etp, the micro-batch and recompute, not on pp or dp (``compute.layer_parts``):
        priced once per (tp, cp, ep, etp, r) and shared by the pipeline depths; the kinds without routed experts
        read neither ep nor etp (``compute._parts_key``), so their columns are priced once per (tp, cp, r)."""
        sp = self.t.space
        mi = self.t.meshes[pos]
        tp, cp, _, ep, etp = sp.meshes[mi]
        hit = self._kernel_s.get((tp, cp, ep, etp, r))
        if hit is None:
            est = self.t.est
            layouts = [sp.layout(mi, b, sp.recompute[r], 1, 1) for b in sp.mbs]
            routed = self._routed_kinds
            if routed is None:
                routed = self._routed_kinds = [k for k, kind in enumerate(est.profile.kinds) if kind.is_moe]
            dense = self._dense_kernel_s.get((tp, cp, r))   # (J, kinds): only the kinds without routed experts
            if dense is None:
                dense = self._dense_kernel_s[(tp, cp, r)] = np.array(
                    [[0.0 if k in routed else est.layer_seconds(L, k) for k in range(len(est.profile.kinds))]
                     for L in layouts])
            hit = dense.copy()
            for k in routed:
                hit[:, k] = [est.layer_seconds(L, k) for L in layouts]
            self._kernel_s[(tp, cp, ep, etp, r)] = hit
        return hit

    def _stage_kinds(self, pos: int) -> tuple[np.ndarray, np.ndarray]:
        """(layers of each kind per distinct stage (S, kinds), the seconds per micro-batch no kernel accounts for per
        stage (S,), ``Estimator.stage_overhead_s``) of the mesh's split."""
        split = self.t.splits[pos]
        hit = self._kinds_of.get(split)
        if hit is None:
            stages, prof = self.t.stages[pos], self.t.est.profile
            counts = np.zeros((len(stages), len(prof.kinds)))
            for s, st in enumerate(stages):
                for k, n in prof.kind_counts(st.first, st.last):
                    counts[s, k] = n
            hit = self._kinds_of[split] = (counts, np.array([self.t.est.stage_overhead_s(st) for st in stages]))
        return hit

    def _ep_per_layer(self, pos: int, r: int) -> np.ndarray:
        """(J,): T_ep of one MoE layer of the mesh per micro-batch at recompute r, every dispatch/combine and ETP
        collective (``ep.ep_comm_seconds``, which is the stage's MoE layers times this; none hidden, mean load). It
        depends on tp·cp, ep, etp, the micro-batch and recompute only: priced once per (tp·cp, ep, etp, r)."""
        sp, est = self.t.space, self.t.est
        mi = self.t.meshes[pos]
        tp, cp, _, ep, etp = sp.meshes[mi]
        key = (tp * cp, ep, etp, r)   # T_ep reads tp and cp only as the tokens each rank routes, b·s/(cp·tp)
        hit = self._ep_layer_s.get(key)
        if hit is None:
            st = max(self.t.stages[pos], key=lambda s: s.sum(est.profile, "moe_layers"))
            n = st.sum(est.profile, "moe_layers")
            L = sp.layout_grid([mi], None, sp.recompute[r], micro_batch=self.t.mbs)
            hit = np.zeros(len(sp.mbs))
            if n:
                hit = hit + ep_comm_seconds(est.profile, st, L, sp.training, est.net) / n
            self._ep_layer_s[key] = hit
        return hit

    def _ep_floor(self, positions: list[int], r: int, kernels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(g, J, S) twice, without and with virtual stages: a floor of the EP term ``stage_times`` adds on each
        distinct stage of meshes that share one split, at recompute r: ``ep.ep_time_per_microbatch`` itself, with
        T_ep from :meth:`_ep_per_layer` and, for the window W that hides it, ``kernels`` (the stage's layer kernels,
        which ``compute.hiding_windows`` sums too, recompute by the same shares), raised by 1e-9 for the summation
        order: exposure only falls as W grows; plus the overlap's SM cost on the hidden rest, as ``stage_times`` adds
        it."""
        sp, est, tr = self.t.space, self.t.est, self.t.space.training
        stages = self.t.stages[positions[0]]
        n_moe = np.array([st.sum(est.profile, "moe_layers") for st in stages])
        total = (np.stack([self._ep_per_layer(p, r) for p in positions])[:, :, None] * n_moe) * est.imbalance
        window = np.broadcast_to(kernels * (1.0 + 1e-9), total.shape)
        out = np.zeros((2,) + total.shape)
        rc = sp.recompute[r]
        groups: dict[tuple, list[int]] = {}   # the overlap's rules read ep and whether vpp counts (Tables.stage_max)
        for g, p in enumerate(positions):
            groups.setdefault((sp.meshes[self.t.meshes[p]][3], bool(self.t.vpp_matters[p])), []).append(g)
        for (_, vpp_matters), rows in groups.items():
            M = self.t.M[np.asarray(positions)[rows]][:, :, None]
            for c, vpp in enumerate((1, 2) if vpp_matters else (1,)):
                L = sp.layout_grid([self.t.meshes[positions[rows[0]]]], None, rc, vpp=vpp, zero=1, grad_accum=M)
                out[c, rows] = ep_time_per_microbatch(est.profile, stages[0], L, tr, sp.hardware, est.net,
                                                      est.imbalance, window[rows], total[rows])
            if not vpp_matters:   # the same layout with or without virtual stages
                out[1, rows] = out[0, rows]
        if tr.ep_comm_overlap:
            # the hidden part's SM cost, as Estimator._ep_exposed adds it: x + c·max(0, T − x) (overlap_cost, linear,
            # c < 1) only grows with the exposure x, so from a floor of x it is a floor of the term
            links = [est.net.link(*sp.meshes[self.t.meshes[p]][3:5]) for p in positions]   # (ep, etp)
            for link in dict.fromkeys(links):
                sel = np.array([k == link for k in links])
                out[:, sel] += overlap_cost(np.maximum(0.0, total[sel] - out[:, sel]), sp.hardware, "sm", link)
        return out[0], out[1]

    def _ends(self, positions: list[int], layer_s: np.ndarray) -> np.ndarray:
        """(g, J, S): the kernel seconds per micro-batch that ``compute.microbatch_time`` adds on top of the layers
        of each distinct stage of meshes that share one split: the embedding gradient on the first stage
        (``compute.embedding_grad_time``), the LM head on the last (``compute.head_time``) and, there too, each
        multi-token-prediction module's layer (the model's last layer kind, ``layer_s``: (g, J, kinds) at the
        floor's recompute policy, as :meth:`_layer_kernels` prices it) and its head. They depend on tp, cp and the
        micro-batch only: priced once per (tp, cp)."""
        sp, est = self.t.space, self.t.est
        prof, tr, kern = est.profile, sp.training, est.kernels
        stages = self.t.stages[positions[0]]
        first = np.array([st.is_first for st in stages], float)
        last = np.array([st.is_last for st in stages], float)
        emb, head = np.zeros(len(positions)), np.zeros((len(positions), len(sp.mbs)))
        for g, p in enumerate(positions):
            mi = self.t.meshes[p]
            tp, cp = sp.meshes[mi][:2]
            hit = self._ends_s.get((tp, cp))
            if hit is None:
                layouts = [sp.layout(mi, b, "none", 1, 1) for b in sp.mbs]
                hit = self._ends_s[(tp, cp)] = (
                    embedding_grad_time(kern, prof, layouts[0]),
                    np.array([sum(head_time(kern, prof, L, tr, gpu_tokens(L, tr))) for L in layouts]))
            emb[g], head[g] = hit
        end_last = head * (1 + prof.mtp_layers) + prof.mtp_layers * layer_s[:, :, prof.kind_of[-1]]   # (g, J)
        return emb[:, None, None] * first + end_last[:, :, None] * last

    def _cp_floor(self, positions: list[int], r: int) -> np.ndarray:
        """(g, J, S): the CP term ``stage_times`` adds on each distinct stage of meshes that share one split, at
        recompute r (``Estimator.cp_seconds`` itself; it reads tp, cp, the micro-batch and recompute: priced once per
        (tp, cp, r) and split); zero where cp = 1."""
        sp, est = self.t.space, self.t.est
        stages = self.t.stages[positions[0]]
        out = np.zeros((len(positions), len(sp.mbs), len(stages)))
        for g, p in enumerate(positions):
            mi = self.t.meshes[p]
            tp, cp = sp.meshes[mi][:2]
            if cp == 1:
                continue
            key = (tp, cp, r, self.t.splits[p])
            hit = self._cp_s.get(key)
            if hit is None:
                hit = self._cp_s[key] = np.array([[est.cp_seconds(L, st) for st in stages] for L in
                                                  (sp.layout(mi, b, sp.recompute[r], 1, 1) for b in sp.mbs)])
            out[g] = hit
        return out

    def floors(self, positions: list[int], r: int) -> np.ndarray:
        """(n, J): a step-time floor of each mesh and micro-batch at recompute r, never above :meth:`bound` and
        without a call of ``stage_times``: ``step_seconds`` with t_mb replaced by the slowest stage's layers
        alone, each priced by ``Estimator.layer_seconds``, plus the kernels the first and last stages add
        (:meth:`_ends`), the stage's overhead (``Estimator.stage_overhead_s``, the very term ``stage_times`` adds)
        and a floor of its EP term (:meth:`_ep_floor`, with and without virtual stages as :meth:`bound` takes them);
        ``stage_times`` also adds the routed experts' host time and the TP/CP/offload communication, none negative,
        and ``step_seconds`` grows with t_mb), no p2p, no tail, at the best valid vpp (inf: none valid)."""
        if not positions:
            return np.zeros((0, len(self.t.space.mbs)))
        layer_s = np.stack([self._layer_kernels(p, r) for p in positions])   # (n, J, kinds)
        t_floor = np.zeros((2,) + layer_s.shape[:2])   # without, with virtual stages
        moe = self.t.est.model.is_moe
        for split in dict.fromkeys(self.t.splits[p] for p in positions):   # meshes of one split share their stages
            sel = np.array([self.t.splits[p] == split for p in positions])
            counts, overhead = self._stage_kinds(positions[int(np.argmax(sel))])
            group = [p for p, k in zip(positions, sel) if k]
            kernels = layer_s[sel] @ counts.T   # (g, J, S)
            # the ends after the EP floor: its hiding window is the layers' kernels alone (compute.hiding_windows)
            ends = self._ends(group, layer_s[sel]) + self._cp_floor(group, r)
            if moe:
                ep1, ep_v = self._ep_floor(group, r, kernels)
                t_floor[0, sel] = (kernels + ends + overhead + ep1).max(axis=2)
                t_floor[1, sel] = (kernels + ends + overhead + ep_v).max(axis=2)
            else:
                t_floor[:, sel] = (kernels + ends + overhead).max(axis=2)
        # 1e-9: the floor sums in another order than stage_times; keep it below the bound in floating point too
        t_floor *= 1.0 - 1e-9
        pos = np.asarray(positions, np.int64)
        grid = SimpleNamespace(grad_accum=self.t.M[pos][:, :, None], pp=self.t.pp[pos][:, None, None],
                               vpp=self.t.vpp[None, None, :])
        t_mb = np.where(self.t.vpp > 1, t_floor[1][:, :, None], t_floor[0][:, :, None])
        return np.where(self.t.inter_ok[pos], step_seconds(grid, t_mb, 0.0, 0.0), np.inf).min(axis=2)

    def start_bounds(self, positions: list[int], fit: np.ndarray) -> None:
        """Each mesh's floor per micro-batch: the least :meth:`floors` over its recompute policies that can fit
        (``fit`` (n, J, R); inf when none can). Recomputation only adds kernels (``compute.recomputed_parts``: none
        re-runs nothing, full re-runs every part), so a floor at none is below the floor at any policy and full
        is above any: only the policies those orders leave are priced. :meth:`refine` raises them later."""
        rc = self.t.space.recompute
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
        """Raise micro-batch j's lower bound one level: from its floor to the least :meth:`bound` of its pairs that
        can fit, then to that plus the least DP/optimizer tail (``Tables.tail_of``) over the ZeRO stages and the
        policies that can fit."""
        if self._level[pos][j] == 0:
            rs = np.nonzero(self._fit[pos][j])[0].tolist()
            bounds = [self.bound(pos, j, r) for r in rs]
            i = int(np.argmin(bounds))
            self._bound_j[(pos, j)] = bounds[i], rs[i]
            self.lb_by_mbs[pos][j] = max(bounds[i], self.lb_by_mbs[pos][j])
        else:   # every fitting policy's step is at least the least bound plus the least tail of them all. The
            # tail of the least-bound policy alone is not a lower bound: a policy whose bound is barely higher
            # (its recomputation offset by less offloading, say) can widen the hiding window by more than its
            # bound grows, so its tail falls by more (gpt_oss_20b on 64 GPUs with offloading: selective's bound
            # 0.7 ms above none's, its tail 2.5 ms below). pairs_within, which decides what is tabulated, uses
            # each pair's own tail
            bound = self._bound_j[(pos, j)][0]
            rs = np.nonzero(self._fit[pos][j])[0]
            self.lb_by_mbs[pos][j] = bound + min(float(self.t.tail_of(pos, j, int(r)).min()) for r in rs)
        self._level[pos][j] += 1

    def pairs_within(self, pos: int, jr: np.ndarray, limit_us: int) -> np.ndarray:
        """The (micro-batch, recompute) pairs of ``jr`` (J, R) whose layouts may be as fast as ``limit_us`` (their
        bound plus their micro-batch's least tail is within it). The others cannot beat the incumbent (the
        incumbent cutoff would drop them)."""
        out = np.zeros_like(jr)
        for j, r in zip(*np.nonzero(jr)):
            j, r = int(j), int(r)
            tail = float(self.t.tail_of(pos, j, r).min())
            out[j, r] = np.rint((self.bound(pos, j, r) + tail) * SCALE_T) <= limit_us
        return out


def prune(step: np.ndarray, mem: np.ndarray, b_bad: np.ndarray, i_bad: np.ndarray, top_k: int, cap: int
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
