"""``--emit bridge``: every override key exists on the Megatron-Bridge dataclass of its section (fixture generated from
the pinned Bridge source and its Megatron-LM submodule by tools/gen_bridge_keys.py), values are well-formed, and the
overrides carry the same settings as the Megatron-LM argv."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from autopar.emit import emit
from autopar.emit.bridge import BRIDGE_TARGET, bridge_overrides

from .test_megatron_parser import CASES

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "bridge_keys.json").read_text())


def _split(override: str) -> tuple[str, str, str]:
    key, value = override.split("=", 1)
    if "." not in key:
        return key, "", value
    section, field = key.split(".", 1)
    return section, field, value


def test_fixture_names_its_source():
    src = FIXTURE["source"]
    assert len(src["commit"]) == 40 and src["commit"][:12] in BRIDGE_TARGET and src["version"] in BRIDGE_TARGET
    assert FIXTURE["command"].startswith("python tools/gen_bridge_keys.py")


def check_bridge_keys(overrides: list[str], model) -> dict[str, str]:
    """Every override key exists on the dataclass the model's recipe family builds (fixture sections generated from
    the pinned sources); returns {key: value} with model.transformer.X read as model.X."""
    from autopar.specs.launcher_rules import bridge_recipe_family
    family = bridge_recipe_family(model)
    keys = {}
    for o in overrides:
        section, field, value = _split(o)
        if section == "mixed_precision":
            assert value in FIXTURE["mixed_precision_recipes"], value
            continue
        if section == "model" and family == "llama_nested":
            # BridgeGPTModelConfig: its own fields as model.X, the nested TransformerConfig's as model.transformer.X
            if field.startswith("transformer."):
                field = field[len("transformer."):]
                assert field in FIXTURE["sections"]["model_transformer"], f"model.transformer.{field}"
                assert field not in FIXTURE["sections"]["model_gpt_config"], field
            else:
                assert field in FIXTURE["sections"]["model_gpt_config"], \
                    f"model.{field}: BridgeGPTModelConfig has no such field (a TransformerConfig field needs " \
                    "model.transformer.)"
        else:
            where = "model_hybrid" if section == "model" and family == "hybrid" else section
            assert field in FIXTURE["sections"][where], f"{section}.{field} is not a Megatron-Bridge field"
        assert value, o
        assert f"{section}.{field}" not in keys, f"{section}.{field} set twice"
        keys[f"{section}.{field}"] = value
    return keys


@pytest.mark.parametrize("case", sorted(CASES))
def test_override_keys_exist_in_bridge_config(case):
    layout, model, training, hw = CASES[case]()
    overrides, launch = bridge_overrides(layout, model, training, hw)
    keys = check_bridge_keys(overrides, model)
    assert len(keys) == len(overrides) - 1                            # no key set twice
    assert keys["model.tensor_model_parallel_size"] == str(layout.tp)
    assert keys["model.pipeline_model_parallel_size"] == str(layout.pp)
    assert keys["train.global_batch_size"] == str(training.global_batch)
    assert keys["model.seq_length"] == keys["dataset.seq_length"] == str(training.seq_len)
    assert keys["model.sequence_parallel"] == ("true" if layout.sp else "false")
    # every overlap switch of the Megatron argv is carried over
    for flag, key in (("--overlap-grad-reduce", "ddp.overlap_grad_reduce"),
                      ("--overlap-param-gather", "ddp.overlap_param_gather"),
                      ("--tp-comm-overlap", "model.tp_comm_overlap"),
                      ("--overlap-moe-expert-parallel-comm", "model.overlap_moe_expert_parallel_comm")):
        assert (flag in launch.args) == (keys.get(key) == "true"), flag
    if layout.vpp > 1:
        assert "model.virtual_pipeline_model_parallel_size" in keys or "model.pipeline_model_parallel_layout" in keys
    if model.is_moe:
        assert keys["model.moe_token_dispatcher_type"] == "alltoall" and keys["model.moe_grouped_gemm"] == "true"


def test_text_is_a_bash_array(dsv3_layout):
    from .conftest import DSV3, TRAIN
    from .test_megatron_parser import NVL72_CAL
    text = emit("bridge", dsv3_layout, DSV3, TRAIN, 1024, NVL72_CAL)
    assert BRIDGE_TARGET in text
    out = subprocess.run(["bash", "-c", text + 'printf "%s\\n" "${AUTOPAR_BRIDGE_OVERRIDES[@]}"'],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == bridge_overrides(dsv3_layout, DSV3, TRAIN, NVL72_CAL)[0]
    assert "model.num_layers_in_first_pipeline_stage=3" in out


@pytest.mark.parametrize("name, gpus, kw", [("nemotron_h_8b", 64, dict(tp=2, pp=2)),
                                            ("nemotron3_nano_30b_a3b", 64, dict(tp=1, ep=8)),
                                            ("qwen3_next_80b_a3b", 256, dict(tp=4, pp=4, ep=8))])
def test_hybrid_overrides_are_hybrid_model_provider_fields(name, gpus, kw):
    """Hybrid recipes hold a HybridModelProvider (fixture section model_hybrid, from hybrid_provider.py): every model
    key is one of its fields, and the pattern and shape equal the Megatron-LM argv's."""
    from autopar.emit.megatron import megatron_launch
    from autopar.specs.layout import Layout, resolve_layout
    from autopar.specs.loaders import load_model

    from .conftest import TRAIN
    from .megatron_parser import parse
    from .test_megatron_parser import H100_CAL

    model = load_model(name)
    layout = resolve_layout(Layout(**kw), model, TRAIN, gpus)
    overrides, _ = bridge_overrides(layout, model, TRAIN, H100_CAL)
    keys = dict(o.split("=", 1) for o in overrides)
    assert len(keys) == len(overrides)
    for key in keys:
        section, _, field = key.partition(".")
        if section == "model":
            assert field in FIXTURE["sections"]["model_hybrid"], f"{key} is not a HybridModelProvider field"
        elif section != "mixed_precision":
            assert field in FIXTURE["sections"][section], key
    ns = parse(megatron_launch(layout, model, TRAIN, H100_CAL).args)
    assert keys["model.hybrid_layer_pattern"] == f'"{ns.hybrid_layer_pattern}"'
    if ns.mamba_num_heads:
        assert keys["model.mamba_num_heads"] == str(ns.mamba_num_heads)
        assert keys["model.mamba_chunk_size"] == "128"
    if ns.linear_num_value_heads:
        assert keys["model.linear_num_value_heads"] == str(ns.linear_num_value_heads)
        assert keys["model.attention_output_gate"] == "true"
    assert not any(k.startswith("model.spec") for k in keys)


