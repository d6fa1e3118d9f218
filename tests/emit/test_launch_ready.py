"""Launch-ready (issue 22): the default pick of every zoo model, under each --emit target, fed through that
framework's own definitions (fixtures generated from the pinned sources by tools/gen_*) and the run-time combination
rules of autopar/specs/launcher_rules.py (the schedules', training loop's and model builders' assertions, each
with its upstream line).

The default pick is what ``autopar solve --model NAME --gpus N --emit TARGET`` prints with every other setting at
its default (the fastest ranked layout the launcher can run), N the smallest power-of-two multiple of 8 GPUs whose
HBM holds the model's weights, gradients and Adam state twice over.
"""

from __future__ import annotations

import functools
import io
import json
import shlex
from contextlib import redirect_stderr, redirect_stdout

import pytest

from autopar.cli.main import main
from autopar.specs.launcher_rules import (BRIDGE_GPT_CONFIG_FIELDS, EP_OVERLAP_RULES, MEGATRON_RULES,
                                          TORCHTITAN_RULES, bridge_recipe_family, megatron_problems,
                                          megatron_settings, torchtitan_problems)
from autopar.specs.loaders import load_hardware, load_model, zoo_names

from .megatron_parser import parse
from .test_bridge import FIXTURE as BRIDGE_FIXTURE
from .test_bridge import check_bridge_keys
from .test_megatron_parser import check_megatron_rules
from .test_torchtitan_config import FIXTURE as TITAN_FIXTURE
from .test_torchtitan_config import _replace_kwargs

MODELS = zoo_names("models")
TARGETS = ("megatron", "bridge", "torchtitan", "env")


def default_gpus(name: str) -> int:
    m, hw = load_model(name), load_hardware("h100_sxm")
    need = m.total_params * 16 / (0.5 * hw.hbm_gib * 2 ** 30)    # bf16 weights + fp32 grads/master/Adam, 2x room
    g = 8
    while g < need:
        g *= 2
    return g


