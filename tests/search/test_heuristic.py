"""heuristic_layout: parallelism-strategy-rules.md applied literally, then repaired to validity.

Models are built inline with their published architecture numbers (so these tests do not depend on the zoo);
one test also runs every zoo model when the zoo is present. Every layout the heuristic returns is checked
against check_layout with the topology rules on (allow_cross_domain_tp=False)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autopar.errors import AutoparInputError
from autopar.search.heuristic import (
    MOE_TABLE,
    Degrees,
    _stage_split,
    heuristic_layout,
    heuristic_layout_with_reasons,
)
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import Layout, check_layout
from autopar.specs.model import MLASpec, ModelSpec, MoESpec
from autopar.specs.training import TrainingSpec

# HGX H100: 8 GPUs per NVLink domain. GB200 NVL72: 72 GPUs in one NVLink domain, 4 per compute tray.
H100 = HardwareSpec(name="h100_sxm", peak_tflops_bf16=989, peak_tflops_fp16=989, peak_tflops_fp8=1979, hbm_gib=74.5,
                    hbm_tbps=3.35, gpus_per_node=8, nvlink_domain_size=8, nvlink_gbps=450, scaleout_gbps=50)
NVL72 = HardwareSpec(**{**H100.model_dump(), "name": "gb200_nvl72", "gpus_per_node": 4, "nvlink_domain_size": 72})
TRAIN = TrainingSpec(seq_len=4096, global_batch=1024)

MLA_V3 = MLASpec(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)

# The nine named rows of the rules' MoE table, with their real architectures (Hugging Face config.json values).
MOE_MODELS = {
    "olmoe": ModelSpec(name="olmoe", num_layers=16, hidden_size=2048, ffn_hidden_size=1024, num_attention_heads=16,
                       vocab_size=50304, moe=MoESpec(num_experts=64, top_k=8, expert_ffn_hidden_size=1024)),
    "moonlight_16b_a3b": ModelSpec(
        name="moonlight_16b_a3b", num_layers=27, hidden_size=2048, ffn_hidden_size=11264, num_attention_heads=16,
        vocab_size=163840,
        mla=MLASpec(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
        moe=MoESpec(num_experts=64, top_k=6, expert_ffn_hidden_size=1408, num_shared_experts=2, first_dense_layers=1)),
    "deepseek_v2": ModelSpec(
        name="deepseek_v2", num_layers=60, hidden_size=5120, ffn_hidden_size=12288, num_attention_heads=128,
        vocab_size=102400, mla=MLA_V3,
        moe=MoESpec(num_experts=160, top_k=6, expert_ffn_hidden_size=1536, num_shared_experts=2,
                    first_dense_layers=1)),
    "glm45_air": ModelSpec(
        name="glm45_air", num_layers=46, hidden_size=4096, ffn_hidden_size=10944, num_attention_heads=96,
        num_kv_heads=8, head_dim=128, vocab_size=151552, qkv_bias=True, mtp_layers=1,
        moe=MoESpec(num_experts=128, top_k=8, expert_ffn_hidden_size=1408, num_shared_experts=1,
                    first_dense_layers=1)),
    "qwen3_30b_a3b": ModelSpec(
        name="qwen3_30b_a3b", num_layers=48, hidden_size=2048, ffn_hidden_size=6144, num_attention_heads=32,
        num_kv_heads=4, head_dim=128, vocab_size=151936,
        moe=MoESpec(num_experts=128, top_k=8, expert_ffn_hidden_size=768)),
    "glm45": ModelSpec(
        name="glm45", num_layers=92, hidden_size=5120, ffn_hidden_size=12288, num_attention_heads=96, num_kv_heads=8,
        head_dim=128, vocab_size=151552, qkv_bias=True, mtp_layers=1,
        moe=MoESpec(num_experts=160, top_k=8, expert_ffn_hidden_size=1536, num_shared_experts=1,
                    first_dense_layers=3)),
    "qwen3_235b_a22b": ModelSpec(
        name="qwen3_235b_a22b", num_layers=94, hidden_size=4096, ffn_hidden_size=12288, num_attention_heads=64,
        num_kv_heads=4, head_dim=128, vocab_size=151936,
        moe=MoESpec(num_experts=128, top_k=8, expert_ffn_hidden_size=1536)),
    # DeepSeek-V3: 61 layers, h 7168, 128 heads, MLA, vocab 129280, ffn 18432, 256 experts top-8 of 2048, 1 shared,
    # first 3 dense, 1 MTP module.
    "deepseek_v3": ModelSpec(
        name="deepseek_v3", num_layers=61, hidden_size=7168, ffn_hidden_size=18432, num_attention_heads=128,
        vocab_size=129280, mla=MLA_V3, mtp_layers=1,
        moe=MoESpec(num_experts=256, top_k=8, expert_ffn_hidden_size=2048, num_shared_experts=1,
                    first_dense_layers=3)),
    "kimi_k2": ModelSpec(
        name="kimi_k2", num_layers=61, hidden_size=7168, ffn_hidden_size=18432, num_attention_heads=64,
        vocab_size=163840, mla=MLA_V3,
        moe=MoESpec(num_experts=384, top_k=8, expert_ffn_hidden_size=2048, num_shared_experts=1,
                    first_dense_layers=1)),
}

# (model, row label, (TP, PP, EP, CP) of the row). The GPU count each row implies is its min_gpus.
ROWS = [
    ("olmoe", "OLMoE", (1, 1, 8, 1)),
    ("moonlight_16b_a3b", "Moonlight", (2, 1, 8, 1)),
    ("deepseek_v2", "DeepSeek-V2", (1, 4, 32, 1)),
    ("glm45_air", "GLM-4.5 Air", (1, 4, 8, 1)),
    ("qwen3_30b_a3b", "Qwen3 30B-A3B", (4, 2, 4, 1)),
    ("glm45", "GLM-4.5 355B", (2, 8, 16, 1)),
    ("qwen3_235b_a22b", "Qwen3 235B-A22B", (4, 16, 8, 2)),  # "CP=2 for pretrain"
    ("deepseek_v3", "DeepSeek-V3", (2, 16, 64, 1)),
    ("kimi_k2", "Kimi-K2", (2, 16, 32, 1)),
]


def _dense(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, **kw) -> ModelSpec:
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_kv_heads=kv,
                     ffn_hidden_size=ffn, vocab_size=vocab, **kw)


QWEN25_05B = _dense("qwen2.5_0.5b", 24, 896, 14, 2, 4864, 151936, tie_embeddings=True, qkv_bias=True)
LLAMA32_1B = _dense("llama3.2_1b", 16, 2048, 32, 8, 8192, 128256, tie_embeddings=True)
LLAMA3_8B = _dense("llama3_8b", 32, 4096, 32, 8, 14336, 128256)
LLAMA2_13B = _dense("llama2_13b", 40, 5120, 40, 40, 13824, 32000)
LLAMA3_70B = _dense("llama3_70b", 80, 8192, 64, 8, 28672, 128256)
LLAMA31_405B = _dense("llama3.1_405b", 126, 16384, 128, 8, 53248, 128256)
GPT_1T = _dense("megatron_gpt_1t", 128, 25600, 160, 160, 102400, 51200, gated_mlp=False)


def run(model: ModelSpec, gpus: int, hardware: HardwareSpec = H100,
        training: TrainingSpec = TRAIN) -> tuple[Layout, list[str]]:
    """The heuristic's layout, checked to be valid with the topology rules on."""
    layout, reasons = heuristic_layout_with_reasons(model, hardware, training, gpus)
    assert check_layout(layout, model, training, gpus, hardware, allow_cross_domain_tp=False) == []
    assert layout.world == gpus and layout.dp is not None and layout.grad_accum is not None
    assert (layout.micro_batch, layout.zero_stage, layout.recompute) == (1, 1, "selective")
    assert reasons and all(isinstance(r, str) and r for r in reasons)
    return layout, reasons


