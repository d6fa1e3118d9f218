"""The tuner's search space: the solver's best distinct structures times the step knobs, as Optuna params."""

from __future__ import annotations

import pytest

from autopar.search.space import SearchOptions
from autopar.specs.layout import check_layout
from autopar.tune import TuneSpace, solve_space
from autopar.tune._problem import CPU_SCALE, cpu_scale_for, resolve_problem

from .conftest import CPU_TRAIN, FAST, TINY


def _problem(gpus=2, options=FAST, training=CPU_TRAIN, model=TINY):
    return resolve_problem(model, "h100_sxm", training, gpus, options, backend="gloo")


def test_structures_are_distinct_and_best_predicted_first():
    space = solve_space(_problem(), top_k=8, n_seeds=8)
    labels = [s.label(2) for s in space.structures]
    assert len(labels) == len(set(labels)) == 4          # every mesh of 2 ranks: DP2, PP2, TP2, CP2
    assert set(labels) == {"TP1 DP2", "TP1 PP2 DP1", "TP2 DP1 SP", "TP1 CP2 DP1"}
    assert labels[0] == "TP1 DP2"                         # the solver's best plan (data parallel, no comm)


def test_top_k_keeps_only_the_best_structures():
    assert len(solve_space(_problem(), top_k=2, n_seeds=2).structures) == 2


def test_seeds_are_the_best_plan_of_each_structure_first():
    space = solve_space(_problem(), top_k=8, n_seeds=3)
    assert [s["layout"] for s in space.seeds] == [0, 1, 2]


def test_knobs_follow_the_pins_and_appear_only_where_they_matter():
    opts = SearchOptions(time_limit_s=10, mbs=[1, 4], recompute=["none", "full"], zero=[1, 3])
    space = solve_space(_problem(options=opts), top_k=8, n_seeds=4)
    assert space.mbs == [1, 4] and space.recompute == ["none", "full"] and space.zero == [1, 3]
    dp2 = next(i for i, s in enumerate(space.structures) if s.label(2) == "TP1 DP2")
    pp2 = next(i for i, s in enumerate(space.structures) if s.pp == 2)
    assert space.vpp[2] == [1, 2]                         # 4 layers: pp2 x vpp4 would not split them
    params = space.all_params(2)
    assert {tuple(sorted(p)) for p in params if p["layout"] == dp2} == {("layout", "mbs", "recompute", "zero")}
    assert {tuple(sorted(p)) for p in params if p["layout"] == pp2} == {("layout", "mbs", "recompute", "vpp_pp2")}
    assert len(params) == 4 * (2 + 2 + 1 + 1)             # mbs x rc x (DP2 x zero, PP2 x vpp, TP2, CP2)
    tp2 = next(i for i, s in enumerate(space.structures) if s.tp == 2)
    assert all("zero" not in p for p in params if p["layout"] == tp2)   # dp = 1: the ZeRO stage changes nothing


def test_params_and_layouts_round_trip():
    space = solve_space(_problem(gpus=4), top_k=8, n_seeds=4)
    for params in space.all_params(4):
        lay = space.layout(params, 4)
        assert space.params_for(lay, 4) == params
    again = TuneSpace.from_dict(space.to_dict())
    assert again.to_dict() == space.to_dict()
    assert all(space.layout(p, 4) == again.layout(p, 4) for p in space.all_params(4))


def test_every_seed_is_a_valid_layout():
    space = solve_space(_problem(gpus=4), top_k=8, n_seeds=8)
    for params in space.seeds:
        assert check_layout(space.layout(params, 4), TINY, CPU_TRAIN, 4) == []


def test_cpu_scaling_caps_a_large_model_and_keeps_a_small_one():
    p = resolve_problem("llama3_8b", "h100_sxm", None, 2, FAST, backend="gloo")
    m = p.model
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.vocab_size) == (
        CPU_SCALE["layers"], CPU_SCALE["hidden"], CPU_SCALE["ffn"], CPU_SCALE["heads"], CPU_SCALE["vocab"])
    assert any("scaled down from llama3_8b" in n for n in p.notes)
    assert p.training.seq_len == 128 and p.training.global_batch == 8
    assert cpu_scale_for(TINY) == {}
    small = _problem()
    assert small.model == TINY and not any("scaled" in n for n in small.notes)
    moe = resolve_problem("mixtral_8x7b", "h100_sxm", None, 4, FAST, backend="gloo").model
    assert moe.moe.num_experts == 4 and moe.moe.expert_ffn_hidden_size == 256


def test_explicit_scale_and_no_scale():
    p = resolve_problem("llama3_8b", "h100_sxm", {"seq_len": 64}, 2, FAST, scale={"layers": 2}, backend="gloo")
    assert p.model.num_layers == 2 and p.model.hidden_size == 64 and p.training.seq_len == 64
    assert resolve_problem("llama3_8b", "h100_sxm", None, 2, FAST, scale=None, backend="gloo").model.num_layers == 32
    with pytest.raises(Exception, match="unknown scale field"):
        resolve_problem("llama3_8b", "h100_sxm", None, 2, FAST, scale={"depth": 2}, backend="gloo")


def test_hybrid_models_are_planned_with_the_runners_linear_cp():
    """The runner passes states between CP ranks: tune plans and predicts hybrid runs with linear_cp=state_pass,
    and says so; a model without linear mixers is left as given."""
    p = resolve_problem("nemotron_h_8b", "h100_sxm", None, 4, None)
    assert p.training.linear_cp == "state_pass"
    assert any("linear_cp=state_pass" in n for n in p.notes)
    q = resolve_problem("llama3_8b", "h100_sxm", None, 4, None)
    assert not any("linear_cp" in n for n in q.notes)
