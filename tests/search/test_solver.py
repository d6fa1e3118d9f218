"""The CP-SAT search against the exhaustive reference and against estimate()."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.cost import Estimator
from autopar.search import SearchOptions, solve
from autopar.search.tables import SCALE_T
from autopar.specs import ModelSpec, MoESpec, TrainingSpec
from autopar.specs.loaders import load_hardware


def small_model(moe: bool, layers: int) -> ModelSpec:
    return ModelSpec(name="tiny_moe" if moe else "tiny", num_layers=layers, hidden_size=2048, ffn_hidden_size=5632,
                     num_attention_heads=16, num_kv_heads=4, vocab_size=32000,
                     moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1408) if moe else None)


OPTS = dict(mbs=[1, 2], vpp=[1, 2], zero=[1, 3], recompute=["none", "full"], top_k=1, time_limit_s=30)


@settings(max_examples=6, deadline=None)
@given(moe=st.booleans(), layers=st.sampled_from([8, 12]), gpus=st.sampled_from([4, 8]),
       gb=st.sampled_from([16, 32]))
def test_cpsat_and_exhaustive_find_the_same_optimum(moe, layers, gpus, gb):
    model, tr = small_model(moe, layers), TrainingSpec(seq_len=2048, global_batch=gb)
    a = solve(model, "h100_sxm", tr, gpus, SearchOptions(**OPTS), explain=False, with_heuristic=False)
    b = solve(model, "h100_sxm", tr, gpus, SearchOptions(**OPTS), method="exhaustive", with_heuristic=False)
    assert a.status == "OPTIMAL"
    assert a.plans and b.plans
    # equal optimum up to the solver's integer rounding (1 us per term)
    assert a.plans[0].estimate.step_time_s == pytest.approx(b.plans[0].estimate.step_time_s, abs=5e-6)


def test_objective_equals_estimate_of_the_best_layout():
    model, tr = small_model(True, 8), TrainingSpec(seq_len=2048, global_batch=32)
    res = solve(model, "h100_sxm", tr, 8, SearchOptions(**{**OPTS, "top_k": 3}), explain=False, with_heuristic=False)
    for p in res.plans:
        exact = Estimator(model, load_hardware("h100_sxm"), tr, 8).estimate(p.layout, resolved=True).step_time_s
        assert p.objective_s == pytest.approx(exact, abs=4 / SCALE_T)


def test_every_plan_fits_and_is_valid():
    model, tr = small_model(False, 8), TrainingSpec(seq_len=2048, global_batch=32)
    res = solve(model, "h100_sxm", tr, 8, SearchOptions(**{**OPTS, "top_k": 4}), explain=False, with_heuristic=False)
    steps = [p.estimate.step_time_s for p in res.plans]
    assert steps == sorted(steps) and all(p.estimate.fits for p in res.plans)
    assert len({p.layout.short() for p in res.plans}) == len(res.plans)


def test_infeasible_problem_names_the_hbm_group_and_a_gpu_count():
    model = ModelSpec(name="big", num_layers=8, hidden_size=16384, ffn_hidden_size=65536, num_attention_heads=128,
                      vocab_size=32000)
    tr = TrainingSpec(seq_len=2048, global_batch=16)
    res = solve(model, "h100_sxm", tr, 2, SearchOptions(**OPTS), with_heuristic=False)
    assert not res.plans
    text = "\n".join(res.explanation)
    assert "hbm capacity" in text and "smallest per-GPU memory" in text and "GPU count" in text


def test_pins_that_no_mesh_satisfies_give_no_plans_and_an_explanation():
    model = ModelSpec(name="four_heads", num_layers=4, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=4,
                      vocab_size=512)
    tr = TrainingSpec(seq_len=2048, global_batch=32)
    res = solve(model, "h100_sxm", tr, 8, SearchOptions(**{**OPTS, "tp": [8]}), with_heuristic=False)
    assert not res.plans and res.status == "INFEASIBLE"
    assert any("tensor parallel" in line for line in res.explanation)


def _best_steps(cands, top_k):
    from autopar.search.cpsat import LayoutModel
    res = LayoutModel(cands).solve(top_k, 30.0)
    return res.status, [s.objective_s for s in res.solutions]


@settings(max_examples=12, deadline=None)
@given(moe=st.booleans(), layers=st.sampled_from([8, 12, 30]), gpus=st.sampled_from([8, 16, 32]),
       gb=st.sampled_from([16, 64, 96]), seq=st.sampled_from([2048, 8192]), top_k=st.integers(1, 4),
       hidden=st.sampled_from([2048, 8192]))
def test_branch_and_bound_over_meshes_loses_nothing(moe, layers, gpus, gb, seq, top_k, hidden):
    """The bounded table build (meshes skipped by lower bounds) gives the same top-k as tabulating every mesh,
    including problems where nothing or only a few layouts fit."""
    from autopar.search.bound import build_candidates
    from autopar.search.space import build_space
    model = ModelSpec(name="m", num_layers=layers, hidden_size=hidden, ffn_hidden_size=4 * hidden,
                      num_attention_heads=16, num_kv_heads=4, vocab_size=32000,
                      moe=MoESpec(num_experts=16, top_k=2, expert_ffn_hidden_size=hidden) if moe else None)
    hw, tr = load_hardware("h100_sxm"), TrainingSpec(seq_len=seq, global_batch=gb)
    space = build_space(model, hw, tr, gpus, SearchOptions(top_k=top_k))
    est = Estimator(model, hw, tr, gpus)
    full = build_candidates(space, est, top_k, bound=False)
    bounded = build_candidates(space, est, top_k, bound=True)
    assert bounded.tabulated_meshes <= full.tabulated_meshes == full.valid_meshes
    assert _best_steps(bounded, top_k) == _best_steps(full, top_k)


def test_branch_and_bound_on_deepseek_v3_skips_most_meshes_and_keeps_the_optimum():
    from autopar.search.bound import build_candidates
    from autopar.search.space import build_space
    from autopar.specs.loaders import load_model
    model, hw = load_model("deepseek_v3"), load_hardware("h100_sxm")
    tr = TrainingSpec(seq_len=4096, global_batch=512)
    space = build_space(model, hw, tr, 256, SearchOptions(top_k=3))
    est = Estimator(model, hw, tr, 256)
    full, bounded = build_candidates(space, est, 3, bound=False), build_candidates(space, est, 3)
    assert bounded.tabulated_meshes < full.valid_meshes / 3
    assert _best_steps(bounded, 3) == _best_steps(full, 3)


@settings(max_examples=10, deadline=None)
@given(name=st.sampled_from(["deepseek_v3", "gpt_oss_20b", "nemotron_h_8b", "qwen3_next_80b_a3b", "llama3_8b",
                             "mixtral_8x7b"]),
       gpus=st.sampled_from([8, 64, 256]), seq=st.sampled_from([4096, 32768]), offload=st.sampled_from([0.0, 0.5]),
       recompute=st.sampled_from([None, ["selective", "full"], ["full", "mlp,moe_act", "core_attn,mlp"]]))
def test_the_floor_bound_is_never_above_the_mesh_bound(name, gpus, seq, offload, recompute):
    """The cheap floors the branch and bound sorts meshes by first never exceed a step-time bound: per (micro-batch,
    recompute) pair, and per micro-batch over the pairs that fit (where only some policies are priced); on zoo
    models with MoE, sliding windows, linear attention and SSM layers, long context, offloading and spaces
    without recompute 'none' or with module lists. (A floor above a bound could skip a layout that wins.)"""
    from autopar.search.bound import Bounds
    from autopar.search.tables import Tables, cap_mib, mesh_validity
    from autopar.search.space import build_space
    from autopar.specs.loaders import load_model
    model, hw = load_model(name), load_hardware("h100_sxm")
    tr = TrainingSpec(seq_len=seq, global_batch=max(gpus, 64))
    space = build_space(model, hw, tr, gpus, SearchOptions(offload_activations=offload, recompute=recompute))
    meshes, _, _ = mesh_validity(space)
    t = Tables(space, Estimator(model, hw, tr, gpus), meshes)
    b = Bounds(t)
    fit = t.fit_pairs(cap_mib(space))
    fitting = [p for p in range(len(meshes)) if fit[p].any()][::7]   # every 7th: the test stays quick
    for r in range(len(space.recompute)):
        floors = b.floors(fitting, r)
        for g, pos in enumerate(fitting):
            for j in np.nonzero(fit[pos, :, r])[0]:
                assert 0 < floors[g, j] <= b.bound(pos, int(j), r)
    b.start_bounds(fitting, fit[fitting])
    J, R, K, Z = (len(space.mbs), len(space.recompute), len(space.vpp), len(space.zero))
    for pos in fitting:
        for j in range(J):
            bounds = [b.bound(pos, j, r) for r in np.nonzero(fit[pos, j])[0]]
            assert b._floor[pos][j] <= min(bounds, default=np.inf)
    cap = cap_mib(space)
    for pos in fitting[:8]:   # the fully raised bound (with the DP/optimizer tail) against the layouts themselves
        t.fill_time(pos, fit[pos])
        step_us, mem_mib, b_bad, i_bad = t.compose(np.array([pos]))
        ok = (~b_bad & ~i_bad & (mem_mib <= cap)).reshape(J, R, K, Z)
        steps = step_us.reshape(J, R, K, Z)
        for j in np.nonzero(ok.any(axis=(1, 2, 3)))[0]:
            b.refine(pos, int(j))
            b.refine(pos, int(j))
            assert b.key(pos)[1] != j
            assert np.rint(b.lb_by_mbs[pos][j] * SCALE_T) <= steps[j][ok[j]].min() + 1


def _cpsat_infeasible(cands, groups) -> bool:
    """Reference: CP-SAT with only ``groups`` enforced (their assumption literals) proves infeasibility."""
    from ortools.sat.python import cp_model_helper as cp

    from autopar.search.cpsat import LayoutModel
    lm = LayoutModel(cands, enforce=tuple(groups))
    params = cp.SatParameters()
    params.num_workers = 1
    solver = cp.SolveWrapper()
    solver.set_parameters(params)
    return solver.solve(lm.proto).status == cp.CpSolverStatus.INFEASIBLE


@settings(max_examples=8, deadline=None)
@given(hidden=st.sampled_from([4096, 16384]), gpus=st.sampled_from([2, 4, 8]), gb=st.sampled_from([3, 16]),
       vpp=st.sampled_from([[1], [2]]), pp=st.sampled_from([None, [2]]))
def test_binding_groups_from_the_tables_agree_with_cpsat(hidden, gpus, gb, vpp, pp):
    """A set of groups is infeasible by the tables' hitting-set test exactly when CP-SAT proves it infeasible, and
    binding_groups is a minimal such set plus the groups infeasible on their own."""
    from itertools import combinations

    from autopar.search.bound import build_candidates
    from autopar.search.explain import binding_groups
    from autopar.search.space import build_space
    model = ModelSpec(name="big", num_layers=8, hidden_size=hidden, ffn_hidden_size=4 * hidden,
                      num_attention_heads=32, vocab_size=32000)
    hw, tr = load_hardware("h100_sxm"), TrainingSpec(seq_len=2048, global_batch=gb)
    space = build_space(model, hw, tr, gpus, SearchOptions(**{**OPTS, "vpp": vpp, "pp": pp}))
    cands = build_candidates(space, Estimator(model, hw, tr, gpus), 1)
    if not len(cands.step_us):
        return
    viol = cands.violations()
    groups = [g for g in viol if viol[g].any()]
    for n in range(len(groups) + 1):
        for subset in combinations(groups, n):
            tables = bool(np.logical_or.reduce([viol[g] for g in subset] + [np.zeros(len(cands.step_us), bool)]).all())
            assert tables == _cpsat_infeasible(cands, subset), subset
    if not _cpsat_infeasible(cands, groups):
        return
    blamed = binding_groups(cands)
    singles = [g for g in blamed if viol[g].all()]
    core = [g for g in blamed if g not in singles] or singles[:1]
    assert _cpsat_infeasible(cands, blamed)
    for g in core:   # minimal: without any one of its groups the core is feasible
        rest = [x for x in core if x != g]
        assert rest == [] or not _cpsat_infeasible(cands, rest) or viol[g].all()


@settings(max_examples=8, deadline=None)
@given(hidden=st.sampled_from([2048, 8192, 16384]), gpus=st.sampled_from([2, 8, 16]), gb=st.sampled_from([8, 32]))
def test_layout_fits_agrees_with_solve(hidden, gpus, gb):
    from autopar.search.explain import layout_fits
    from autopar.search.space import build_space
    model = ModelSpec(name="m", num_layers=8, hidden_size=hidden, ffn_hidden_size=4 * hidden, num_attention_heads=32,
                      vocab_size=32000)
    hw, tr = load_hardware("h100_sxm"), TrainingSpec(seq_len=2048, global_batch=gb)
    space = build_space(model, hw, tr, gpus, SearchOptions(**OPTS))
    res = solve(model, hw, tr, gpus, SearchOptions(**OPTS), explain=False, with_heuristic=False)
    assert layout_fits(space, Estimator(model, hw, tr, gpus)) == bool(res.plans)


def test_smallest_memory_in_the_explanation_is_the_exhaustive_minimum():
    """The explanation's smallest memory (from the tables) equals the least memory over every valid layout."""
    from itertools import product

    from autopar.search.space import build_space
    from autopar.specs.layout import check_layout
    model = ModelSpec(name="big", num_layers=8, hidden_size=16384, ffn_hidden_size=65536, num_attention_heads=128,
                      vocab_size=32000)
    hw, tr = load_hardware("h100_sxm"), TrainingSpec(seq_len=2048, global_batch=16)
    res = solve(model, hw, tr, 4, SearchOptions(**OPTS), with_heuristic=False)
    line = next(x for x in res.explanation if "smallest per-GPU memory" in x)
    space, est = build_space(model, hw, tr, 4, SearchOptions(**OPTS)), Estimator(model, hw, tr, 4)
    least = min(est.estimate(L, resolved=True).memory_gib.total
                for mi, b, rc, v, z in product(range(len(space.meshes)), space.mbs, space.recompute, space.vpp,
                                               space.zero)
                if space.splits.get(space.meshes[mi][2]) is not None
                and not check_layout(L := space.layout(mi, b, rc, v, z), model, tr, 4, hw, False))
    assert f"is {least:.1f} GiB" in line


