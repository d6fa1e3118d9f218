"""Per-layer token mixers in a model: layers as sums of their blocks (each kind's hand counts are in tests/blocks),
the layer pattern's validation, TP rules, the cost-balanced pipeline split and CP's state pass for linear layers."""

from __future__ import annotations

from itertools import combinations

import pytest

from autopar.cost import Estimator
from autopar.errors import AutoparInputError
from autopar.specs.layout import Layout, check_layout, cost_balanced_stage_layers, resolve_layout
from autopar.specs.loaders import build_spec, load_hardware, load_model
from autopar.specs.mixers import MixerSpec
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

H100 = load_hardware("h100_sxm")


def hybrid(mixers: dict, pattern: list[str], **kw) -> ModelSpec:
    base = dict(name="hyb", num_layers=len(pattern), hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=16,
                num_kv_heads=4, vocab_size=32000, mixers=mixers, layer_pattern=pattern)
    base.update(kw)
    return ModelSpec(**base)


# ---- layers made of blocks ----------------------------------------------------------------------------------
def test_attention_variants_window_chunk_sinks_and_gate():
    m = hybrid({"local": {"kind": "attention", "chunk": 8192}, "swa": {"kind": "attention", "window": 128,
                                                                        "sinks": True, "output_gate": True}},
               ["local", "swa", "attention", "attention"])
    s, a, d = 16384, 16, 128
    assert m.attention_core_flops_per_token(0, s) == 2 * 4096 * a * 2 * d      # a chunk of 8192: 4096 keys on average
    assert m.attention_core_flops_per_token(1, s) == 2 * 128 * a * 2 * d       # window 128
    assert m.attention_core_flops_per_token(2, s) == 2 * (s / 2) * a * 2 * d   # causal
    assert m.mixer_params(1) == m.attention_params + a + 2048 * a * d           # + sinks + output gate
    assert m.attention_layers == (0, 1, 2, 3) and not m.is_hybrid


def test_layer_flops_are_the_sum_of_their_parts_and_totals_add_up():
    m = load_model("report_hybrid_17b")
    s = 4096
    for i in (0, 1, 3):
        expect = (2 * m.mixer_gemm_params(i) + m.attention_core_flops_per_token(i, s)
                  + m.mixer_core_flops_per_token(i) + m.channel_forward_flops_per_token(i))
        assert m.layer_forward_flops_per_token(i, s) == expect
    assert m.mixer_core_flops_per_token(3) == 0 and m.attention_core_flops_per_token(0, s) == 0
    assert m.total_params == (m.embedding_params + m.lm_head_params
                              + sum(m.layer_nonexpert_params(i) + m.layer_expert_params(i) for i in range(21)))


# ---- the reference report's model ------------------------------------------------------------------------------
def test_reference_report_model_matches_the_report():
    """17.43B (16.11B expert, 1.33B non-expert) within 2 %; forward 13.33 TFLOPs per 4096-token sample within 5 %."""
    m = load_model("report_hybrid_17b")
    assert m.mixer_counts() == {"gla": 16, "attention": 5}
    assert (m.num_moe_layers, m.num_dense_layers) == (20, 1)
    assert m.total_params == pytest.approx(17.43e9, rel=0.02)
    assert m.expert_params_total == pytest.approx(16.11e9, rel=0.02)
    assert m.total_params - m.expert_params_total == pytest.approx(1.33e9, rel=0.02)
    assert m.forward_flops_per_token(4096) * 4096 == pytest.approx(13.33e12, rel=0.05)


