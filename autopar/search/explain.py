"""Infeasibility, from the candidates of the search that failed (no re-solve per group).

A set of constraint groups is infeasible exactly when every candidate breaks one of them (a hitting set over the
candidates' broken groups, which pruning keeps intact). :func:`binding_groups` shrinks CP-SAT's core to a minimal
one with that test and adds every group that is infeasible on its own; :func:`smallest_memory_candidate` is the least
memory over candidates that break no other group; :func:`layout_fits` answers "does anything fit on N GPUs" from
the memory tables alone. ``autopar.search.explain_infeasible`` turns them into the lines ``solve`` prints.
"""

from __future__ import annotations

import time

import numpy as np

from autopar.cost import Estimator
from autopar.search.space import Space
from autopar.search.tables import ALL_GROUPS, Candidates, Tables, cap_mib, mesh_validity


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
