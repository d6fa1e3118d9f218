"""Hugging Face model ids resolve from the local Hugging Face cache (offline), via huggingface_hub (optional extra
``hf``). The cache here is a fake one written by the test, laid out as huggingface_hub lays it out."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("huggingface_hub", reason="optional extra: pip install 'autopar[hf]'")

# Qwen/Qwen2.5-7B config.json (huggingface.co/Qwen/Qwen2.5-7B, the fields autopar reads)
QWEN25_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
             "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
             "vocab_size": 152064, "max_position_embeddings": 131072, "rope_theta": 1000000.0,
             "tie_word_embeddings": False, "hidden_act": "silu", "rms_norm_eps": 1e-06, "torch_dtype": "bfloat16"}


@pytest.fixture
def hf_cache(tmp_path):
    commit = "d149729398750b98c0af14eb82c78cfe92750796"
    repo = tmp_path / "models--Qwen--Qwen2.5-7B"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(QWEN25_7B))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return tmp_path


def _run(cache, *args):
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "autopar.cli.main", *args], capture_output=True, text=True, env=env)


def test_hf_id_resolves_from_the_cache_offline(hf_cache):
    r = _run(hf_cache, "estimate", "--model", "Qwen/Qwen2.5-7B", "--gpus", "8", "--tp", "2", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["fits"] and d["layout"]["tp"] == 2
    r = _run(hf_cache, "zoo", "--json")          # zoo names are never taken for Hugging Face ids
    assert r.returncode == 0


def test_uncached_id_offline_is_one_clear_line(hf_cache):
    r = _run(hf_cache, "estimate", "--model", "Qwen/Qwen2.5-72B", "--gpus", "8")
    assert r.returncode == 2 and "not in the Hugging Face cache" in r.stderr and "HF_HUB_OFFLINE" in r.stderr
    assert "Traceback" not in r.stderr


def test_the_spec_matches_the_config(hf_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(hf_cache))
    import importlib

    import huggingface_hub.constants as c
    importlib.reload(c)
    from autopar.specs.loaders import load_model
    m = load_model("Qwen/Qwen2.5-7B", warn=lambda _: None)
    assert (m.name, m.num_layers, m.hidden_size, m.kv_heads, m.vocab_size) == ("Qwen2.5-7B", 28, 3584, 4, 152064)
    assert 7.0e9 < m.total_params < 8.0e9          # Qwen2.5-7B: 7.61B parameters (model card)