@functools.cache
def default_pick(name: str, target: str) -> dict:
    """``solve --json`` with --emit TARGET (the settings are in its "emit" entry)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(["solve", "--model", name, "--gpus", str(default_gpus(name)), "--emit", target, "--json",
                   "--time-limit", "10", "--top-k", "3"])
    assert rc == 0, err.getvalue()[-2000:]
    return json.loads(out.getvalue())


def _bash_array(text: str, name: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(f"{name}=(")
    body = lines[start + 1:lines.index(")", start)]
    return [w for line in body for w in shlex.split(line)]


@pytest.mark.parametrize("name", MODELS)
def test_default_pick_of_every_zoo_model_runs_under_every_target(name):
    model = load_model(name)
    ran = []
    for target in TARGETS:
        d = default_pick(name, target)
        em = d["emit"]
        assert em["target"] == target
        if em["refusal"]:              # the launcher cannot build the model at all: said in one line, no text
            assert em["text"] is None and em["plan_rank"] is None and len(em["refusal"]) > 20
            continue
        assert em["text"] is not None, f"{target} refuses every ranked layout of {name}: {em['refused']}"
        layout = next(p["estimate"]["layout"] for p in d["plans"] if p["rank"] == em["plan_rank"])
        text = em["text"]
        if target == "megatron":
            argv = _bash_array(text, "AUTOPAR_MEGATRON_ARGS")
            ns = parse(argv)                                   # Megatron-LM's own argument definitions
            assert megatron_problems(vars(ns)) == []           # its run-time rules, on its parser's namespace
            check_megatron_rules(ns)
            assert (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size) == (layout["tp"], layout["pp"])
        elif target == "bridge":
            keys = check_bridge_keys(_bash_array(text, "AUTOPAR_BRIDGE_OVERRIDES"), model)
            assert keys["model.tensor_model_parallel_size"] == str(layout["tp"])
        elif target == "torchtitan":
            if "def autopar_config" not in text:   # a model torchtitan has no config function for: a note only
                assert all(ln.startswith("#") for ln in text.splitlines())
                continue
            kw = _replace_kwargs(text)
            fields = TITAN_FIXTURE["fields"]
            assert set(kw["parallelism"]) <= set(fields["ParallelismConfig"])
            assert set(kw["training"]) <= set(fields["TrainingConfig"])
            assert torchtitan_problems({**kw["parallelism"], **kw["training"],
                                        "world_size": d["gpus"]}) == []
        else:
            env = dict(line[len("export "):].split("=", 1) for line in text.splitlines()
                       if line.startswith("export "))
            assert int(env["AUTOPAR_TP"]) == layout["tp"] and int(env["AUTOPAR_PP"]) == layout["pp"]
        ran.append(target)
    assert "env" in ran


# ---- each rule with a case that keeps it and one that breaks it ---------------------------------------------
BASE = {"pipeline_model_parallel_size": 2, "expert_model_parallel_size": 8, "bf16": True,
        "num_layers_per_virtual_pipeline_stage": 4, "overlap_moe_expert_parallel_comm": True}
BROKEN = {
    "ep_overlap_fsdp_interleaved": {"use_megatron_fsdp": True},
    "ep_overlap_partial_checkpoints": {"num_microbatches_with_partial_activation_checkpoints": 2},
    "ep_overlap_pp_needs_vpp": {"num_layers_per_virtual_pipeline_stage": None},
    "ep_overlap_needs_ep": {"expert_model_parallel_size": 1},
    "ep_overlap_recompute": {"recompute_granularity": "full", "recompute_method": "uniform"},
    "ep_overlap_half_precision": {"bf16": False},
    "ep_overlap_mtp": {"mtp_num_layers": 2},
    "interleaved_pp2_p2p_overlap": {"overlap_p2p_comm": False, "overlap_moe_expert_parallel_comm": False},
    "overlap_param_gather": {"overlap_param_gather": True},
    "tp_comm_overlap_sp": {"tp_comm_overlap": True},
    "torch_fsdp2": {"use_torch_fsdp2": True},
    "cuda_graphs_full_recompute": {"cuda_graph_impl": "transformer_engine", "recompute_granularity": "full",
                                   "overlap_moe_expert_parallel_comm": False},
    "fp8_fp4": {"fp8": "hybrid", "fp4": "e2m1"},
    "fp8_param_gather": {"fp8": "hybrid", "fp8_param_gather": True},   # without the distributed optimizer
}


def test_every_megatron_rule_keeps_a_good_case_and_names_its_source_on_a_bad_one():
    assert megatron_problems(BASE) == []
    assert {r.name for r in MEGATRON_RULES} == set(BROKEN)
    for rule in MEGATRON_RULES:
        why = rule({**BASE, **BROKEN[rule.name]})
        assert why is not None and "NVIDIA/Megatron-LM@d98e8a64ddf3 megatron/" in why, rule.name
    assert all(r.name.startswith("ep_overlap") for r in EP_OVERLAP_RULES) and len(EP_OVERLAP_RULES) == 7


def test_the_argv_reader_agrees_with_megatrons_parser():
    argv = ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "4",
            "--expert-model-parallel-size", "8", "--overlap-moe-expert-parallel-comm", "--use-megatron-fsdp",
            "--no-gradient-accumulation-fusion", "--recompute-modules", "core_attn", "mlp", "--bf16"]
    ours, theirs = megatron_settings(argv), vars(parse(argv))
    for key, value in ours.items():
        assert theirs[key] == value, key
    assert megatron_problems(ours) == megatron_problems(theirs) != []


def test_torchtitan_rules():
    good = {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": 8, "tensor_parallel_degree": 2,
            "pipeline_parallel_degree": 2, "context_parallel_degree": 1, "expert_parallel_degree": 8,
            "local_batch_size": 4, "pipeline_parallel_microbatch_size": 2, "world_size": 32,
            "disable_cuda_graphs": True}
    assert torchtitan_problems(good) == []
    for bad in ({"world_size": 64}, {"expert_parallel_degree": 32}, {"pipeline_parallel_microbatch_size": 3},
                {"disable_cuda_graphs": False}):
        assert len(torchtitan_problems({**good, **bad})) == 1
    assert all("torchtitan" in r.source for r in TORCHTITAN_RULES)


def test_bridge_llama_recipes_take_transformer_fields_nested():
    """Issue 22 #3: the Llama 2/3 recipes build BridgeGPTModelConfig; its own fields (generated from the pinned
    sources) are exactly the ones autopar keeps as model.X."""
    fields = BRIDGE_FIXTURE["sections"]["model_gpt_config"]
    assert {k for k, t in fields.items() if "ClassVar" not in t} == BRIDGE_GPT_CONFIG_FIELDS
    assert bridge_recipe_family(load_model("llama3_70b")) == "llama_nested"
    assert bridge_recipe_family(load_model("deepseek_v3")) == "provider"
    assert bridge_recipe_family(load_model("nemotron_h_8b")) == "hybrid"
    em = default_pick("llama3_70b", "bridge")["emit"]
    overrides = _bash_array(em["text"], "AUTOPAR_BRIDGE_OVERRIDES")
    assert any(o.startswith("model.transformer.tensor_model_parallel_size=") for o in overrides)
    assert "model.seq_length=4096" in overrides
    assert not any(o.startswith("model.tensor_model_parallel_size=") for o in overrides)


@pytest.mark.parametrize("argv", [["--model", "glm45", "--gpus", "512"],
                                  ["--model", "qwen3_30b_a3b", "--gpus", "16", "--pp", "2", "--vpp", "2", "--fsdp",
                                   "--ep", "2,4,8"]],   # an EP pick: the overlap the test is about
                         ids=["glm45", "qwen3_30b_a3b"])
def test_ep_overlap_is_withheld_where_megatrons_schedule_would_abort(argv):
    """Issue 22 #2: these picks emitted Megatron-FSDP plus --overlap-moe-expert-parallel-comm on an interleaved
    pipeline, which combined_1f1b.py asserts against at the first step."""
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        assert main(["solve", *argv, "--emit", "megatron", "--json", "--time-limit", "10"]) == 0
    em = json.loads(out.getvalue())["emit"]
    argv = _bash_array(em["text"], "AUTOPAR_MEGATRON_ARGS")
    ns = parse(argv)
    assert not (ns.use_megatron_fsdp and ns.overlap_moe_expert_parallel_comm
                and (ns.pipeline_model_parallel_layout or ns.num_layers_per_virtual_pipeline_stage))
    assert megatron_problems(vars(ns)) == []
    if ns.use_megatron_fsdp and ns.pipeline_model_parallel_size > 1:
        assert "combined_1f1b.py:210" in em["text"]       # the note says why the overlap is left out
