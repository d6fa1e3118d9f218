"""Every rule of ``check_layout``: one valid and one invalid case each, with the numbers shown in the message;
``resolve_layout`` filling dp, grad_accum and edp; the "Minimum GPU Count" table of
parallelism-strategy-rules.md; and a property test over random valid degrees."""

from __future__ import annotations

from math import lcm

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autopar.errors import AutoparInputError, LayoutError
from autopar.specs.layout import Layout, check_layout, resolve_layout
from autopar.specs.loaders import load_hardware, load_model
from autopar.specs.model import MLASpec, ModelSpec, MoESpec
from autopar.specs.training import TrainingSpec

# A dense GQA model: 48 layers (divisible by 1, 2, 3, 4, 6, 8, 12, 16, 24), 32 query heads, 8 KV heads.
DENSE = ModelSpec(name="dense48", num_layers=48, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                  num_kv_heads=8, vocab_size=128256)
# An MoE model: 24 layers, 16 heads / 4 KV heads, 64 experts (top-8) of width 1024.
MOE = ModelSpec(name="moe24", num_layers=24, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=16,
                num_kv_heads=4, vocab_size=32000,
                moe=MoESpec(num_experts=64, top_k=8, expert_ffn_hidden_size=1024))
TRAIN = TrainingSpec(seq_len=4096, global_batch=512)


def problems(layout: Layout, gpus: int, model: ModelSpec = DENSE, training: TrainingSpec = TRAIN, **kw) -> list[str]:
    return check_layout(layout, model, training, gpus, **kw)


def assert_flags(found: list[str], expected: str) -> None:
    assert any(expected in p for p in found), f"expected a problem containing {expected!r}; got {found}"


def assert_clean(found: list[str]) -> None:
    assert found == [], found


# ---- world size ------------------------------------------------------------------------------------------------
def test_gpus_must_be_positive():
    assert problems(Layout(), 0) == ["gpus must be positive (got 0)"]
    assert problems(Layout(), -8) == ["gpus must be positive (got -8)"]


def test_world_factorises_over_tp_cp_pp():
    assert_clean(problems(Layout(tp=4, pp=2), 64))
    assert_flags(problems(Layout(tp=4, pp=3), 64), "gpus (64) not divisible by tp·cp·pp = 4·1·3 = 12")
    assert_flags(problems(Layout(tp=2, cp=2, pp=2), 36), "gpus (36) not divisible by tp·cp·pp = 2·2·2 = 8")


def test_explicit_dp_must_match_the_world():
    assert_clean(problems(Layout(tp=2, dp=16), 32))
    assert_flags(problems(Layout(tp=2, dp=8), 32), "dp·tp·cp·pp = 8·2·1·1 = 16 != gpus (32)")


def test_expert_mesh_must_factorise_the_world():
    assert_clean(problems(Layout(ep=8), 16, MOE))
    assert_flags(problems(Layout(ep=8), 12, MOE),
                 "gpus (12) not divisible by pp·ep·etp = 1·8·1 = 8 (edp must be whole)")
    assert_flags(problems(Layout(pp=2, ep=4, etp=2), 24, MOE),
                 "gpus (24) not divisible by pp·ep·etp = 2·4·2 = 16")


# ---- minimum GPU count (parallelism-strategy-rules.md, "Minimum GPU Count") -------------------------------------
# (PP, TP, CP, EP, ETP, wrong = PP·TP·CP·EP·ETP, correct = PP·max(TP·CP, EP·ETP))
MIN_GPU_TABLE = [
    (1, 2, 1, 8, 1, 16, 8),
    (1, 4, 1, 8, 1, 32, 8),
    (1, 2, 2, 8, 1, 32, 8),
    (1, 2, 4, 8, 1, 64, 8),
    (2, 2, 1, 8, 1, 32, 16),
    (1, 2, 1, 4, 2, 16, 8),
]


