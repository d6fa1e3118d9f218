"""--stack / --knobs on the problem commands, `autopar zoo stacks`, intervals in the output, and --emit pricing the
launcher's own stack."""

import json

import pytest

from tests.cli.clirun import check_promise, run_cli


def test_zoo_stacks_lists_every_knob_with_its_source():
    o = run_cli(["zoo", "stacks", "--json"])
    check_promise(o)
    stacks = {s["name"]: s for s in json.loads(o.out)["stacks"]}
    assert {"megatron_core", "torchtitan"} <= set(stacks)
    tt = {k["knob"]: k for k in stacks["torchtitan"]["knobs"]}
    assert tt["elementwise"]["value"] == "eager" and tt["elementwise"]["priced"] and tt["elementwise"]["source"]
    assert not tt["dispatcher"]["priced"]                     # recorded, not priced: said so
    assert stacks["torchtitan"]["efficiency"]                 # its own fitted constants


def test_estimate_prices_the_stack_and_prints_its_interval():
    base = ["estimate", "--model", "llama3_8b", "--gpus", "8", "--fsdp", "--mbs", "2", "--recompute", "full",
            "--json"]
    runs = {}
    for stack in (["--stack", "torchtitan"], ["--stack", "torchtitan", "--knobs", "compile"], []):
        o = run_cli(base + stack)
        check_promise(o)
        runs[" ".join(stack)] = json.loads(o.out)
    eager, compiled, mcore = runs["--stack torchtitan"], runs["--stack torchtitan --knobs compile"], runs[""]
    assert eager["step_time_s"] > compiled["step_time_s"]
    assert eager["stack"]["elementwise"] == "eager" and mcore["stack"]["name"] == "megatron_core"
    iv = eager["interval"]["tokens_per_s_per_gpu"]
    # The band is the prediction divided by (1 + the held-out error quantiles) of its regime: it need not contain the
    # prediction itself (torchtitan's held-out errors are all predicted-fast after the refit, so the band lies below).
    from autopar.measure.intervals import _table
    assert iv["share"] == 0.8 and iv["low"] < iv["high"] and iv["regime"] == "dense, hopper, torchtitan"
    band = next(b for b in _table()["throughput"]
                if b["regime"] == {"kind": "dense", "generation": "hopper", "stack": "torchtitan"})
    assert iv["low"] == pytest.approx(eager["tokens_per_s_per_gpu"] / (1 + band["q_hi"]))
    assert iv["high"] == pytest.approx(eager["tokens_per_s_per_gpu"] / (1 + band["q_lo"]))


def test_bad_stack_input_is_one_error_line():
    for argv, needle in ((["--stack", "nosuch"], "unknown stack"), (["--knobs", "turbo"], "knob 'turbo'"),
                         (["--stack", "torchtitan", "--knobs", "tp_overlap=userbuffers"], "not offered")):
        o = run_cli(["estimate", "--model", "llama3_8b", "--gpus", "8", *argv])
        check_promise(o)
        assert o.rc == 2 and needle in o.err_lines[-1], o.err_lines


def test_emit_torchtitan_prices_torchtitan_and_writes_the_chosen_knobs():
    o = run_cli(["solve", "--model", "llama3_8b", "--gpus", "16", "--emit", "torchtitan", "--time-limit", "5",
                 "--top-k", "1", "--json"])
    check_promise(o)
    d = json.loads(o.out)
    assert d["stack"]["name"] == "torchtitan"
    # the free knobs are searched with the layout: compile never loses in the model, so it is chosen
    assert d["stack"]["elementwise"] == "compiled"
    assert any("stack knobs chosen with the layout" in n for n in d["notes"])
    o = run_cli(["solve", "--model", "llama3_8b", "--gpus", "16", "--emit", "megatron", "--stack", "torchtitan"])
    check_promise(o)
    assert o.rc == 2 and "runs the megatron_core stack" in o.err_lines[-1]



def test_knobs_are_chosen_by_the_objective_not_the_step(monkeypatch):
    """--objective cost ranks the stack's free knob settings by GPU-hours, as it ranks GPU counts: a setting whose best
    plan steps faster on more GPUs but costs more GPU-hours loses (the search stubbed to make the two differ)."""
    from types import SimpleNamespace

    from autopar.cli import solve as cli_solve
    from autopar.specs.loaders import load_stack
    from autopar.specs.training import TrainingSpec

    def fake_search(args, model, hw, tr, opts, err):
        # compiled: 16 GPUs at 1.0 s/step; eager: 8 GPUs at 1.5 s/step (faster step, yet 2/1.5 = 1.33x the GPU-hours)
        gpus, step = (16, 1.0) if tr.elementwise == "compiled" else (8, 1.5)
        est = SimpleNamespace(gpus=gpus, step_time_s=step, tokens_per_s_per_gpu=1e6 / (step * gpus))
        return gpus, SimpleNamespace(plans=[SimpleNamespace(estimate=est)]), []

    monkeypatch.setattr(cli_solve, "_search", fake_search)
    for objective, expect in (("cost", "eager"), ("time", "compiled")):
        args = SimpleNamespace(stack_spec=load_stack("torchtitan"), knobs="tp_overlap=none", objective=objective,
                               tokens=None, gpu_hour_price=None)
        gpus, _, _, tr, chose = cli_solve._search_knobs(args, None, None, TrainingSpec(), None, None)
        assert chose and tr.elementwise == expect and args.stack_knobs.elementwise == expect, objective