# ---- validation ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fields, needle", [
    (dict(layer_pattern=["gla", "nope"]), "unknown mixer(s) ['nope']"),
    (dict(layer_pattern=["gla", "gla", "attention"]), "does not tile num_layers (4)"),
    (dict(mixers={"gla": {"kind": "gla", "num_heads": 4, "head_dim": 64, "window": 8}}), "window, chunk and sinks"),
    (dict(mixers={"m": {"kind": "mamba2", "num_heads": 4, "head_dim": 64}}, layer_pattern=["m", "attention"]),
     "needs state_size"),
    (dict(mixers={"gla": {"kind": "gla", "num_heads": 4, "head_dim": 64}, "x": {"kind": "lightning", "num_heads": 4,
                                                                                "head_dim": 64}}),
     "no layer_pattern entry uses them"),
    (dict(layer_pattern=["none", "gla"], mlp_pattern=["none", "dense"]), "neither a token mixer nor a channel mixer"),
    (dict(mixers={"attention": {"kind": "gla", "num_heads": 4, "head_dim": 64}}, layer_pattern=["attention"]),
     "may not be named"),
])
def test_bad_patterns_are_one_clear_error(fields, needle):
    data = dict(name="bad", num_layers=4, hidden_size=256, ffn_hidden_size=512, num_attention_heads=4, vocab_size=100,
                mixers={"gla": {"kind": "gla", "num_heads": 4, "head_dim": 64}}, layer_pattern=["gla", "attention"])
    data.update(fields)
    with pytest.raises(AutoparInputError) as err:
        build_spec(ModelSpec, data, "model.yaml")
    assert needle in str(err.value)


def test_nemotron_h_style_layers_without_mlp_or_mixer():
    m = hybrid({"m": {"kind": "mamba2", "num_heads": 32, "head_dim": 64, "state_size": 128, "n_groups": 8,
                      "conv_kernel": 4}},
               ["m", "none", "m", "attention"], mlp_pattern=["none", "dense", "none", "none"])
    assert m.layer_norms(0) == m.norm_params and m.layer_norms(1) == m.norm_params
    assert m.layer_nonexpert_params(1) == m.mlp_params(8192) + m.norm_params
    assert m.channel_forward_flops_per_token(0) == 0 and m.num_dense_layers == 1


def test_tp_splits_linear_mixers_by_heads():
    m = hybrid({"m": {"kind": "mamba2", "num_heads": 20, "head_dim": 64, "state_size": 128, "n_groups": 2}},
               ["m", "attention"] * 2)
    tr = TrainingSpec(seq_len=4096, global_batch=64)
    assert check_layout(Layout(tp=2), m, tr, 8) == []
    found = check_layout(Layout(tp=4), m, tr, 8)
    assert any("mixer 'm' (mamba2): n_groups (2) not divisible by tp (4)" in p for p in found), found
    found = check_layout(Layout(tp=8), m, tr, 8)
    assert any("num_heads (20) not divisible by tp (8)" in p for p in found), found


# ---- pipeline split by cost ---------------------------------------------------------------------------------------
def _max_stage(costs, sizes, tail):
    out, i = [], 0
    for n in sizes:
        out.append(sum(costs[i:i + n]))
        i += n
    out[-1] += tail
    return max(out)


@pytest.mark.parametrize("pp", [2, 3, 4, 5])
def test_cost_balanced_split_is_optimal(pp):
    costs = [3.0, 1.0, 1.0, 1.0, 5.0, 1.0, 1.0, 2.0, 4.0, 1.0, 1.0]
    tail = 2.5
    got = cost_balanced_stage_layers(costs, pp, tail)
    assert len(got) == pp and sum(got) == len(costs) and min(got) >= 1
    best = min(_max_stage(costs, [b - a for a, b in zip((0, *cuts), (*cuts, len(costs)))], tail)
               for cuts in combinations(range(1, len(costs)), pp - 1))
    assert _max_stage(costs, got, tail) == pytest.approx(best)


