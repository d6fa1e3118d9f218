"""Infeasibility, from the candidates of the search that failed (no re-solve per group).

A set of constraint groups is infeasible exactly when every candidate breaks one of them (a hitting set over the
candidates' broken groups, which pruning keeps intact). :func:`binding_groups` shrinks CP-SAT's core to a minimal
one with that test and adds every group that is infeasible on its own; :func:`smallest_memory_candidate` is the least
memory over candidates that break no other group; :func:`layout_fits` answers "does anything fit on N GPUs" from
the memory tables alone. :func:`explain_infeasible` turns them into the lines ``solve`` prints.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from autopar.cost import Estimator
from autopar.search.space import SearchOptions, Space, build_space
from autopar.search.tables import ALL_GROUPS, Candidates, Tables, cap_mib, mesh_validity
from autopar.specs.bounds import limit


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


def layout_fits(space: Space, est: Estimator, deadline: float | None = None) -> bool | None:
    """Whether some valid layout of the space fits in HBM, from the memory tables alone (no timing, no solve):
    meshes are visited by pipeline depth, deepest first, and the first fit answers. None when ``deadline`` passed
    first."""
    meshes, _, _ = mesh_validity(space)
    if not meshes:
        return False
    t = Tables(space, est, meshes)
    cap = cap_mib(space)
    for group in t.by_depth():
        if deadline is not None and time.perf_counter() > deadline:
            return None
        t.fill_memory(group)
        _, mem_mib, b_bad, i_bad = t.compose(group, with_time=False)
        if (~b_bad & ~i_bad & (mem_mib <= cap)).any():
            return True
    return False


def explain_infeasible(space: Space, est: Estimator, cands: Candidates, blamed: list[str],
                       deadline: float | None = None, *, solve: Callable[..., Any]) -> list[str]:
    """Name the binding groups with numbers, the smallest memory reachable and the smallest GPU count that fits.

    All from the candidates of the search that failed (no re-solve per group): the binding groups and the smallest
    memory come from their tables (:func:`binding_groups`, :func:`smallest_memory_candidate`); each larger GPU
    count is tried with the memory tables alone (:func:`layout_fits`), and only the first one that fits is solved,
    for its fastest layout, by ``solve`` (:func:`autopar.search.solve`, passed in: this room sits below it).
    ``deadline`` (``time.perf_counter()`` seconds) stops the GPU-count search."""
    model, hardware, training, gpus = space.model, space.hardware, space.training, space.gpus
    lines = []
    if blamed:
        lines.append("binding constraint groups: " + ", ".join(blamed))
    for g in blamed:
        if g in cands.first_problem:
            lines.append(f"  {g}: e.g. {cands.first_problem[g]}")
        elif g == "batch":
            lines.append(f"  batch: global batch {training.global_batch} must be a multiple of dp·micro-batch, and no "
                         f"valid layout on {gpus} GPUs has such a dp; change --global-batch or the GPU count")
    if "hbm capacity" in blamed or not blamed:
        i = smallest_memory_candidate(cands) if len(cands.step_us) else None
        if i is not None:
            a = cands.assignment[i]
            L = space.layout(a[0], space.mbs[a[1]], space.recompute[a[2]], space.vpp[a[3]], space.zero[a[4]])
            e = est.estimate(L, resolved=True)
            lines.append(f"at seq {training.seq_len} the smallest per-GPU memory reachable on {gpus} "
                         f"{hardware.name} is {e.memory_gib.total:.1f} GiB ({L.short()}), "
                         f"HBM is {hardware.hbm_gib:.1f} GiB, of which {space.usable_hbm_gib:.1f} may be filled "
                         f"(memory margin {space.options.memory_margin:.1%})")
    # Larger GPU counts to try: the next powers of two and doublings of the request, up to 64x and the GPU bound.
    top = min(64 * gpus, int(limit("gpus")))
    counts = sorted(n for n in {gpus * 2 ** i for i in range(1, 7)} | {2 ** k for k in range(1, 40)}
                    if gpus < n <= top)
    options = space.options
    for n in counts:
        big = build_space(model, hardware, training, n, options)
        fits = layout_fits(big, Estimator(model, hardware, training, n), deadline) if big.meshes else False
        if fits is None:
            lines.append(f"no GPU count up to {n // 2} fits; the time limit stopped the search for one at {n} GPUs")
            break
        if not fits:
            continue
        left = 5.0 if deadline is None else max(0.1, deadline - time.perf_counter())
        res = solve(model, hardware, training, n, SearchOptions(**{**options.__dict__, "top_k": 1,
                                                                     "time_limit_s": left}),
                    explain=False, with_heuristic=False)
        if res.plans:
            lines.append(f"the smallest GPU count that fits (trying powers of two and doublings of {gpus}) is {n}: "
                         f"{res.plans[0].layout.short()}")
            break
    else:
        lines.append(f"nothing fits up to {top:,} GPUs" + (" (autopar's bound on the GPU count)"
                                                           if top < 64 * gpus else ""))
    return lines