def degrees(layout: Layout) -> tuple[int, int, int, int]:
    return layout.tp, layout.pp, layout.ep, layout.cp


# ---- MoE table ------------------------------------------------------------------------------------------
def test_the_moe_table_is_transcribed_row_for_row():
    assert len(MOE_TABLE) == len(ROWS)
    for (_, label, (tp, pp, ep, cp)), row in zip(ROWS, MOE_TABLE):
        assert row.label.startswith(label) and (row.tp, row.pp, row.ep, row.cp) == (tp, pp, ep, cp)


@pytest.mark.parametrize("name,label,row", ROWS, ids=[r[0] for r in ROWS])
def test_moe_row_reproduced_where_the_nvlink_domain_holds_its_ep(name, label, row):
    """On a GB200 NVL72 (72-GPU NVLink domain) every row's EP fits the domain: the row comes out exactly at the
    GPU count it implies (min_gpus = PP·max(TP·CP, EP·ETP))."""
    model = MOE_MODELS[name]
    tp, pp, ep, cp = row
    gpus = Degrees(tp=tp, pp=pp, cp=cp, ep=ep).min_gpus()
    layout, reasons = run(model, gpus, NVL72)
    assert degrees(layout) == row
    assert any(label in r and "MoE table" in r for r in reasons), reasons
    assert not any(r.startswith("repair") for r in reasons)