def test_hybrid_model_pipeline_is_balanced_by_cost_not_count():
    m = load_model("report_hybrid_17b")
    tr = TrainingSpec(seq_len=4096, global_batch=512)
    r = resolve_layout(Layout(pp=3), m, tr, 3)
    costs = [m.layer_forward_flops_per_token(i, 4096) for i in range(21)]
    tail = m.head_forward_flops_per_token()
    assert r.stage_layers != (7, 7, 7)           # the LM head (2·h·V) weighs on the last stage
    assert _max_stage(costs, r.stage_layers, tail) < _max_stage(costs, (7, 7, 7), tail)


# ---- context parallel: linear layers pass a state (or swap sequence for heads), attention layers a KV ring ----------
def test_cp_passes_the_state_for_linear_layers():
    gla = {"gla": {"kind": "gla", "num_heads": 16, "head_dim": 128}}
    tr = TrainingSpec(seq_len=8192, global_batch=64, linear_cp="state_pass")
    lin = hybrid(gla, ["gla"] * 4)
    att = hybrid(gla, ["gla", "gla", "gla", "attention"])
    L = Layout(cp=4)
    t_lin = Estimator(lin, H100, tr, 4).estimate(L).time_s.cp
    est = Estimator(lin, H100, tr, 4)
    net = est.net
    state_bytes = 4 * 16 * 128 * 128 * tr.activation_bytes          # 4 layers, one sequence (micro-batch 1)
    c, t0 = net.coefficients("send_recv", 2, 1)
    M = 64                                                            # micro-batches per step (64 sequences, dp 1)
    assert t_lin == pytest.approx(M * 2 * 3 * (state_bytes * c + 4 * t0))   # forward + backward, cp - 1 = 3 hops
    t_att = Estimator(att, H100, tr, 4).estimate(L).time_s.cp
    assert t_att > 0 and t_att != t_lin


def test_all_to_all_cp_swaps_the_mixer_activations_twice_per_pass():
    """Megatron-Core's linear-layer CP (the default): 2 all-to-alls of the scan's input and output widths per pass,
    over cp ranks; more traffic than passing the state, and heads must divide by tp·cp."""
    gla = {"gla": {"kind": "gla", "num_heads": 16, "head_dim": 128}}
    lin = hybrid(gla, ["gla"] * 4)
    mx = lin.linear_mixers["gla"]
    tr = TrainingSpec(seq_len=8192, global_batch=64)
    assert tr.linear_cp == "all_to_all"
    est = Estimator(lin, H100, tr, 4)
    t = est.estimate(Layout(cp=4)).time_s.cp
    c, t0 = est.net.coefficients("all_to_all", 4, 1)
    a2a = 4 * (8192 / 4) * (mx.in_width() + mx.out_width()) * tr.activation_bytes   # 4 layers
    assert t == pytest.approx(64 * 2 * 2 * (a2a * c + 4 * t0))         # 64 micro-batches, fwd + bwd, 2 each
    passing = Estimator(lin, H100, tr.model_copy(update={"linear_cp": "state_pass"}), 4).estimate(Layout(cp=4))
    assert t > passing.time_s.cp
    # the head split: 16 heads over tp·cp
    assert check_layout(Layout(tp=4, cp=4), lin, tr, 16) == []
    found = check_layout(Layout(tp=4, cp=8), lin, tr, 32)
    assert any("num_heads (16) not divisible by tp·cp = 4·8" in p for p in found), found
    assert check_layout(Layout(tp=4, cp=8), lin, tr.model_copy(update={"linear_cp": "state_pass"}), 32) == []


# ---- Mamba-1 (Jamba) and parallel mixers (Falcon-H1) ----------------------------------------------------------------
@pytest.mark.parametrize("fields, needle", [
    (dict(kind="mamba1", state_size=16, dt_rank=8), r"needs inner_size \(d\), state_size \(N\) and dt_rank"),
    (dict(kind="mamba1", inner_size=64, state_size=16, dt_rank=8, num_heads=4), "have no heads"),
    (dict(kind="mamba2", num_heads=4, head_dim=16, state_size=16, dt_rank=8), "are mamba1 fields"),
])
def test_mamba1_fields_are_checked(fields, needle):
    with pytest.raises(ValueError, match=needle):
        MixerSpec(**fields)


