"""The model types people train in 2026 load from their config.json (issue 22 #5) and match the published total
within 2 %. The fixtures and where each comes from: tests/specs/fixtures/hf/SOURCES.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autopar.specs.hf_config import SUPPORTED_MODEL_TYPES, model_from_hf_config
from autopar.specs.loaders import load_model

FIXTURES = Path(__file__).parent / "fixtures" / "hf"

# file, model_type, published total in billions (SOURCES.md says where each figure is printed)
PUBLISHED = [
    ("phi-4.json", "phi3", 14.7),
    ("smollm3-3b.json", "smollm3", 3.08),
    ("minimax-m2.json", "minimax_m2", 230.0),
    ("ling-lite-1.5.json", "bailing_moe", 16.8),
    ("ernie-4.5-21b-a3b.json", "ernie4_5_moe", 21.8),
]


def _load(name: str):
    data = json.loads((FIXTURES / name).read_text())
    return data, *model_from_hf_config(data, name=name[:-5], where=str(FIXTURES / name))


@pytest.mark.parametrize("name, model_type, billions", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_loads_and_matches_the_published_total(name, model_type, billions):
    data, m, unmapped = _load(name)
    assert data["model_type"] == model_type and model_type in SUPPORTED_MODEL_TYPES
    assert not unmapped, unmapped                       # every key is used or documented as not mattering
    assert abs(m.total_params / 1e9 - billions) / billions <= 0.02, m.summary()


def test_a_config_folder_loads_through_load_model(tmp_path):
    """The path a user takes: --model DIR with a config.json in it."""
    (tmp_path / "Phi-4").mkdir()
    (tmp_path / "Phi-4" / "config.json").write_text((FIXTURES / "phi-4.json").read_text())
    m = load_model(str(tmp_path / "Phi-4"))
    assert m.name == "Phi-4" and m.num_kv_heads == 10 and m.moe is None


def test_family_details():
    _, phi, _ = _load("phi-4.json")
    assert phi.sliding_window is None and not phi.tie_embeddings and phi.ffn_hidden_size == 17920
    _, smol, _ = _load("smollm3-3b.json")
    assert smol.tie_embeddings and smol.num_kv_heads == 4
    _, mm, _ = _load("minimax-m2.json")
    assert mm.head_dim == 128 and mm.moe.num_experts == 256 and mm.moe.num_shared_experts == 0
    assert mm.mtp_layers == 3 and mm.num_moe_layers == 62
    _, ling, _ = _load("ling-lite-1.5.json")
    assert ling.moe.num_shared_experts == 2 and ling.moe.first_dense_layers == 0
    _, ernie, _ = _load("ernie-4.5-21b-a3b.json")
    assert ernie.moe.first_dense_layers == 1 and ernie.num_moe_layers == 27 and ernie.moe.num_shared_experts == 2
    assert ernie.tie_embeddings


def test_ernie_moe_window_and_interval():
    data = json.loads((FIXTURES / "ernie-4.5-21b-a3b.json").read_text())
    m, _ = model_from_hf_config({**data, "moe_layer_interval": 2}, name="x", where="x")
    assert m.moe.moe_layer_interval == 2 and m.num_moe_layers == 14
    with pytest.raises(Exception, match="moe_layer_end_index"):   # MoE layers that stop early: not modelled
        model_from_hf_config({**data, "moe_layer_end_index": 20}, name="x", where="x")
