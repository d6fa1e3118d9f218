"""The search's term tables: for every valid mesh, the cost model's own terms on the few axes each depends on.

For every valid mesh m = (tp, cp, pp, ep, etp) the Estimator's own per-stage functions fill tables keyed by the
few axes each term depends on (j = micro-batch, r = recompute, k = vpp, z = ZeRO):
  t_mb[m,j,r] (compute + tp + cp + ep + offload of the slowest stage, ``Estimator.stage_times``)
  t_mb_v[m,j,r] the same with virtual stages (vpp > 1, not FSDP): it differs only where the EP all-to-all overlap
     needs them (MoE, EP > 1, PP > 1: ``autopar.cost.ep.ep_overlap_blockers``), and is timed only there; FSDP on an
     interleaved pipeline cannot overlap (the same rules), so it takes t_mb
  p2p[m,j,k] (``p2p_time``)      tail[m,z,j,r] = max over stages of ``Estimator.stage_tail`` (DP/FSDP + optimizer)
  per distinct stage s: states[m,z,s] + max(activations[m,j,r,k,s] + buffers[m,z,j,s], step copy[m,z,s])
     (memory; the optimizer step's fp32 gradient copy, ``step_grad_copy_bytes``)
The memory and tail terms are filled one mesh per call: the term functions (``model_state_bytes``,
``activation_bytes``, ``buffer_bytes``, ``stage_tail``, ``p2p_time``) take the knobs that vary inside a mesh as numpy
arrays (``Space.layout_grid``). ``stage_times`` (compute) is called per (mesh, micro-batch, recompute).

``step_seconds`` (the cost model's sum of the terms) over the broadcast tables gives the step time, and the
fullest stage's memory, of every (m, j, r, k, z) (:meth:`Tables.compose`): each is exactly ``Estimator.estimate``
of that layout (tested). dp, the micro-batches per step, and the batch and interleaving validity are not derived
here: they are the layouts' own (``Layout.dense_ranks`` through ``Space.layout_grid``) and the layout rules' own
predicates (``batch_valid``, ``interleaving_valid`` of :mod:`autopar.specs.layout`). Which tables get filled is
the branch and bound's choice (:mod:`autopar.search.bound`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from autopar.cost import Estimator
from autopar.cost.estimator import microbatch_seconds, step_seconds
from autopar.cost.memory import (activation_bytes, activation_elems_per_token, buffer_bytes, linear_input_scale,
                                 model_state_bytes, step_grad_copy_bytes)
from autopar.cost.pipeline import p2p_time
from autopar.cost.result import GIB
from autopar.search.space import Space
from autopar.specs.layout import batch_valid, check_layout_groups, interleaving_valid, max_vpp

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


def mesh_validity(space: Space, only_valid_meshes: bool = True) -> tuple[list[int], list[set], dict[str, str]]:
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


def cap_mib(space: Space) -> int:
    """The modelled bytes a layout may fill, in MiB: (HBM·(1 − memory margin) − reserve) / (1 + fragmentation), so
    that its total stays within ``space.usable_hbm_gib``."""
    hw = space.hardware
    return int((space.usable_hbm_gib - hw.reserve_gib) / (1 + hw.fragmentation) * SCALE_M)


class Tables:
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
        self.mbs, self.vpp, self.zero = (np.array(space.mbs), np.array(space.vpp), np.array(space.zero))
        # dp and the micro-batches per step (nm, J): the layouts' own (Layout.dense_ranks), one depth at a time
        self.dp, self.M = np.zeros(nm, np.int64), np.zeros((nm, J), np.int64)
        for group in self.by_depth():
            grid = space.layout_grid([meshes[p] for p in group], (len(group), 1), "none", micro_batch=self.mbs[None, :])
            self.dp[group], self.M[group] = grid.dp[:, 0], grid.grad_accum
        self.t_mb = np.full((nm, J, R), UNREACHABLE_S)
        self.t_mb_v = np.full((nm, J, R), UNREACHABLE_S)   # with vpp > 1 (== t_mb unless vpp_matters)
        ep_on = est.model.is_moe and space.training.ep_comm_overlap and any(v > 1 for v in space.vpp)
        self.vpp_matters = ep_on & (deg[:, 2] > 1) & (deg[:, 3] > 1)      # (nm,)
        self.p2p = np.zeros((nm, J, K))
        self.tail = np.zeros((nm, Z, J, R))
        self.states = np.zeros((slots, nm, Z))
        self.act = np.zeros((slots, nm, J, R, K))
        self.buf = np.zeros((slots, nm, Z, J))
        self.copy = np.zeros((slots, nm, Z))    # the optimizer step's fp32 gradient copy
        self.batch_ok = np.zeros((nm, J), bool)
        self.inter_ok = np.zeros((nm, J, K), bool)
        self.done = np.zeros(nm, bool)      # time tables filled
        self.mem_done = np.zeros(nm, bool)
        self._elems_cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._tails: dict[tuple[int, int, int], np.ndarray] = {}   # (pos, j, r) -> DP/optimizer tail per ZeRO stage
        # (pos, j, r, vpp > 1) -> t_mb, each stage's (forward, backward with recomputation) seconds
        self._times: dict[tuple, tuple[float, dict[int, tuple[float, float]]]] = {}

    def _slot_stage(self, pos: int) -> list:
        stages = self.stages[pos]
        return [stages[min(s, len(stages) - 1)] for s in range(self.slots)]

    def stage_max(self, pos: int, j: int, r: int,
                  interleaved: bool = False) -> tuple[float, dict[int, tuple[float, float]]]:
        """(t_mb of the slowest stage, (forward, backward with recomputation) compute time per stage: the DP/FSDP
        hiding windows of ``Estimator.stage_tail``) at micro-batch j and recompute r, without
        (or, ``interleaved``, with) virtual stages: only the EP overlap's blockers tell them apart."""
        interleaved = bool(interleaved and self.vpp_matters[pos])
        key = (pos, j, r, interleaved)
        if key not in self._times:
            sp = self.space
            L = sp.layout(self.meshes[pos], sp.mbs[j], sp.recompute[r], 1, 1)
            stages = self.stages[pos]
            if self.vpp_matters[pos]:   # both timed at once: they share every term but the EP exposure
                L_v = sp.layout(self.meshes[pos], sp.mbs[j], sp.recompute[r], 2, 1)
                pairs = [self.est.stage_times_interleaved(L, L_v, st) for st in stages]
                self._times[key[:3] + (False,)] = self._slowest(stages, [p[0] for p in pairs])
                self._times[key[:3] + (True,)] = self._slowest(stages, [p[1] for p in pairs])
            else:
                self._times[key] = self._slowest(stages, [self.est.stage_times(L, st) for st in stages])
        return self._times[key]

    @staticmethod
    def _slowest(stages, times_of) -> tuple[float, dict[int, tuple[float, float]]]:
        """(t_mb of the slowest stage, (forward, compute − forward) per stage index) from each stage's
        ``stage_times``."""
        t_mb, windows = 0.0, {}
        for st, times in zip(stages, times_of):
            t_mb = max(t_mb, microbatch_seconds(times))
            windows[st.index] = (times.forward, times.compute - times.forward)
        return t_mb, windows

    def tail_of(self, pos: int, j: int, r: int) -> np.ndarray:
        """(Z,): per ZeRO stage, the max over the mesh's stages of exposed DP/FSDP + optimizer seconds
        (``Estimator.stage_tail``) at micro-batch j and recompute r: it hides behind the forward and the backward
        with its recomputation, recompute r's timing."""
        hit = self._tails.get((pos, j, r))
        if hit is None:
            sp = self.space
            windows = self.stage_max(pos, j, r)[1]
            L = sp.layout_grid([self.meshes[pos]], None, "none", micro_batch=sp.mbs[j], zero=self.zero)
            hit = np.zeros(len(sp.zero))
            for st in self.stages[pos]:
                dp_t, opt_t = self.est.stage_tail(L, st, *windows[st.index])
                hit = np.maximum(hit, dp_t + opt_t)
            self._tails[(pos, j, r)] = hit
        return hit

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
        # the layout rules' own 'batch' and 'interleaving' predicates, over (G, J) and (G, J, K)
        self.batch_ok[pos] = batch_valid(tr.global_batch, self.dp[pos][:, None], self.mbs[None, :])
        self.inter_ok[pos] = interleaving_valid(pp, self.vpp[None, None, :], M[:, :, None],
                                                max_vpp(self.splits[pos[0]]))
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
            self.t_mb[pos, j, r] = self.stage_max(pos, int(j), int(r))[0]
            self.t_mb_v[pos, j, r] = self.stage_max(pos, int(j), int(r), True)[0]
            self.tail[pos, :, j, r] = self.tail_of(pos, int(j), int(r))
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
            # vpp > 1 takes the interleaved table, except under FSDP, where Megatron refuses the combined 1F1B on an
            # interleaved pipeline (launcher_rules' ep_overlap_fsdp_interleaved): exposed there, as without vpp
            inter = (self.vpp[None, None, None, :, None] > 1) & (self.zero[None, None, None, None, :] != 3)
            t_mb = np.where(inter, self.t_mb_v[rows][:, :, :, None, None], self.t_mb[rows][:, :, :, None, None])
            step = step_seconds(grid, t_mb, self.p2p[rows][:, :, None, :, None],
                                np.transpose(self.tail[rows], (0, 2, 3, 1))[:, :, :, None, :])
            step = np.minimum(np.nan_to_num(np.broadcast_to(step, shape), nan=UNREACHABLE_S), UNREACHABLE_S)
            step_us = np.rint(step * SCALE_T).astype(np.int64).reshape(n, -1)
        mem = np.minimum(np.nan_to_num(mem, copy=False, nan=UNREACHABLE_BYTES), UNREACHABLE_BYTES, out=mem)
        mem /= GIB
        mem *= SCALE_M
        mem_mib = np.ceil(mem, out=mem).astype(np.int64).reshape(n, -1)
        b_bad = np.broadcast_to(~self.batch_ok[rows][:, :, None, None, None], shape).reshape(n, -1)
        i_bad = np.broadcast_to(~self.inter_ok[rows][:, :, None, :, None], shape).reshape(n, -1)
        return step_us, mem_mib, b_bad, i_bad