@pytest.mark.parametrize("pp,tp,cp,ep,etp,wrong,correct", MIN_GPU_TABLE)
def test_min_gpus_worked_table(pp, tp, cp, ep, etp, wrong, correct):
    layout = Layout(pp=pp, tp=tp, cp=cp, ep=ep, etp=etp)
    assert pp * tp * cp * ep * etp == wrong
    assert layout.min_gpus() == correct
    # The layout runs on exactly min_gpus GPUs (fewer than the wrong product) ...
    assert_clean(problems(layout, correct, MOE))
    r = resolve_layout(layout, MOE, TRAIN, correct)
    assert r.world == correct
    # ... where the larger mesh has DP (or EDP) = 1 and the smaller side absorbs the slack.
    if ep * etp >= tp * cp:
        assert r.edp == 1
    if tp * cp >= ep * etp:
        assert r.dp == 1
    # Fewer GPUs than the minimum is reported with the arithmetic.
    below = correct // 2
    assert_flags(problems(layout, below, MOE),
                 f"min_gpus = pp·max(tp·cp, ep·etp) = {pp}·max({tp * cp}, {ep * etp}) = {correct} > gpus ({below})")


@pytest.mark.parametrize("gpus,dp,edp", [(8, 4, 1), (16, 8, 2), (32, 16, 4)])
def test_scaling_above_the_minimum(gpus, dp, edp):
    # The document's example: TP=2, CP=1, EP=8, ETP=1, PP=1.
    r = resolve_layout(Layout(tp=2, ep=8), MOE, TRAIN, gpus)
    assert (r.dp, r.edp) == (dp, edp)


# ---- tensor parallel and sequence parallel ------------------------------------------------------------------------
def test_attention_heads_divisible_by_tp():
    model = ModelSpec(name="h12", num_layers=4, hidden_size=1536, ffn_hidden_size=6144, num_attention_heads=12,
                      num_kv_heads=4, vocab_size=1000)
    assert_clean(problems(Layout(tp=4), 8, model))
    assert_flags(problems(Layout(tp=8), 8, model), "num_attention_heads (12) not divisible by tp (8)")


def test_kv_heads_and_tp_divide_one_another():
    # g = 8 < tp = 16: each KV head is replicated twice, which is allowed.
    assert_clean(problems(Layout(tp=16), 16))
    model = ModelSpec(name="kv6", num_layers=4, hidden_size=3072, ffn_hidden_size=8192, num_attention_heads=24,
                      num_kv_heads=6, vocab_size=1000)
    assert_clean(problems(Layout(tp=2), 8, model))
    assert_flags(problems(Layout(tp=4), 8, model), "num_kv_heads (6) and tp (4) must divide one another")


def test_mla_models_skip_the_kv_head_rule():
    mla = ModelSpec(name="mla", num_layers=4, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=16,
                    num_kv_heads=16, vocab_size=1000,
                    mla=MLASpec(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128))
    assert not [p for p in problems(Layout(tp=8), 8, mla) if "num_kv_heads" in p]


def test_ffn_hidden_divisible_by_tp():
    model = ModelSpec(name="ffn1000", num_layers=4, hidden_size=2048, ffn_hidden_size=1000, num_attention_heads=16,
                      vocab_size=1000)
    assert_clean(problems(Layout(tp=8), 8, model))
    assert_flags(problems(Layout(tp=16), 16, model), "ffn_hidden_size (1000) not divisible by tp (16)")


def test_sequence_parallel_needs_tp():
    assert_clean(problems(Layout(tp=2, sequence_parallel=True), 8))
    assert_clean(problems(Layout(tp=1, sequence_parallel=False), 8))
    assert_flags(problems(Layout(tp=1, sequence_parallel=True), 8), "sequence_parallel needs tp > 1")
    assert Layout(tp=2).sp and not Layout(tp=1).sp  # default: on exactly when tp > 1


def test_sequence_parallel_splits_the_sequence_over_tp():
    odd = TrainingSpec(seq_len=4100, global_batch=512)
    assert_clean(problems(Layout(tp=4), 8, training=odd))  # 4100 % 4 == 0
    assert_flags(problems(Layout(tp=8), 8, training=odd),
                 "sequence parallel: seq_len/cp = 4100 not divisible by tp (8)")
    assert_clean(problems(Layout(tp=8, sequence_parallel=False), 8, training=odd))


# ---- context parallel -----------------------------------------------------------------------------------------------
def test_seq_len_divisible_by_two_cp():
    assert_clean(problems(Layout(cp=4), 8))
    odd = TrainingSpec(seq_len=4100, global_batch=512)
    assert_clean(problems(Layout(cp=2), 8, training=odd))  # 4100 % 4 == 0
    assert_flags(problems(Layout(cp=4), 8, training=odd), "seq_len (4100) % (2·cp) = 4100 % 8 != 0")