def test_hybrid_with_virtual_stages_is_refused():
    """HybridModelProvider.provide (Bridge 067f987df03b) asserts virtual_pipeline_model_parallel_size is None."""
    from autopar.errors import AutoparInputError
    from autopar.specs.layout import Layout, resolve_layout
    from autopar.specs.loaders import load_model

    from .conftest import TRAIN

    model = load_model("nemotron_h_8b")
    with pytest.raises(AutoparInputError, match="virtual_pipeline_model_parallel_size is None"):
        bridge_overrides(resolve_layout(Layout(tp=2, pp=2, vpp=2), model, TRAIN, 64), model, TRAIN)


def test_fixture_model_hybrid_is_the_hybrid_provider():
    """The model_hybrid section has the fields only HybridModelProvider declares, the plain model section lacks them."""
    hybrid, gpt = FIXTURE["sections"]["model_hybrid"], FIXTURE["sections"]["model"]
    assert {"hybrid_layer_pattern", "mamba_chunk_size"} <= set(hybrid)
    assert "hybrid_layer_pattern" not in gpt


def test_fp8_param_gather_is_carried_by_the_mixed_precision_preset():
    # Bridge's MXFP8 preset sets fp8_param_gather=True (mixed_precision.py:264) and its value reaches the DDP config
    # over any override: with the knob on the preset is the launch; with it off the note says the run differs
    from autopar.specs.layout import Layout, resolve_layout
    from autopar.specs.training import TrainingSpec
    from .conftest import LLAMA3_8B
    for knob, noted in ((True, False), (False, True)):
        tr = TrainingSpec(seq_len=4096, global_batch=64, precision="mxfp8", fp8_param_gather=knob)
        lay = resolve_layout(Layout(tp=2, zero_stage=1), LLAMA3_8B, tr, 8)
        overrides, launch = bridge_overrides(lay, LLAMA3_8B, tr)
        assert "mixed_precision=bf16_with_mxfp8_mixed" in overrides
        check_bridge_keys(overrides, LLAMA3_8B)
        assert any("fp8_param_gather=true" in n for n in launch.notes) == noted


def test_bf16_gradients_are_noted_against_the_presets_fp32():
    # Bridge's bf16 presets set grad_reduce_in_fp32=True and copy it over ddp.grad_reduce_in_fp32 at setup
    # (mixed_precision.py:47,196): bf16 gradients need the recipe's own mixed_precision switch, and the note says so;
    # fp32 (TrainingSpec's default for bf16 weights) is what the preset does, nothing to say
    from autopar.specs.layout import Layout, resolve_layout
    from autopar.specs.training import TrainingSpec
    from .conftest import LLAMA3_8B
    for grad, noted in (("bf16", True), (None, False)):
        tr = TrainingSpec(seq_len=4096, global_batch=64, **({"grad_dtype": grad} if grad else {}))
        lay = resolve_layout(Layout(tp=2, zero_stage=1), LLAMA3_8B, tr, 8)
        overrides, launch = bridge_overrides(lay, LLAMA3_8B, tr)
        assert ("ddp.grad_reduce_in_fp32=false" in overrides) == noted
        assert any("grad_reduce_in_fp32 = False" in n for n in launch.notes) == noted