@pytest.mark.parametrize("name,label,row", ROWS, ids=[r[0] for r in ROWS])
def test_moe_row_on_hgx_h100_keeps_cross_node_ep_and_says_so(name, label, row):
    """On 8-GPU HGX nodes EP may span NVLink domains (issue 12 item 4): every row comes out exactly, and rows
    with EP > 8 carry a reason naming the domain they span."""
    model = MOE_MODELS[name]
    tp, pp, ep, cp = row
    gpus = Degrees(tp=tp, pp=pp, cp=cp, ep=ep).min_gpus()
    layout, reasons = run(model, gpus, H100)
    assert (layout.tp, layout.pp, layout.cp, layout.ep) == (tp, pp, cp, ep)
    if ep > 8:
        assert any("spans NVLink domains" in r and f"EP{ep}" in r for r in reasons), reasons


def test_deepseek_v3_at_256_gpus_is_repaired_with_the_reason():
    """The rules' example puts DeepSeek-V3 (TP2 PP16 EP64) on 256 GPUs, but its own min_gpus rule gives
    16·max(2, 64) = 1024: on 256 GPUs the nearest valid layout keeps TP2 PP16 and shrinks EP to 16."""
    layout, reasons = run(MOE_MODELS["deepseek_v3"], 256, NVL72)
    assert degrees(layout) == (2, 16, 16, 1)
    repair = [r for r in reasons if r.startswith("repair")]
    assert repair and "min_gpus" in repair[0] and "1024" in repair[0] and "EP 64 -> 16" in repair[0]


def test_deepseek_v3_pipeline_is_uneven_first_and_last_lighter():
    layout, reasons = run(MOE_MODELS["deepseek_v3"], 1024, NVL72)
    assert layout.stage_layers == (3,) + (4,) * 14 + (2,)
    assert layout.vpp == 1  # 3 and 2 are not multiples of 2
    assert layout.sp and layout.dp == 32 and layout.edp == 1
    assert any("uneven stages" in r for r in reasons)


def test_moe_not_in_the_table_follows_the_key_patterns():
    model = ModelSpec(name="my_moe", num_layers=24, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=16,
                      num_kv_heads=4, vocab_size=32000,
                      moe=MoESpec(num_experts=64, top_k=8, expert_ffn_hidden_size=1024))
    layout, reasons = run(model, 64)
    assert (layout.tp, layout.pp, layout.ep) == (1, 1, 8)  # ~7B total, ~1.5B active, 64 experts / 8 per GPU
    assert any("not a named row" in r and "TP by active params" in r and "EP by expert count" in r for r in reasons)


def test_name_of_a_row_with_the_wrong_size_is_not_that_row():
    tiny = ModelSpec(**{**MOE_MODELS["deepseek_v3"].model_dump(), "name": "deepseek_v3_tiny", "num_layers": 4})
    _, reasons = run(tiny, 64)
    assert any("not within 25%" in r for r in reasons)
    assert any("not a named row" in r for r in reasons)


# ---- dense table ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("model,gpus,tp,pp,cp,klass", [
    (QWEN25_05B, 8, 1, 1, 1, "< 1B"),
    (LLAMA32_1B, 16, 2, 1, 1, "1-10B"),
    (LLAMA3_8B, 16, 4, 1, 1, "1-10B"),
    (LLAMA2_13B, 64, 4, 2, 1, "10-70B"),
    (LLAMA3_70B, 64, 8, 4, 1, "70-175B"),
    (LLAMA31_405B, 256, 8, 16, 2, "175-500B"),
], ids=lambda v: getattr(v, "name", None))
def test_dense_size_classes(model, gpus, tp, pp, cp, klass):
    layout, reasons = run(model, gpus)
    assert (layout.tp, layout.pp, layout.cp, layout.ep) == (tp, pp, cp, 1)
    assert any(r.startswith("dense") and klass in r and "dense table" in r for r in reasons), reasons


