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


@pytest.mark.parametrize("case", sorted(CASES))
def test_override_keys_exist_in_bridge_config(case):
    layout, model, training, hw = CASES[case]()
    overrides, launch = bridge_overrides(layout, model, training, hw)
    keys = {}
    for o in overrides:
        section, field, value = _split(o)
        if section == "mixed_precision":
            assert value in FIXTURE["mixed_precision_recipes"], value
            continue
        assert field in FIXTURE["sections"][section], f"{section}.{field} is not a Megatron-Bridge field"
        assert value, o
        keys[f"{section}.{field}"] = value
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
