"""Bad input files: every mistake is an AutoparInputError whose message names the file, the line or the field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from autopar.errors import AutoparInputError
from autopar.specs.loaders import load_hardware, load_model, zoo_dir


def _model_data() -> dict:
    return yaml.safe_load((zoo_dir("models") / "llama3_70b.yaml").read_text())


def _hardware_data() -> dict:
    return yaml.safe_load((zoo_dir("hardware") / "h100_sxm.yaml").read_text())


def _write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ---- syntax ---------------------------------------------------------------------------------------------------
def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\nnum_layers: 2\nhidden_size: [64, 128\nvocab_size: 100\n")
    with pytest.raises(AutoparInputError) as err:
        load_model(path)
    msg = str(err.value)
    assert str(path) in msg
    assert "malformed YAML" in msg
    line = int(re.search(r"line (\d+)", msg).group(1))
    assert 3 <= line <= 4, msg  # the unclosed list opens on line 3; PyYAML reports where it gave up


def test_yaml_bad_indentation_in_hardware_file(tmp_path):
    path = tmp_path / "hw.yaml"
    path.write_text("name: x\n  peak_tflops_bf16: 10\n peak_tflops_fp16: 10\n")
    with pytest.raises(AutoparInputError, match=rf"{re.escape(str(path))}: malformed YAML at line \d+"):
        load_hardware(path)


def test_hf_style_json_with_malformed_syntax(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n  "model_type": "llama",\n  "hidden_size": 4096,,\n  "num_hidden_layers": 32\n}\n')
    with pytest.raises(AutoparInputError) as err:
        load_model(path)
    msg = str(err.value)
    assert str(path) in msg and "malformed JSON at line 3" in msg


def test_hf_folder_with_malformed_config_json(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096')
    with pytest.raises(AutoparInputError, match=r"config\.json: malformed JSON at line 1"):
        load_model(folder)


@pytest.mark.parametrize("text,kind", [("- 1\n- 2\n", "list"), ("", "NoneType"), ("just a string\n", "str")])
def test_file_that_is_not_a_mapping(tmp_path, text, kind):
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    with pytest.raises(AutoparInputError, match=rf"{re.escape(str(path))}: expected a mapping of fields, got {kind}"):
        load_model(path)
    with pytest.raises(AutoparInputError, match="expected a mapping"):
        load_hardware(path)


# ---- unknown keys ---------------------------------------------------------------------------------------------
def test_unknown_key_in_model_file(tmp_path):
    data = _model_data()
    data["hiden_size"] = data.pop("hidden_size")
    path = _write_yaml(tmp_path / "typo.yaml", data)
    with pytest.raises(AutoparInputError) as err:
        load_model(path)
    msg = str(err.value)
    assert str(path) in msg
    assert "field 'hiden_size': unknown key" in msg
    assert "field 'hidden_size'" in msg  # the real field is now missing, and that is said too


def test_unknown_nested_key_in_model_file(tmp_path):
    data = _model_data()
    data["moe"] = {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 1024, "num_shared_expert": 1}
    with pytest.raises(AutoparInputError, match=r"field 'moe\.num_shared_expert': unknown key"):
        load_model(_write_yaml(tmp_path / "moe.yaml", data))


def test_unknown_key_in_hardware_file(tmp_path):
    data = _hardware_data()
    data["nvlink_gbs"] = 450
    path = _write_yaml(tmp_path / "hw.yaml", data)
    with pytest.raises(AutoparInputError) as err:
        load_hardware(path)
    assert "field 'nvlink_gbs': unknown key" in str(err.value)
    assert str(path) in str(err.value)


def test_unknown_key_in_hardware_efficiency_section(tmp_path):
    data = _hardware_data()
    data["efficiency"] = {"nvlnk": 0.7}
    with pytest.raises(AutoparInputError, match=r"field 'efficiency\.nvlnk': unknown key"):
        load_hardware(_write_yaml(tmp_path / "hw.yaml", data))


# ---- values ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("field,value", [
    ("hidden_size", 0), ("num_layers", -4), ("num_attention_heads", 0), ("vocab_size", -1),
    ("ffn_hidden_size", 0), ("num_kv_heads", 0),
])
def test_zero_or_negative_model_sizes(tmp_path, field, value):
    data = _model_data()
    data[field] = value
    with pytest.raises(AutoparInputError, match=rf"field '{field}': Input should be greater than 0"):
        load_model(_write_yaml(tmp_path / "m.yaml", data))


@pytest.mark.parametrize("field,value", [
    ("hbm_gib", -1), ("hbm_tbps", 0), ("peak_tflops_bf16", 0), ("nvlink_gbps", -450), ("gpus_per_node", 0),
    ("peak_tflops_fp8", -1),
])
def test_zero_or_negative_hardware_sizes(tmp_path, field, value):
    data = _hardware_data()
    data[field] = value
    # a size must be above 0; a rate (TFLOP/s, TB/s, GB/s) at least autopar's RATE_FLOOR (0.001)
    with pytest.raises(AutoparInputError, match=rf"field '{field}': Input should be greater than (0|or equal to 0\.001)"):
        load_hardware(_write_yaml(tmp_path / "hw.yaml", data))


def test_zero_expert_count(tmp_path):
    data = _model_data()
    data["moe"] = {"num_experts": 0, "top_k": 2, "expert_ffn_hidden_size": 1024}
    with pytest.raises(AutoparInputError, match=r"field 'moe\.num_experts': Input should be greater than 0"):
        load_model(_write_yaml(tmp_path / "m.yaml", data))


def test_wrong_type_names_the_field(tmp_path):
    data = _model_data()
    data["hidden_size"] = "big"
    with pytest.raises(AutoparInputError, match=r"field 'hidden_size': Input should be a valid integer"):
        load_model(_write_yaml(tmp_path / "m.yaml", data))


def test_missing_required_field_names_it(tmp_path):
    data = _hardware_data()
    del data["hbm_tbps"]
    with pytest.raises(AutoparInputError, match=r"field 'hbm_tbps': Field required"):
        load_hardware(_write_yaml(tmp_path / "hw.yaml", data))


def test_cross_field_rule_shows_the_numbers(tmp_path):
    data = _hardware_data()
    data["gpus_per_node"], data["nvlink_domain_size"] = 4, 6
    with pytest.raises(AutoparInputError, match=r"nvlink_domain_size \(6\) and gpus_per_node \(4\)"):
        load_hardware(_write_yaml(tmp_path / "hw.yaml", data))
    data = _model_data()
    data["num_kv_heads"] = 7
    with pytest.raises(AutoparInputError, match=r"num_attention_heads \(64\) must be a multiple of num_kv_heads \(7\)"):
        load_model(_write_yaml(tmp_path / "m.yaml", data))


# ---- names and paths ------------------------------------------------------------------------------------------
def test_unknown_model_zoo_name():
    with pytest.raises(AutoparInputError) as err:
        load_model("llama3_70")
    msg = str(err.value)
    assert "unknown model 'llama3_70'" in msg and "llama3_70b" in msg  # lists what the zoo has


def test_unknown_hardware_zoo_name():
    with pytest.raises(AutoparInputError) as err:
        load_hardware("h100")
    msg = str(err.value)
    assert "'h100': not a file and not in the zoo" in msg and "h100_sxm" in msg


@pytest.mark.parametrize("name", ["missing.yaml", "missing.yml", "missing.json"])
def test_missing_file(tmp_path, name):
    path = tmp_path / name
    with pytest.raises(AutoparInputError, match=rf"model file not found: {re.escape(str(path))}"):
        load_model(path)
    with pytest.raises(AutoparInputError, match=rf"file not found: {re.escape(str(path))}"):
        load_hardware(str(path))


def test_hardware_messages_say_hardware(tmp_path):
    with pytest.raises(AutoparInputError, match="unknown hardware 'h100'"):
        load_hardware("h100")
    with pytest.raises(AutoparInputError, match="hardware file not found"):
        load_hardware(tmp_path / "missing.yaml")


def test_folder_without_config_json(tmp_path):
    with pytest.raises(AutoparInputError, match=rf"cannot read {re.escape(str(tmp_path))}"):
        load_model(tmp_path)


def test_plain_json_model_file_with_bad_value(tmp_path):
    data = _model_data()
    data["hidden_size"] = -8192
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data))
    with pytest.raises(AutoparInputError, match=r"m\.json: field 'hidden_size': Input should be greater than 0"):
        load_model(path)


def test_errors_are_value_errors_for_library_callers(tmp_path):
    with pytest.raises(ValueError):
        load_hardware("no_such_gpu")


@pytest.mark.parametrize("encoding", ["latin-1", "utf-16"])
def test_file_that_is_not_utf8(tmp_path, encoding):
    path = tmp_path / "model.yaml"
    path.write_text("name: café\nnum_layers: 2\n", encoding=encoding)
    with pytest.raises(AutoparInputError, match=re.escape(str(path))):
        load_model(path)


def test_an_activation_that_contradicts_gated_mlp_is_refused(tmp_path):
    # llama3_70b is a gated (SwiGLU) MLP: squared ReLU is a plain one, and swiglu on a plain MLP is wrong too
    path = _write_yaml(tmp_path / "m.yaml", {**_model_data(), "activation": "squared_relu"})
    with pytest.raises(AutoparInputError, match="activation 'squared_relu' is not a gated activation but gated_mlp is"):
        load_model(path)
    path = _write_yaml(tmp_path / "p.yaml", {**_model_data(), "gated_mlp": False, "activation": "swiglu"})
    with pytest.raises(AutoparInputError, match="activation 'swiglu' is a gated activation but gated_mlp is false"):
        load_model(path)
    path = _write_yaml(tmp_path / "q.yaml", {**_model_data(), "activation": "tanh"})
    with pytest.raises(AutoparInputError, match="activation"):
        load_model(path)
