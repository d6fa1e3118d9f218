"""torchtitan 0.3.0 output: a Python module whose ``autopar_config()`` returns a ``Trainer.Config``.

Always: the module is valid Python, imports a config function the 0.3.0 wheel ships, and sets only fields that exist in
its ``ParallelismConfig`` / ``TrainingConfig`` / ``CompileConfig`` (fixture generated from the wheel by
tools/gen_torchtitan_fields.py). With the optional extra installed (``pip install torchtitan==0.3.0``, CPU torch is
enough): torchtitan builds the config itself, runs its own checks, and ParallelDims accepts the degrees.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from autopar.emit import emit
from autopar.emit.torchtitan import TORCHTITAN_MODELS, TORCHTITAN_VERSION, torchtitan_config
from autopar.errors import AutoparInputError
from autopar.search.heuristic import heuristic_layout
from autopar.specs.layout import Layout, resolve_layout
from autopar.specs.model import ModelSpec

from .conftest import DSV3, H100, LLAMA3_8B, LLAMA3_70B, NVL72, TRAIN

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / f"torchtitan_{TORCHTITAN_VERSION}_fields.json").read_text())
H100_CAL = H100
MIXTRAL = ModelSpec(name="mixtral_8x7b", num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                    num_kv_heads=8, vocab_size=32000, moe={"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 14336})


def _cases():
    yield "dsv3", resolve_layout(Layout(tp=2, pp=16, ep=64, recompute="selective",
                                        stage_layers=(3,) + (4,) * 14 + (2,)), DSV3, TRAIN, 1024), DSV3
    yield "llama70_vpp", heuristic_layout(LLAMA3_70B, H100, TRAIN, 64), LLAMA3_70B
    yield "llama8_ddp_full", resolve_layout(Layout(tp=2, zero_stage=0, recompute="full"), LLAMA3_8B, TRAIN, 8), LLAMA3_8B
    yield "llama8_hsdp", resolve_layout(Layout(hsdp_shard=4), LLAMA3_8B, TRAIN, 16), LLAMA3_8B
    yield "llama8_tp_nosp", resolve_layout(Layout(tp=2, sequence_parallel=False), LLAMA3_8B, TRAIN, 8), LLAMA3_8B


CASES = {name: (layout, model) for name, layout, model in _cases()}


def _replace_kwargs(text: str) -> dict[str, dict[str, object]]:
    """{"parallelism": {...}, "training": {...}, "compile": {...}} from the emitted replace(...) calls."""
    tree = ast.parse(text)
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "autopar_config")
    outer = func.body[-1].value
    out = {}
    for kw in outer.keywords:
        if isinstance(kw.value, ast.Call) and getattr(kw.value.func, "id", None) == "replace":
            out[kw.arg] = {k.arg: ast.literal_eval(k.value) for k in kw.value.keywords
                           if not isinstance(k.value, ast.Call)}
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_fields_exist_in_torchtitan_0_3_0(case):
    layout, model = CASES[case]
    text = torchtitan_config(layout, model, TRAIN, H100_CAL)
    assert f"torchtitan {TORCHTITAN_VERSION}" in text
    kw = _replace_kwargs(text)
    fields = FIXTURE["fields"]
    assert set(kw["parallelism"]) <= set(fields["ParallelismConfig"])
    assert set(kw["training"]) <= set(fields["TrainingConfig"])
    assert set(kw.get("compile", {})) <= set(fields["CompileConfig"]) | {"components"}
    p = kw["parallelism"]
    assert (p["data_parallel_replicate_degree"] * p["data_parallel_shard_degree"] * p["tensor_parallel_degree"]
            * p["pipeline_parallel_degree"] * p["context_parallel_degree"]) == layout.world
    assert p["enable_sequence_parallel"] == layout.sp
    if layout.pp > 1:
        assert kw["training"]["disable_cuda_graphs"] is True       # torchtitan refuses CUDA graphs with PP
        assert kw["training"]["local_batch_size"] % p["pipeline_parallel_microbatch_size"] == 0
    assert ("compile" in kw) == (layout.tp > 1)                     # async TP where the hardware counts TP overlap


def test_every_mapped_model_has_its_config_function_in_the_wheel():
    for module, func in TORCHTITAN_MODELS.values():
        assert func in FIXTURE["config_functions"][module], (module, func)


def test_models_torchtitan_lacks_get_a_note_not_a_config():
    layout = resolve_layout(Layout(tp=2, ep=8), MIXTRAL, TRAIN, 64)
    text = torchtitan_config(layout, MIXTRAL, TRAIN, H100_CAL)
    assert "no config" in text and "mixtral_8x7b" in text
    assert all(line.startswith("#") for line in text.splitlines())


def test_expert_tensor_parallel_cannot_be_expressed():
    layout = resolve_layout(Layout(tp=2, ep=8, etp=2), DSV3.model_copy(update={"num_layers": 64}), TRAIN, 64)
    text = torchtitan_config(layout, DSV3.model_copy(update={"num_layers": 64}), TRAIN)
    assert "no expert tensor parallelism" in text and "def autopar_config" not in text


def test_unknown_version_is_refused():
    with pytest.raises(AutoparInputError, match="torchtitan version"):
        torchtitan_config(CASES["llama8_hsdp"][0], LLAMA3_8B, TRAIN, version="0.1")


@pytest.mark.parametrize("case", sorted(CASES))
def test_torchtitan_builds_its_own_config(case, tmp_path, monkeypatch):
    """Optional extra: torchtitan 0.3.0 imports the module, builds Trainer.Config and checks the degrees."""
    pytest.importorskip("torchtitan.trainer", reason="optional extra: pip install torchtitan==0.3.0")
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.trainer import Trainer

    layout, model = CASES[case]
    (tmp_path / "autopar_plan_test.py").write_text(emit("torchtitan", layout, model, TRAIN, layout.world, H100_CAL))
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    module = importlib.import_module("autopar_plan_test")
    importlib.reload(module)
    cfg = module.autopar_config()
    assert isinstance(cfg, Trainer.Config)
    dataclasses.replace(cfg)                        # re-runs Trainer.Config.__post_init__ on the final values
    dims = ParallelDims.from_config(cfg.parallelism, layout.world)
    assert (dims.tp, dims.pp, dims.cp, dims.ep) == (layout.tp, layout.pp, layout.cp, layout.ep)
    assert cfg.training.global_batch_size == TRAIN.global_batch and cfg.training.seq_len == TRAIN.seq_len


@pytest.mark.parametrize("version", ["0.3.0", "0.2.2"])
def test_hybrid_models_are_refused(version):
    """torchtitan has no Mamba / linear-attention model autopar's zoo could map to (docstring of
    autopar/emit/torchtitan.py): an error naming the layer kinds, not a config or a generic 'no config' note."""
    from autopar.specs.loaders import load_model

    model = load_model("nemotron_h_8b")
    layout = resolve_layout(Layout(tp=2), model, TRAIN, 64)
    with pytest.raises(AutoparInputError, match=r"hybrid model \(layer kinds attention, mamba2, none\)"):
        torchtitan_config(layout, model, TRAIN, H100_CAL, version=version)
    llama = torchtitan_config(resolve_layout(Layout(tp=2), LLAMA3_8B, TRAIN, 8), LLAMA3_8B, TRAIN, H100_CAL)
    assert "def autopar_config" in llama


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_the_emitted_optimizer_is_the_one_priced(impl):
    """torchtitan 0.2.2 and 0.3.0 default to fused AdamW; a prediction that priced torch's foreach AdamW (the torchtitan
    stack's default, as its 2024-12 runs ran) writes implementation 'foreach', a field the 0.3.0 wheel has."""
    import tomllib
    layout = resolve_layout(Layout(fsdp=True), LLAMA3_8B, TRAIN, 8)
    tr = TRAIN.model_copy(update={"optimizer_impl": impl})
    kw = _replace_kwargs(torchtitan_config(layout, LLAMA3_8B, tr, H100_CAL))
    toml = tomllib.loads(torchtitan_config(layout, LLAMA3_8B, tr, version="0.2.2"))
    if impl == "fused":
        assert "optimizer" not in kw and "optimizer" not in toml
    else:
        assert kw["optimizer"] == {"implementation": "foreach"} == toml["optimizer"]
        assert set(kw["optimizer"]) <= set(FIXTURE["fields"]["OptimizersContainer.Config"])