def test_a_spent_time_limit_answers_feasible_with_a_gap_and_stops_the_explanation():
    model, tr = small_model(True, 8), TrainingSpec(seq_len=2048, global_batch=32)
    res = solve(model, "h100_sxm", tr, 8, SearchOptions(**{**OPTS, "time_limit_s": 1e-9}), with_heuristic=False)
    assert res.plans and res.status in ("FEASIBLE", "OPTIMAL")
    if res.status == "FEASIBLE":
        assert any("time limit" in n for n in res.notes)
    big = ModelSpec(name="big", num_layers=8, hidden_size=16384, ffn_hidden_size=65536, num_attention_heads=128,
                    vocab_size=32000)
    res = solve(big, "h100_sxm", TrainingSpec(seq_len=2048, global_batch=16), 2,
                SearchOptions(**{**OPTS, "time_limit_s": 1e-9}), with_heuristic=False)
    assert not res.plans and "hbm capacity" in res.explanation[0]
    assert any("time limit" in line for line in res.explanation)


def test_smallest_gpu_count_search_stops_at_the_gpu_bound():
    # Nothing fits even at autopar's largest GPU count: the explanation says so instead of trying a count that
    # its own input bounds reject.
    from autopar import TrainingSpec as TS
    from autopar.search import solve as _solve
    res = _solve("kimi_k2", "h100_sxm", TS(seq_len=1_048_576, global_batch=1), 1_048_576,
                 SearchOptions(time_limit_s=30))
    assert not res.plans
    assert any("nothing fits up to 1,048,576 GPUs (autopar's bound" in line for line in res.explanation)


@pytest.mark.parametrize("gap, needle", [(0.0, "no bound on #1's gap"), (0.031, "#1 within 3.10% of the best bound")])
def test_feasible_status_never_reads_as_proof(gap, needle):
    """Issue 22 #8: a time-limited, unproven solve printed "status FEASIBLE, gap 0.00%"."""
    from autopar.search import SolveResult
    res = SolveResult([], "FEASIBLE", gap, 1.0, 10, 1, "cpsat")
    text = res.status_text()
    assert "not proven optimal" in text and needle in text and "gap 0.00%" not in text
    assert SolveResult([], "OPTIMAL", 0.0, 1.0, 10, 1, "cpsat").status_text() == "status OPTIMAL, gap 0.00%"
    assert SolveResult([], "EXHAUSTIVE", 0.0, 1.0, 10, 1, "exhaustive").status_text() == "status EXHAUSTIVE"