def test_dense_70b_reason_reads_like_the_table():
    _, reasons = run(LLAMA3_70B, 64)
    assert reasons[0].startswith("dense 70.6B in 70-175B -> TP8 + PP4-8 + DP")


def test_dense_above_500b_is_extrapolated_and_says_so():
    layout, reasons = run(GPT_1T, 1024)
    assert layout.tp == 8 and layout.cp == 2 and layout.pp >= 16
    assert any("extrapolated" in r for r in reasons)


def test_interleaving_when_the_stages_allow_it():
    layout, reasons = run(LLAMA3_70B, 64)
    assert layout.vpp == 2 and layout.stage_layers == (20, 20, 20, 20)
    assert any("pitfall 2" in r and "VPP2" in r for r in reasons)


# ---- sequence length ------------------------------------------------------------------------------------
@pytest.mark.parametrize("seq,sp,cp", [
    (1024, False, 1),     # < 2K: standard TP, no SP
    (2048, True, 1),      # 2K-8K: SP
    (4096, True, 1),
    (8192, True, 1),
    (16384, True, 2),     # 8K-32K: CP2
    (32768, True, 2),     # CP appears by 32K
    (65536, True, 4),     # 32K+: CP4-8
    (131072, True, 8),
])
def test_sequence_length_table(seq, sp, cp):
    training = TrainingSpec(seq_len=seq, global_batch=1024)
    layout, reasons = run(LLAMA3_8B, 64, training=training)
    assert layout.tp == 4 and layout.sp is sp and layout.cp == cp
    assert any("Decision by Sequence Length" in r for r in reasons)


def test_sequence_table_cp_combines_with_size_table_cp():
    training = TrainingSpec(seq_len=65536, global_batch=1024)
    layout, _ = run(LLAMA31_405B, 512, training=training)
    assert layout.cp == 4  # the size table asks CP2, the sequence table CP4: the larger wins


def test_no_sequence_parallel_without_tp():
    layout, reasons = run(QWEN25_05B, 8)
    assert layout.tp == 1 and layout.sp is False
    assert any("pitfall 3" in r for r in reasons)


# ---- topology and repair --------------------------------------------------------------------------------
def test_tp_stays_inside_a_smaller_nvlink_domain():
    quad = HardwareSpec(**{**H100.model_dump(), "name": "quad", "gpus_per_node": 4, "nvlink_domain_size": 4})
    layout, reasons = run(LLAMA3_70B, 64, quad)
    assert layout.tp == 4
    assert any("NVLink domain" in r and "TP8" in r for r in reasons)


def test_fewer_gpus_than_the_row_shrinks_pp_with_the_reason():
    layout, reasons = run(LLAMA3_70B, 16)
    assert (layout.tp, layout.pp) == (8, 2)
    assert any(r.startswith("repair") and "PP 4 -> 2" in r for r in reasons)


def test_heads_not_divisible_repairs_tp():
    model = _dense("ten_heads", 32, 3200, 10, 10, 8640, 32000)  # ~4B: the table asks TP4, 10 heads allow 2 or 5
    layout, reasons = run(model, 64)
    assert layout.tp == 2
    assert any("10 heads not divisible by 4" in r for r in reasons)


def test_global_batch_smaller_than_dp_is_repaired():
    training = TrainingSpec(seq_len=4096, global_batch=64)
    layout, _ = run(QWEN25_05B, 256, training=training)
    assert layout.dp <= 64 and 64 % layout.dp == 0


def test_no_valid_layout_raises_a_clear_error():
    model = _dense("four_layers", 4, 512, 8, 8, 2048, 32000)
    with pytest.raises(AutoparInputError, match="no valid heuristic layout for four_layers on 7 GPUs"):
        heuristic_layout(model, H100, TRAIN, 7)
    with pytest.raises(AutoparInputError, match="gpus must be positive"):
        heuristic_layout(model, H100, TRAIN, 0)


