"""Tensor-parallel communication (autopar/cost/tp.py): one reduction per block a layer actually has."""

from __future__ import annotations

import pytest

from autopar.cost import Estimator
from autopar.cost.collectives import Network
from autopar.cost.tp import tp_time_per_microbatch
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_model
from autopar.specs.training import TrainingSpec

H100 = load_hardware("h100_sxm")
TR = TrainingSpec(seq_len=4096, global_batch=64, tp_comm_overlap=False, tp_dgrad_overlap=False)   # all exposed


def _reductions(model_name: str, **lay) -> float:
    """TP time of the whole model on one stage, in units of one h-wide all-reduce of the micro-batch."""
    m = load_model(model_name)
    est = Estimator(m, H100, TR, 8)
    L = est.resolve(Layout(tp=8, **lay))
    st = est.stages(L.stage_layers)[0]
    one = est.net.time("all_reduce", L.micro_batch * TR.seq_len * m.hidden_size * TR.activation_bytes, 8, 1)
    return tp_time_per_microbatch(est.profile, st, L, TR, H100, est.net) / one


def test_dense_layers_reduce_twice_per_pass_plus_the_head():
    m = load_model("llama3_8b")
    assert _reductions("llama3_8b") == pytest.approx(2 * 2 * m.num_layers + 1)
    assert _reductions("llama3_8b", recompute="full") == pytest.approx(3 * 2 * m.num_layers + 1)


def test_hybrid_layers_reduce_once_per_block_they_have():
    m = load_model("nemotron_h_8b")     # 52 layers, each one block: Mamba-2, attention or MLP
    blocks = sum((1 if m.mixers_of(i) else 0) + (1 if m.channel_of(i) == "dense" else 0) for i in range(m.num_layers))
    assert blocks == m.num_layers == 52
    assert _reductions("nemotron_h_8b") == pytest.approx(2 * blocks + 1)


def test_moe_layers_leave_their_channel_to_the_all_to_all():
    m = load_model("qwen3_30b_a3b")     # every layer MoE: only the attention block reduces
    assert _reductions("qwen3_30b_a3b", ep=8) == pytest.approx(2 * m.num_layers + 1)


def test_shared_experts_reduce_like_a_dense_mlp():
    m = load_model("deepseek_v3")       # 3 dense layers, 58 MoE layers with one shared expert each
    assert m.moe.num_shared_experts == 1
    assert _reductions("deepseek_v3", ep=8, pp=1) == pytest.approx(2 * 2 * m.num_layers + 1)


def test_transformer_engine_fp8_gathers_fp8_under_sequence_parallel():
    # TE (fp8_recipe te) all-gathers the FP8 norm output and FP8 output gradient; the reduce-scatters stay BF16:
    # 3/4 of the BF16 bytes with SP (each collective's latency unchanged), and BF16 all-reduces without it
    m = load_model("llama3_8b")
    n_ar = 2 * 2 * m.num_layers + 1
    def tp_seconds(precision: str, sp: bool) -> tuple[float, float]:
        tr = TR.model_copy(update={"precision": precision})
        est = Estimator(m, H100, tr, 8)
        L = est.resolve(Layout(tp=8, sequence_parallel=sp))
        t = tp_time_per_microbatch(est.profile, est.stages(L.stage_layers)[0], L, tr, H100, est.net)
        return t, est.net.time("all_reduce", L.micro_batch * tr.seq_len * m.hidden_size * 2, 8, 1)
    t8, one = tp_seconds("fp8", True)
    t16, _ = tp_seconds("bf16", True)
    assert t16 == pytest.approx(n_ar * one)
    latency = Network(H100).coefficients("all_reduce", 8, 1)[1]         # per collective, not scaled by the bytes
    assert t8 == pytest.approx(n_ar * (0.75 * (one - latency) + latency))
    assert tp_seconds("fp8", False)[0] == pytest.approx(tp_seconds("bf16", False)[0])