def test_parallel_mixers_sum_their_parts_and_share_one_norm():
    mamba = {"kind": "mamba2", "num_heads": 16, "head_dim": 128, "state_size": 128, "n_groups": 1, "conv_kernel": 4}
    par = hybrid({"mamba": mamba}, ["attention+mamba"] * 2)
    att = hybrid({"mamba": mamba}, ["attention", "mamba"])
    s = 4096
    assert par.mixers_of(0)[0].kind == "attention" and par.mixers_of(0)[1].kind == "mamba2"
    assert par.mixer_params(0) == att.mixer_params(0) + att.mixer_params(1)
    assert par.layer_norms(0) == 2 * par.norm_params                       # one for both mixers, one for the MLP
    assert par.mixer_core_flops_per_token(0) == att.mixer_core_flops_per_token(1)
    assert par.attention_core_flops_per_token(0, s) == att.attention_core_flops_per_token(0, s)
    assert par.layer_forward_flops_per_token(0, s) == pytest.approx(
        att.layer_forward_flops_per_token(0, s) + att.layer_forward_flops_per_token(1, s)
        - att.channel_forward_flops_per_token(1))                          # one MLP, not two
    assert par.attention_layers == (0, 1) and par.is_hybrid
    with pytest.raises(ValueError, match="parallel mixers"):
        par.mixer_of(0)
    # TP must split every part: the attention heads (16) and the Mamba-2 groups (1)
    tr = TrainingSpec(seq_len=4096, global_batch=64)
    found = check_layout(Layout(tp=2), par, tr, 8)
    assert any("n_groups (1) not divisible by tp (2)" in p for p in found), found


def test_parallel_layers_add_both_cp_exchanges():
    mamba = {"kind": "mamba2", "num_heads": 16, "head_dim": 128, "state_size": 128, "n_groups": 2}
    # ring attention's KV exchange not overlapped, so that it is counted, not hidden behind the attention blocks
    tr = TrainingSpec(seq_len=8192, global_batch=64, linear_cp="state_pass", cp_comm_overlap=False)
    L = Layout(cp=4)
    t = {p: Estimator(hybrid({} if p == "attention" else {"mamba": mamba}, [p] * 4), H100, tr, 4).estimate(L).time_s.cp
         for p in ("attention", "mamba", "attention+mamba")}
    assert t["attention+mamba"] > max(t["attention"], t["mamba"])
    assert t["attention+mamba"] == pytest.approx(t["attention"] + t["mamba"], rel=1e-9)


@pytest.mark.parametrize("pattern, needle", [
    (["attention+attention"], "parallel mixers are distinct names"),
    (["attention+none"], "none of them 'none'"),
    (["attention+swa"], "at most one softmax attention per layer"),
])
def test_bad_parallel_entries_are_one_clear_error(pattern, needle):
    data = dict(name="bad", num_layers=2, hidden_size=256, ffn_hidden_size=512, num_attention_heads=4, vocab_size=100,
                mixers={"swa": {"kind": "attention", "window": 64}}, layer_pattern=pattern)
    if "swa" not in pattern[0]:
        data["mixers"] = {}
    with pytest.raises(AutoparInputError) as err:
        build_spec(ModelSpec, data, "model.yaml")
    assert needle in str(err.value)


@pytest.mark.parametrize("name", ["jamba_v0_1", "falcon_h1_7b", "nemotron_h_56b"])
def test_new_hybrids_estimate_end_to_end(name):
    m = load_model(name)
    tr = TrainingSpec(seq_len=4096, global_batch=256)
    r = Estimator(m, H100, tr, 64).estimate(Layout(tp=2, pp=2) if name != "falcon_h1_7b" else Layout(pp=2))
    assert r.time_s.total > 0 and r.memory_gib.total > 0
