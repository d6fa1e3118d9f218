"""Reference search: enumerate the same space as the CP-SAT model, validate and estimate every layout.

Slow by design (one full ``Estimator.estimate`` per layout); it exists so anyone can check the solver on a
small space (``autopar solve --search exhaustive``) and so the tests can compare optima.
"""

from __future__ import annotations

from itertools import product

from autopar.cost import Estimate, Estimator
from autopar.search.space import Space
from autopar.specs.layout import check_layout


def exhaustive_search(space: Space, est: Estimator, top_k: int) -> tuple[list[Estimate], int]:
    """(the top_k fastest fitting layouts, number of valid layouts evaluated)."""
    results: list[Estimate] = []
    valid = 0
    cross = space.options.allow_cross_domain
    for mi, mbs, rc, vpp, zero in product(range(len(space.meshes)), space.mbs, space.recompute, space.vpp,
                                           space.zero):
        if space.splits.get(space.meshes[mi][2]) is None:
            continue
        L = space.layout(mi, mbs, rc, vpp, zero)
        if check_layout(L, space.model, space.training, space.gpus, space.hardware, cross):
            continue
        valid += 1
        e = est.estimate(L, resolved=True)
        if e.memory_gib.total <= space.usable_hbm_gib:   # within HBM less the memory margin, as the solver
            results.append(e)
    results.sort(key=lambda e: (e.step_time_s, e.layout.short()))
    return results[:top_k], valid