def test_the_loss_is_compiled_as_the_prediction_priced_it():
    """compiled_loss on: compile.components names "loss" (torchtitan's default list); off: the model only, so the run
    keeps the eager loss the prediction counted (autopar/specs/stack.py compiled_loss)."""
    from autopar.specs.loaders import load_stack
    from autopar.specs.stack import parse_knobs
    layout = CASES["llama8_tp_nosp"][0]
    tt = load_stack("torchtitan")
    for knobs, want in (("compile", '"model", "loss"}'), ("compile,compiled_loss=off", 'components=["model"]')):
        tr = TRAIN.model_copy(update=tt.with_knobs(parse_knobs(knobs)).training_fields())
        text = torchtitan_config(layout, LLAMA3_8B, tr, H100_CAL)
        assert want in text and "enable=True" in text, knobs


def test_a_compiled_loss_beside_eager_blocks_compiles_the_loss_alone():
    # a TrainingSpec that prices torch's loss compiled and the blocks eager (possible from Python, not from the stack
    # knobs): the emitted run compiles the loss and nothing else, as priced
    from autopar.specs.loaders import load_stack
    from autopar.specs.stack import parse_knobs
    layout = CASES["llama8_tp_nosp"][0]
    fields = load_stack("torchtitan").with_knobs(parse_knobs("eager")).training_fields()
    tr = TRAIN.model_copy(update={**fields, "cross_entropy": "compiled"})
    text = torchtitan_config(layout, LLAMA3_8B, tr, H100_CAL)
    assert 'components=["loss"]' in text and "enable=True" in text
    eager = torchtitan_config(layout, LLAMA3_8B, TRAIN.model_copy(update=fields), H100_CAL)
    assert "compile=" not in eager
