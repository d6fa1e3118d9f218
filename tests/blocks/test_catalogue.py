"""The catalogue and the contract every block keeps: names, ground floor, and answers the cost model can read."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import autopar.blocks as blocks
from autopar.blocks import (CHANNELS, KDA, MIXERS, MLA, MLP, SPLITS, GatedDeltaNet, GLA, Lightning, Mamba1, Mamba2,
                            MoE)
from autopar.blocks.attention import Attention
from autopar.cost.layer_sums import LayerSums
from autopar.cost.shapes import TP_SPLIT
from autopar.specs.loaders import load_model

ONE_OF_EACH = [
    Attention(hidden=1024, heads=16, kv_heads=4, head_dim=64, window=256, sinks=True, output_gate=True),
    MLA(hidden=1024, heads=16, kv_heads=16, head_dim=64, q_lora_rank=256, kv_lora_rank=128, qk_nope_head_dim=64,
        qk_rope_head_dim=32, v_head_dim=64),
    MLP(hidden=1024, ffn=2816), MoE(hidden=1024, num_experts=16, top_k=2, expert_ffn=512, num_shared=1, shared_ffn=512),
    GLA(hidden=1024, heads=8, head_dim=128, gate_low_rank=16, conv_kernel=4, output_gate=True),
    Lightning(hidden=1024, heads=8, head_dim=128),
    GatedDeltaNet(hidden=1024, heads=4, value_heads=8, head_dim=128, conv_kernel=4, output_gate=True),
    KDA(hidden=1024, heads=8, head_dim=128, conv_kernel=4), Mamba2(hidden=1024, heads=32, head_dim=64, state_size=128,
                                                                   n_groups=2, conv_kernel=4),
    Mamba1(hidden=1024, inner_size=2048, state_size=16, dt_rank=64, conv_kernel=4, bc_norms=True),
]


def test_catalogue_names_its_classes_with_a_title_and_a_source():
    for name, cls in {**MIXERS, **CHANNELS}.items():
        assert cls.kind == name and cls.title and cls.source
    assert {type(b) for b in ONE_OF_EACH} == {*MIXERS.values(), *CHANNELS.values(), MLA}


def test_blocks_import_nothing_else_of_autopar():
    for path in Path(blocks.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("autopar"):
                assert node.module.startswith("autopar.blocks"), (path.name, node.module)


@pytest.mark.parametrize("block", ONE_OF_EACH, ids=lambda b: b.kind)
def test_every_block_answers_in_the_cost_model_vocabulary(block):
    roles = {f[len("act_"):] for f in LayerSums.__dataclass_fields__ if f.startswith("act_")}
    assert set(block.stored()) <= roles
    assert set(block.membound()) <= set(TP_SPLIT)
    assert {lin.split for lin in block.gemms()} <= set(SPLITS)
    assert {r.axis for r in block.rules()} <= {"tp", "tp·cp", "cp", "ep", "etp"}
    assert block.params() >= block.gemm_params() > 0 and block.kv_params() >= 0 and block.state_elems() >= 0
    assert all(r.problem(tp=1) is None for r in block.rules())               # one GPU breaks no rule
    if block.has_state:     # the scan is priced as one GEMM of (nearly) its FLOPs: rounded to whole columns
        core = block.gemms()[-1]
        assert abs(2 * core.k * core.n - block.scan_flops()) <= 2 * core.k
        assert block.a2a_elems() == block.in_width() + block.out_width()


def test_a_model_layer_is_the_sum_of_its_blocks():
    m = load_model("falcon_h1_7b")                     # attention and Mamba-2 in parallel, then an MLP
    att, mamba = m.mixer_blocks(0)
    mlp = m.channel_block(0)
    assert att.keeps_kv and mamba.has_state and isinstance(mlp, MLP)
    assert m.layer_nonexpert_params(0) == att.params() + mamba.params() + mlp.params() + 2 * m.norm_params
    assert m.layer_forward_flops_per_token(0, 4096) == (2.0 * (att.gemm_params() + mamba.gemm_params())
                                                        + att.attention_core_flops(4096) + mamba.scan_flops()
                                                        + mlp.forward_flops())


@pytest.mark.parametrize("block", ONE_OF_EACH, ids=lambda b: b.kind)
def test_separate_projections_keep_every_blocks_flops_and_weights(block):
    """TrainingSpec.projections 'separate' changes how the GEMMs are cut, never what they compute: the same weights
    (so the same 2·K·N FLOPs per token) in valid splits, and only a GEMM after another may share its input."""
    fused, separate = block.launched_gemms("fused"), block.launched_gemms("separate")
    assert fused == block.gemms() and separate == block.separate_gemms()
    assert sum(lin.params for lin in separate) == sum(lin.params for lin in fused)
    assert {lin.split for lin in separate} <= set(SPLITS) and len(separate) >= len(fused)
    assert not separate[0].shares_input and not any(lin.shares_input for lin in fused)
    for prev, lin in zip(separate, separate[1:]):
        if lin.shares_input:
            assert (lin.k, lin.split, lin.module) == (prev.k, prev.split, prev.module)