# ---- uneven pipeline split ------------------------------------------------------------------------------
@pytest.mark.parametrize("layers,pp", [(61, 16), (46, 4), (94, 16), (126, 16), (17, 16), (7, 2), (5, 5), (80, 4)])
def test_stage_split(layers, pp):
    split = _stage_split(layers, pp)
    if layers % pp == 0:
        assert split is None
        return
    assert len(split) == pp and sum(split) == layers and min(split) >= 1
    assert split[0] <= max(split) and split[-1] <= max(split) and split[-1] <= split[0]


def test_stage_split_deepseek_v3():
    assert _stage_split(61, 16) == (3,) + (4,) * 14 + (2,)


# ---- property: valid or a clear error -------------------------------------------------------------------
@st.composite
def model_specs(draw) -> ModelSpec:
    heads = draw(st.sampled_from([4, 8, 12, 14, 16, 24, 32, 40, 64, 96, 128]))
    kv = draw(st.sampled_from([g for g in (1, 2, 4, 8, heads) if heads % g == 0]))
    head_dim = draw(st.sampled_from([64, 128]))
    layers = draw(st.integers(1, 96))
    moe = None
    if draw(st.booleans()):
        experts = draw(st.sampled_from([2, 4, 8, 16, 60, 64, 128, 160, 256, 384]))
        moe = MoESpec(num_experts=experts, top_k=draw(st.integers(1, min(8, experts))),
                      expert_ffn_hidden_size=64 * draw(st.integers(4, 40)),
                      num_shared_experts=draw(st.integers(0, 2)),
                      first_dense_layers=draw(st.integers(0, min(3, layers - 1))))
    mla = None
    if draw(st.integers(0, 4)) == 0:
        mla = MLASpec(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
    name = draw(st.sampled_from(["random", "deepseek_v3", "olmoe", "qwen3_235b_a22b", "glm45_air"]))
    return ModelSpec(name=name, num_layers=layers, hidden_size=heads * head_dim, num_attention_heads=heads,
                     num_kv_heads=None if mla else kv, head_dim=head_dim,
                     ffn_hidden_size=64 * draw(st.integers(4, 400)),
                     vocab_size=32000, moe=moe, mla=mla)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=model_specs(), gpus=st.sampled_from([2 ** k for k in range(3, 11)]),
       seq=st.sampled_from([512, 1000, 2048, 3000, 4096, 8192, 16384, 32768, 65536, 131072]),
       batch=st.sampled_from([1, 7, 64, 256, 1000, 1024, 1536, 4096]),
       hardware=st.sampled_from([H100, NVL72]))
def test_result_is_valid_or_a_clear_error(model, gpus, seq, batch, hardware):
    training = TrainingSpec(seq_len=seq, global_batch=batch)
    try:
        layout, reasons = heuristic_layout_with_reasons(model, hardware, training, gpus)
    except AutoparInputError as err:
        assert str(err)
        return
    assert check_layout(layout, model, training, gpus, hardware, allow_cross_domain_tp=False) == []
    assert layout.world == gpus and layout.min_gpus() <= gpus
    assert layout.tp <= hardware.nvlink_domain_size and layout.etp <= hardware.nvlink_domain_size
    assert not (layout.sp and layout.tp == 1)
    assert model.is_moe or layout.ep == 1
    assert reasons


# ---- zoo models, when present ---------------------------------------------------------------------------
def _zoo_models() -> list[ModelSpec]:
    try:
        from autopar.specs.loaders import load_model, zoo_names
        names = zoo_names("models")
    except AutoparInputError:
        return []
    out = []
    for name in names:
        try:
            out.append(load_model(name))
        except AutoparInputError:
            continue  # a zoo file being written right now; its own tests cover it
    return out


def test_zoo_models_give_valid_layouts_or_clear_errors():
    models = _zoo_models()
    if not models:
        pytest.skip("no zoo models present")
    for model in models:
        for gpus in (8, 64, 512):
            try:
                run(model, gpus)
            except AutoparInputError as err:
                assert model.name in str(err)


def test_zoo_models_of_the_moe_table_get_their_rows():
    by_name = {m.name: m for m in _zoo_models()}
    present = [r for r in ROWS if r[0] in by_name]
    if not present:
        pytest.skip("no MoE-table models in the zoo yet")
    for name, label, row in present:
        tp, pp, ep, cp = row
        layout, reasons = run(by_name[name], Degrees(tp=tp, pp=pp, cp=cp, ep=ep).min_gpus(), NVL72)
        assert degrees(layout) == row, (name, layout.short())
        assert any(label in r for r in reasons)
