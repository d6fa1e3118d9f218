"""torchtitan 0.2.2 TOML (behind version="0.2.2") emitted for resolved layouts: parses with tomllib; degrees multiply
to the world size. The 0.3.0 Python config is tested in test_torchtitan_config.py."""

from __future__ import annotations

import tomllib

import pytest

from autopar.emit.torchtitan import model_parts, torchtitan_config
from autopar.search.heuristic import heuristic_layout
from autopar.specs.layout import Layout, resolve_layout
from autopar.specs.training import TrainingSpec

from .conftest import DSV3, H100, LLAMA3_8B, LLAMA3_70B, NVL72, TRAIN


def parse(layout, model, training=TRAIN) -> dict:
    return tomllib.loads(torchtitan_config(layout, model, training, version="0.2.2"))


def world(cfg: dict) -> int:
    p = cfg["parallelism"]
    return (p["data_parallel_replicate_degree"] * p["data_parallel_shard_degree"] * p["tensor_parallel_degree"]
            * p["pipeline_parallel_degree"] * p["context_parallel_degree"])


def test_deepseek_v3(dsv3_layout):
    cfg = parse(dsv3_layout, DSV3)
    p = cfg["parallelism"]
    assert world(cfg) == 1024
    assert (p["tensor_parallel_degree"], p["pipeline_parallel_degree"], p["expert_parallel_degree"],
            p["expert_tensor_parallel_degree"]) == (2, 16, 64, 1)
    assert p["pipeline_parallel_schedule"] == "1F1B" and p["enable_async_tensor_parallel"] is False
    parts = p["module_fqns_per_model_part"]
    assert [sum(f.startswith("layers.") for f in part) for part in parts] == list(dsv3_layout.stage_layers)
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
    assert cfg["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    # one pipeline schedule per step: all 32 micro-batches of a DP rank in one local batch
    assert cfg["training"] == {"local_batch_size": 32, "global_batch_size": 1024, "seq_len": 4096}


def test_interleaved_schedule(llama70_layout):
    cfg = parse(llama70_layout, LLAMA3_70B)
    p = cfg["parallelism"]
    assert world(cfg) == 64 and p["pipeline_parallel_schedule"] == "Interleaved1F1B"
    parts = p["module_fqns_per_model_part"]
    assert len(parts) == 8  # pp 4 · vpp 2
    layers = [f for part in parts for f in part if f.startswith("layers.")]
    assert layers == [f"layers.{i}" for i in range(80)]


def test_model_parts_virtual_stage_order():
    layout = resolve_layout(Layout(pp=2, vpp=2), LLAMA3_8B, TRAIN, 8)
    parts = model_parts(layout, LLAMA3_8B)
    assert [len([f for f in p if f.startswith("layers.")]) for p in parts] == [8, 8, 8, 8]
    assert parts[1][0] == "layers.8" and parts[2][0] == "layers.16"


@pytest.mark.parametrize("kw,replicate,shard", [
    ({"zero_stage": 0}, 4, 1),
    ({"zero_stage": 1}, 1, 4),
    ({"fsdp": True}, 1, 4),
    ({"hsdp_shard": 2}, 2, 2),
])
def test_data_parallel_mapping(kw, replicate, shard):
    layout = resolve_layout(Layout(tp=2, **kw), LLAMA3_8B, TRAIN, 8)
    cfg = parse(layout, LLAMA3_8B)
    p = cfg["parallelism"]
    assert (p["data_parallel_replicate_degree"], p["data_parallel_shard_degree"]) == (replicate, shard)
    assert world(cfg) == 8
    assert ("fsdp_reshard_after_forward" in p) == (kw.get("zero_stage") == 1)


@pytest.mark.parametrize("recompute,expected", [
    ("none", {"mode": "none"}),
    ("full", {"mode": "full"}),
    ("core_attn,mlp", {"mode": "selective", "selective_ac_option": "op"}),
])
def test_activation_checkpoint(recompute, expected):
    layout = resolve_layout(Layout(tp=2, recompute=recompute), LLAMA3_8B, TRAIN, 8)
    assert parse(layout, LLAMA3_8B)["activation_checkpoint"] == expected


def test_no_pipeline_keeps_micro_batch_as_local_batch():
    layout = resolve_layout(Layout(tp=2, micro_batch=2), LLAMA3_8B, TRAIN, 8)
    cfg = parse(layout, LLAMA3_8B)
    assert cfg["training"]["local_batch_size"] == 2 and "module_fqns_per_model_part" not in cfg["parallelism"]


def test_torchtitan_ep_constraint_is_flagged():
    layout = resolve_layout(Layout(tp=4, ep=2), DSV3, TRAIN, 64)
    assert "WARNING" in torchtitan_config(layout.model_copy(update={"etp": 2}), DSV3, TRAIN, version="0.2.2")


@pytest.mark.parametrize("gpus", [8, 64, 512])
@pytest.mark.parametrize("seq", [1024, 4096, 32768, 131072])
def test_heuristic_layouts_parse_and_multiply_to_the_world(gpus, seq):
    training = TrainingSpec(seq_len=seq, global_batch=1024)
    for model, hardware in ((LLAMA3_8B, H100), (LLAMA3_70B, H100), (DSV3, NVL72), (DSV3, H100)):
        layout = heuristic_layout(model, hardware, training, gpus)
        cfg = parse(layout, model, training)
        assert world(cfg) == gpus
        assert cfg["training"]["seq_len"] == seq and cfg["training"]["global_batch_size"] == 1024
        p = cfg["parallelism"]
        assert p["context_parallel_degree"] == layout.cp and p["expert_parallel_degree"] == layout.ep


def test_offloading_layout_says_torchtitan_has_no_setting_for_it():
    layout = resolve_layout(Layout(tp=2, offload_activations=0.5), LLAMA3_8B, TRAIN, 8)
    for version in ("0.2.2", "0.3.0"):
        assert "offloads 50% of the stored activations" in torchtitan_config(layout, LLAMA3_8B, TRAIN, version=version)