# ---- experts ---------------------------------------------------------------------------------------------------------
def test_ep_and_etp_only_on_moe():
    assert_clean(problems(Layout(ep=8, etp=2), 16, MOE))
    assert_flags(problems(Layout(ep=2), 8), "ep = 2 but dense48 is dense: expert parallel needs an MoE model")
    assert_flags(problems(Layout(etp=2), 8), "etp = 2 but dense48 is dense: expert tensor parallel needs an MoE model")


def test_experts_divisible_by_ep():
    assert_clean(problems(Layout(ep=16), 16, MOE))
    assert_flags(problems(Layout(ep=3), 24, MOE), "num_experts (64) not divisible by ep (3)")


def test_expert_ffn_divisible_by_etp():
    assert_clean(problems(Layout(ep=4, etp=4), 16, MOE))
    assert_flags(problems(Layout(etp=3), 24, MOE), "expert_ffn_hidden_size (1024) not divisible by etp (3)")


# ---- pipeline --------------------------------------------------------------------------------------------------------
def test_layers_divisible_by_pp_times_vpp_or_a_balanced_split_exists():
    assert_clean(problems(Layout(pp=4, vpp=3), 32))
    # 48 layers do not divide by pp·vpp = 10, but 24 per rank in 5 chunks (5,5,5,5,4) do: the split solve uses.
    assert_clean(problems(Layout(pp=2, vpp=5), 16))
    # 48 layers over 40 stages: 2 per middle stage leave nothing for the ends; no balanced split exists.
    assert_flags(problems(Layout(pp=40), 40), "num_layers (48) not divisible by pp·vpp = 40·1 = 40, and no balanced")


def test_uneven_pipeline_split_by_itself_as_solve_does():
    """issue 12 item 5: a layout without stage_layers whose layers do not divide gets the split solve searches."""
    from autopar.search.space import SearchOptions, build_space
    model, h100 = load_model("deepseek_v3"), load_hardware("h100_sxm")
    r = resolve_layout(Layout(pp=8, ep=32), model, TRAIN, 256)
    assert r.stage_layers == (6,) + (8,) * 6 + (7,)
    space = build_space(model, h100, TRAIN, 256, SearchOptions(pp=[8], ep=[32], tp=[1], cp=[1], etp=[1]))
    assert space.layout(0, 1, "none", 1, 1).stage_layers == r.stage_layers
    assert resolve_layout(Layout(pp=2, vpp=5), DENSE, TRAIN, 16).stage_layers == (24, 24)
    assert Layout(pp=8).layers_per_stage(61) == r.stage_layers


def test_vpp_needs_pp():
    assert_flags(problems(Layout(vpp=2), 8), "vpp = 2 needs pp > 1")


def test_uneven_stage_layers():
    # 48 layers over 5 stages cannot split evenly, but an explicit split is fine.
    uneven = Layout(pp=5, stage_layers=(9, 10, 10, 10, 9))
    assert_clean(problems(uneven, 40))
    assert resolve_layout(uneven, DENSE, TRAIN, 40).stage_layers == (9, 10, 10, 10, 9)
    assert_clean(problems(Layout(pp=4, vpp=2, stage_layers=(10, 14, 12, 12)), 32))


def test_stage_layers_count_must_be_pp():
    assert_flags(problems(Layout(pp=4, stage_layers=(12, 12, 24)), 32), "stage_layers has 3 entries, pp is 4")


def test_stage_layers_must_sum_to_num_layers():
    assert_flags(problems(Layout(pp=4, stage_layers=(12, 12, 12, 11)), 32), "stage_layers sum to 47, num_layers is 48")


def test_every_stage_needs_layers():
    assert_clean(problems(Layout(pp=4, vpp=2, stage_layers=(10, 14, 12, 12)), 32))
    assert_flags(problems(Layout(pp=4, stage_layers=(0, 16, 16, 16)), 32), "got [0, 16, 16, 16]")


# ---- batch -----------------------------------------------------------------------------------------------------------
def test_global_batch_divisible_by_dp_times_micro_batch():
    assert_clean(problems(Layout(tp=2, micro_batch=4), 64))  # dp = 32, 512 % 128 == 0
    assert_flags(problems(Layout(tp=2, micro_batch=3), 64),
                 "global_batch (512) not divisible by dp·micro_batch = 32·3 = 96")


