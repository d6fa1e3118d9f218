"""Shared specs for the emitter tests: real architectures built inline, and their heuristic layouts."""

from __future__ import annotations

import pytest

from autopar.search.heuristic import heuristic_layout
from autopar.specs.hardware import HardwareSpec
from autopar.specs.model import MLASpec, ModelSpec, MoESpec
from autopar.specs.training import TrainingSpec

H100 = HardwareSpec(name="h100_sxm", peak_tflops_bf16=989, peak_tflops_fp16=989, peak_tflops_fp8=1979, hbm_gib=74.5,
                    hbm_tbps=3.35, gpus_per_node=8, nvlink_domain_size=8, nvlink_gbps=450, scaleout_gbps=50)
NVL72 = HardwareSpec(**{**H100.model_dump(), "name": "gb200_nvl72", "gpus_per_node": 4, "nvlink_domain_size": 72})
TRAIN = TrainingSpec(seq_len=4096, global_batch=1024)

# DeepSeek-V3 (config.json): 61 layers, h 7168, 128 heads, MLA, vocab 129280, ffn 18432, 256 experts top-8 of 2048,
# 1 shared, first 3 dense, 1 MTP module.
DSV3 = ModelSpec(name="deepseek_v3", num_layers=61, hidden_size=7168, ffn_hidden_size=18432, num_attention_heads=128,
                 vocab_size=129280, mtp_layers=1,
                 mla=MLASpec(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                             v_head_dim=128),
                 moe=MoESpec(num_experts=256, top_k=8, expert_ffn_hidden_size=2048, num_shared_experts=1,
                             first_dense_layers=3))
LLAMA3_70B = ModelSpec(name="llama3_70b", num_layers=80, hidden_size=8192, ffn_hidden_size=28672,
                       num_attention_heads=64, num_kv_heads=8, vocab_size=128256)
LLAMA3_8B = ModelSpec(name="llama3_8b", num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                      num_kv_heads=8, vocab_size=128256)


@pytest.fixture(scope="session")
def dsv3_layout():
    """The heuristic's DeepSeek-V3 layout on 1024 GB200 NVL72 GPUs: TP2 PP16 EP64, stages 3/4x14/2."""
    layout = heuristic_layout(DSV3, NVL72, TRAIN, 1024)
    assert (layout.tp, layout.pp, layout.ep) == (2, 16, 64)
    return layout


@pytest.fixture(scope="session")
def llama70_layout():
    """Llama 3 70B on 64 H100s: TP8 PP4 VPP2 DP2."""
    layout = heuristic_layout(LLAMA3_70B, H100, TRAIN, 64)
    assert (layout.tp, layout.pp, layout.vpp) == (8, 4, 2)
    return layout
