"""The CP-SAT model alone (autopar/search/cpsat.py), on hand-made candidates: each constraint group with a feasible
and an infeasible instance, the objective, the top-K cuts and the what-if assumptions (CP-SAT Primer, coding
patterns: each part of the model tested alone)."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.search.cpsat import LayoutModel
from autopar.search.tables import ALL_GROUPS, MESH_GROUPS, Candidates

RULE_GROUPS = [g for g in ALL_GROUPS if g != "hbm capacity"]


def cands(step, mem=None, broken=None, cap=100) -> Candidates:
    """Candidates with the given step times (us) and memories (MiB); ``broken``: group -> indices breaking it."""
    n = len(step)
    br = {g: np.zeros(n, bool) for g in RULE_GROUPS}
    for g, idx in (broken or {}).items():
        br[g][list(idx)] = True
    return Candidates(np.arange(5 * n, dtype=np.int64).reshape(n, 5), np.array(step, np.int64),
                      np.array(mem if mem is not None else [10] * n, np.int64), br, cap, n)


def chosen(res) -> list[float]:
    return [s.objective_s for s in res.solutions]


def test_the_objective_is_the_candidates_step_times_and_the_fastest_wins():
    c = cands([300, 100, 200])
    lm = LayoutModel(c)
    assert list(lm.proto.objective.coeffs) == [300, 100, 200] and list(lm.proto.objective.vars) == [0, 1, 2]
    res = lm.solve(top_k=1, time_limit_s=10)
    assert res.status == "OPTIMAL" and chosen(res) == [100e-6]
    assert res.solutions[0].assignment == tuple(c.assignment[1])


@pytest.mark.parametrize("group", RULE_GROUPS)
def test_each_rule_group_switches_off_the_candidates_that_break_it(group):
    feasible = LayoutModel(cands([100, 200, 300], broken={group: [0]})).solve(1, 10)
    assert feasible.status == "OPTIMAL" and chosen(feasible) == [200e-6]
    infeasible = LayoutModel(cands([100, 200], broken={group: [0, 1]})).solve(1, 10)
    assert infeasible.status == "INFEASIBLE" and not infeasible.solutions
    assert infeasible.blamed_groups == [group]


def test_the_hbm_group_keeps_the_chosen_memory_within_the_cap():
    feasible = LayoutModel(cands([100, 200], mem=[101, 100], cap=100)).solve(1, 10)
    assert chosen(feasible) == [200e-6]
    infeasible = LayoutModel(cands([100, 200], mem=[101, 150], cap=100)).solve(1, 10)
    assert infeasible.status == "INFEASIBLE" and infeasible.blamed_groups == ["hbm capacity"]


def test_top_k_re_solves_with_the_previous_answers_cut_off():
    res = LayoutModel(cands([400, 100, 300, 200], broken={"batch": [3]})).solve(top_k=5, time_limit_s=10)
    assert chosen(res) == [100e-6, 300e-6, 400e-6]   # the broken one never comes back


def test_a_group_left_out_of_the_assumptions_is_not_enforced():
    c = cands([100, 200], broken={"tensor parallel": [0]})
    lm = LayoutModel(c, enforce=tuple(g for g in ALL_GROUPS if g != "tensor parallel"))
    assert chosen(lm.solve(1, 10)) == [100e-6]
    assert set(LayoutModel(c).lits) == set(ALL_GROUPS) and set(MESH_GROUPS) < set(ALL_GROUPS)