def test_global_batch_is_dp_times_micro_batch_times_grad_accum():
    assert_clean(problems(Layout(tp=2, micro_batch=2, grad_accum=8), 64))
    assert_flags(problems(Layout(tp=2, micro_batch=2, grad_accum=4), 64),
                 "dp·micro_batch·grad_accum = 32·2·4 = 256 != global_batch (512)")


def test_interleaved_schedule_needs_micro_batches_multiple_of_pp():
    small = TrainingSpec(seq_len=4096, global_batch=96)  # dp = 8, mbs = 2 -> 6 micro-batches
    assert_flags(problems(Layout(pp=4, vpp=2, micro_batch=2), 32, training=small),
                 "interleaved schedule: micro-batches per step (6) must be a multiple of pp (4)")
    assert_clean(problems(Layout(pp=4, vpp=1, micro_batch=2), 32, training=small))  # plain 1F1B: no such rule
    ok = TrainingSpec(seq_len=4096, global_batch=128)  # 8 micro-batches
    assert_clean(problems(Layout(pp=4, vpp=2, micro_batch=2), 32, training=ok))


# ---- sharding and recompute ------------------------------------------------------------------------------------------
def test_hsdp_shard_divides_dp():
    layout = Layout(tp=2, hsdp_shard=4)
    assert layout.zero_stage == 3
    assert_clean(problems(layout, 16))
    assert_flags(problems(Layout(tp=2, hsdp_shard=3), 16), "dp (8) not divisible by hsdp_shard (3)")


def test_recompute_modules_match_the_architecture():
    assert_clean(problems(Layout(recompute="moe_act,layernorm"), 8, MOE))
    assert_flags(problems(Layout(recompute="mla_up_proj"), 8), "recompute module 'mla_up_proj' needs an MLA model")
    assert_flags(problems(Layout(recompute="moe_act"), 8), "recompute modules ['moe_act'] need an MoE model")


# ---- topology --------------------------------------------------------------------------------------------------------
def test_tp_inside_the_nvlink_domain():
    h100, nvl72 = load_hardware("h100_sxm"), load_hardware("gb200_nvl72")
    wide = Layout(tp=16)
    assert_flags(problems(wide, 16, hardware=h100, allow_cross_domain_tp=False),
                 "tp (16) exceeds the NVLink domain (8 GPUs on h100_sxm)")
    assert_clean(problems(wide, 16, hardware=h100, allow_cross_domain_tp=True))  # estimate: slow, not wrong
    assert_clean(problems(wide, 16, hardware=nvl72, allow_cross_domain_tp=False))


def test_expert_parallel_may_span_domains_but_etp_may_not():
    h100, nvl72 = load_hardware("h100_sxm"), load_hardware("gb200_nvl72")
    assert_clean(problems(Layout(ep=16), 16, MOE, hardware=h100, allow_cross_domain_tp=False))
    assert_flags(problems(Layout(ep=1, etp=16), 16, MOE, hardware=h100, allow_cross_domain_tp=False),
                 "etp (16) exceeds the NVLink domain (8 GPUs on h100_sxm)")
    assert_clean(problems(Layout(ep=8), 16, MOE, hardware=h100, allow_cross_domain_tp=False))
    assert_clean(problems(Layout(ep=16, etp=2), 32, MOE, hardware=nvl72, allow_cross_domain_tp=False))


# ---- several rules at once and resolve_layout ------------------------------------------------------------------------
def test_every_broken_rule_is_listed():
    found = problems(Layout(tp=3, pp=40, ep=2), 240)
    assert len(found) >= 4
    assert_flags(found, "num_attention_heads (32) not divisible by tp (3)")
    assert_flags(found, "num_layers (48) not divisible by pp·vpp = 40·1 = 40")
    assert_flags(found, "ep = 2 but dense48 is dense")


def test_resolve_layout_fills_dp_grad_accum_and_edp():
    r = resolve_layout(Layout(tp=2, pp=2, ep=8), MOE, TRAIN, 64)
    assert (r.dp, r.grad_accum, r.edp, r.world) == (16, 32, 4, 64)
    assert r.sequence_parallel is True
    assert r.stage_layers == (12, 12)
    assert r.edp * r.ep * r.etp * r.pp == 64


def test_resolve_layout_keeps_consistent_explicit_values():
    r = resolve_layout(Layout(tp=4, dp=2, micro_batch=2, grad_accum=128, sequence_parallel=False), DENSE, TRAIN, 8)
    assert (r.dp, r.micro_batch, r.grad_accum, r.sequence_parallel) == (2, 2, 128, False)


