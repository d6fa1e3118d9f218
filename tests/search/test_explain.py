"""The infeasibility explanation alone (autopar/search/explain.py), on hand-made candidates."""

from __future__ import annotations

import numpy as np

from autopar.search.explain import binding_groups, smallest_memory_candidate
from autopar.search.tables import ALL_GROUPS, Candidates


def cands(mem, broken, cap=100) -> Candidates:
    n = len(mem)
    br = {g: np.zeros(n, bool) for g in ALL_GROUPS if g != "hbm capacity"}
    for g, idx in broken.items():
        br[g][list(idx)] = True
    return Candidates(np.zeros((n, 5), np.int64), np.arange(n, dtype=np.int64) + 1, np.array(mem, np.int64), br,
                      cap, n)


def test_two_groups_that_only_together_leave_nothing_are_both_binding():
    c = cands([10, 10], {"batch": [0], "interleaving": [1]})
    assert binding_groups(c) == ["batch", "interleaving"]


def test_a_minimal_core_drops_groups_not_needed_and_adds_groups_infeasible_alone():
    # tensor parallel breaks everything on its own: the deletion filter leaves it alone of the core
    c = cands([200, 10, 10], {"tensor parallel": [0, 1, 2], "batch": [1, 2]})
    assert binding_groups(c, core=["batch", "hbm capacity", "tensor parallel"]) == ["tensor parallel"]
    # batch and HBM are a minimal core together; tensor parallel, infeasible on its own, is another explanation
    c = cands([200, 10], {"batch": [1], "tensor parallel": [0, 1]})
    assert binding_groups(c, core=["batch", "hbm capacity"]) == ["batch", "hbm capacity", "tensor parallel"]
    assert binding_groups(cands([200, 10], {"batch": [1]})) == ["batch", "hbm capacity"]


def test_a_core_the_tables_do_not_confirm_is_replaced_by_every_breaking_group():
    c = cands([10, 10], {"batch": [0], "recompute": [1]})
    assert binding_groups(c, core=["batch"]) == ["recompute", "batch"]   # in ALL_GROUPS order


def test_smallest_memory_is_over_candidates_that_break_no_other_group():
    c = cands([300, 120, 150, 110], {"experts": [3]})
    assert smallest_memory_candidate(c) == 1              # 110 MiB breaks a rule; 120 is the least valid
    assert smallest_memory_candidate(cands([300], {"experts": [0]})) is None