def test_resolve_layout_on_llama3_70b():
    model = load_model("llama3_70b")
    r = resolve_layout(Layout(tp=8, pp=4, vpp=5, micro_batch=1), model, TrainingSpec(seq_len=8192, global_batch=512),
                       1024, hardware=load_hardware("h100_sxm"), allow_cross_domain_tp=False)
    assert (r.dp, r.grad_accum, r.edp) == (32, 16, 256)
    assert r.stage_layers == (20, 20, 20, 20)


def test_resolve_layout_raises_layout_error_with_every_problem():
    with pytest.raises(LayoutError) as err:
        resolve_layout(Layout(tp=3, ep=2), DENSE, TRAIN, 9)
    assert isinstance(err.value, AutoparInputError)
    assert str(err.value).startswith("invalid layout: ")
    assert len(err.value.problems) >= 2
    assert all(p in str(err.value) for p in err.value.problems)


# ---- properties ------------------------------------------------------------------------------------------------------
PROP_MODEL = ModelSpec(name="prop_moe", num_layers=24, hidden_size=4096, ffn_hidden_size=8192, num_attention_heads=32,
                       num_kv_heads=8, vocab_size=32000,
                       moe=MoESpec(num_experts=64, top_k=4, expert_ffn_hidden_size=1024))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tp=st.sampled_from([1, 2, 4, 8]), cp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 3, 4, 6]),
       ep=st.sampled_from([1, 2, 4, 8, 16, 32, 64]), etp=st.sampled_from([1, 2, 4]),
       scale=st.integers(1, 6), micro_batch=st.integers(1, 4), grad_accum=st.integers(1, 8))
def test_resolve_valid_degrees(tp, cp, pp, ep, etp, scale, micro_batch, grad_accum):
    gpus = pp * lcm(tp * cp, ep * etp) * scale
    dp = gpus // (tp * cp * pp)
    training = TrainingSpec(seq_len=8192, global_batch=dp * micro_batch * grad_accum)
    layout = Layout(tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, micro_batch=micro_batch)
    assert check_layout(layout, PROP_MODEL, training, gpus) == []
    r = resolve_layout(layout, PROP_MODEL, training, gpus)
    assert r.world == gpus
    assert r.edp * r.ep * r.etp * r.pp == gpus
    assert r.dp * r.micro_batch * r.grad_accum == training.global_batch
    assert r.grad_accum == grad_accum
    assert r.min_gpus() <= gpus
    assert sum(r.stage_layers) == PROP_MODEL.num_layers


@settings(max_examples=300, deadline=None)
@given(tp=st.integers(1, 16), cp=st.integers(1, 8), pp=st.integers(1, 8), ep=st.integers(1, 32),
       etp=st.integers(1, 4), vpp=st.integers(1, 4), gpus=st.integers(-4, 512), micro_batch=st.integers(1, 8),
       moe=st.booleans())
def test_check_layout_never_raises_and_min_gpus_rule_matches(tp, cp, pp, ep, etp, vpp, gpus, micro_batch, moe):
    layout = Layout(tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, vpp=vpp, micro_batch=micro_batch)
    found = check_layout(layout, PROP_MODEL if moe else DENSE, TRAIN, gpus)
    assert isinstance(found, list) and all(isinstance(p, str) for p in found)
    if gpus > 0:
        assert any(p.startswith("min_gpus") for p in found) == (layout.min_gpus() > gpus)
    if not found:
        r = resolve_layout(layout, PROP_MODEL if moe else DENSE, TRAIN, gpus)
        assert r.world == gpus and r.edp * ep * etp * pp == gpus


def test_virtual_stages_need_layers_on_every_pipeline_stage():
    from autopar.specs.layout import max_vpp
    m = ModelSpec(name="four", num_layers=4, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
                  vocab_size=256)
    tr = TrainingSpec(seq_len=128, global_batch=8)
    assert max_vpp((2, 2)) == 3 and max_vpp((3, 4, 4, 3)) == 4 and max_vpp((8,)) == 9
    bad = check_layout(Layout(pp=2, vpp=8, micro_batch=4, stage_layers=(2, 2)), m, tr, 2)
    assert any("vpp = 8" in msg and "[2, 2]" in msg for msg in bad), bad
    assert not check_layout(Layout(pp=2, vpp=2, micro_batch=4, stage_layers=(2, 2)), m, tr, 2)
