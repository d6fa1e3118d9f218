"""The model zoo (``models/*.yaml``): every file loads, and parameter counts match published figures.

Published figures are compared with a tolerance of max(2 %, half a unit of the last printed digit): a model card that
prints "7B" only says 6.5B-7.5B, one that prints "116.83B" pins the count to 0.004 %, and 2 % is the floor asked of
the zoo. Sources count differently, so every row names what it counts:

- ``total``: every parameter of the main model (MTP modules excluded, as ModelSpec.total_params).
- ``active``: the parameters one token passes through, both embedding matrices included (ModelSpec.active_params).
- ``*_no_input_emb``: the input embedding table left out (a token's row is looked up, not multiplied);
  DeepSeek-V3's README and the gpt-oss card count this way.
- ``*_no_emb``: the input embedding and the LM-head matrix both left out ("non-embedding"), as the Qwen, Moonlight
  and Nemotron-4 reports do.
- ``mtp``: one DeepSeek-V3 multi-token-prediction module without the shared embedding and head.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from autopar.specs.loaders import load_model, zoo_dir, zoo_names
from autopar.specs.model import ModelSpec

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data"
B, T = 1e9, 1e12

# (zoo name, quantity, published figure as printed, unit, source). Where the convention was inferred rather than
# stated by the source, the source column says so.
PUBLISHED: list[tuple[str, str, str, float, str]] = [
    ("llama2_7b", "total", "7", B, "Llama 2 paper arXiv 2307.09288 Table 1 (size label)"),
    ("llama2_13b", "total", "13", B, "arXiv 2307.09288 Table 1 (size label)"),
    ("llama2_70b", "total", "70", B, "arXiv 2307.09288 Table 1 (size label)"),
    ("llama3_8b", "total", "8", B, "Llama 3 paper arXiv 2407.21783 Table 3"),
    ("llama3_70b", "total", "70", B, "arXiv 2407.21783 Table 3"),
    ("llama3_405b", "total", "405", B, "arXiv 2407.21783 Table 3"),
    ("gpt3_175b", "total", "175.0", B, "GPT-3 paper arXiv 2005.14165 Table 2.1 (n_params)"),
    ("nemotron4_15b", "total_no_emb", "12.5", B, "arXiv 2402.16819 sec. 2 (12.5B non-embedding parameters)"),
    ("nemotron4_340b", "total_no_emb", "331.6", B, "arXiv 2406.11704 sec. 2 (331.6B non-embedding parameters)"),
    ("mixtral_8x7b", "total", "46.7", B, "Mistral AI 'Mixtral of experts' announcement"),
    ("mixtral_8x7b", "active", "12.9", B, "Mistral AI 'Mixtral of experts' announcement"),
    ("mixtral_8x22b", "total", "141", B, "Mistral AI Mixtral 8x22B announcement"),
    ("mixtral_8x22b", "active", "39", B, "Mistral AI Mixtral 8x22B announcement"),
    ("olmoe", "total", "6.9", B, "OLMoE paper arXiv 2409.02060 (6.9B total; abstract rounds to 7B)"),
    ("olmoe", "active", "1.3", B, "arXiv 2409.02060 (1.3B active; abstract rounds to 1B)"),
    ("moonlight_16b_a3b", "total_no_emb", "15.29", B,
     "moonshotai/Moonlight-16B-A3B model card table; convention inferred (our non-embedding count matches)"),
    ("moonlight_16b_a3b", "active_no_emb", "2.24", B, "Moonlight model card table; convention inferred as above"),
    ("deepseek_v2", "total", "236", B, "DeepSeek-V2 paper arXiv 2405.04434 abstract"),
    ("deepseek_v2", "active", "21", B, "arXiv 2405.04434 abstract"),
    ("deepseek_v3", "total", "671", B, "DeepSeek-V3 paper arXiv 2412.19437 abstract; README_WEIGHTS.md"),
    ("deepseek_v3", "active", "37", B, "arXiv 2412.19437 abstract"),
    ("deepseek_v3", "mtp", "11.5", B, "deepseek-ai/DeepSeek-V3 README_WEIGHTS.md (MTP: 11.5B unique parameters)"),
    ("kimi_k2", "total", "1.04", T, "Kimi K2 report arXiv 2507.20534"),
    ("kimi_k2", "active_no_input_emb", "32", B,
     "arXiv 2507.20534; convention not stated, assumed as DeepSeek-V3's README (ours with it: 32.86B, +2.7 %)"),
    ("qwen3_30b_a3b", "total", "30.5", B, "Qwen/Qwen3-30B-A3B model card"),
    ("qwen3_30b_a3b", "active", "3.3", B, "Qwen/Qwen3-30B-A3B model card"),
    ("qwen3_30b_a3b", "total_no_emb", "29.9", B, "Qwen/Qwen3-30B-A3B model card (non-embedding)"),
    ("qwen3_235b_a22b", "total", "235", B, "Qwen/Qwen3-235B-A22B model card"),
    ("qwen3_235b_a22b", "active", "22", B, "Qwen/Qwen3-235B-A22B model card"),
    ("qwen3_235b_a22b", "total_no_emb", "234", B, "Qwen/Qwen3-235B-A22B model card (non-embedding)"),
    ("glm45_air", "total", "106", B, "GLM-4.5 report arXiv 2508.06471"),
    ("glm45_air", "active_no_emb", "12", B,
     "arXiv 2508.06471; convention not stated, inferred (ours with embeddings: 13.42B, +12 %)"),
    ("glm45", "total", "355", B, "GLM-4.5 report arXiv 2508.06471"),
    ("glm45", "active_no_emb", "32", B,
     "arXiv 2508.06471; convention not stated, inferred (ours with embeddings: 33.63B, +5 %)"),
    ("gpt_oss_120b", "total", "116.83", B, "gpt-oss model card arXiv 2508.10925"),
    ("gpt_oss_120b", "active_no_input_emb", "5.13", B, "gpt-oss model card arXiv 2508.10925"),
    ("llama4_scout", "total", "109", B, "Meta Llama 4 model card (text-only count here: vision encoder not modelled)"),
    ("llama4_scout", "active", "17", B, "Meta Llama 4 model card"),
    ("llama4_maverick", "total", "400", B, "Meta Llama 4 model card"),
    ("llama4_maverick", "active", "17", B, "Meta Llama 4 model card"),
    ("report_hybrid_17b", "total", "17.43", B, "reference analysis report, Model table"),
    ("report_hybrid_17b", "expert", "16.11", B, "reference analysis report, Model table"),
    ("report_hybrid_17b", "nonexpert", "1.33", B, "reference analysis report, Model table"),
    ("qwen3_next_80b_a3b", "total", "80", B, "Qwen/Qwen3-Next-80B-A3B model card (80B total)"),
    ("qwen3_next_80b_a3b", "active_no_emb", "3", B,
     "Qwen3-Next model card (3B activated); convention inferred (ours with embeddings: 3.87B)"),
    ("nemotron_h_8b", "total", "8", B, "Nemotron-H paper arXiv 2504.03624 (Nemotron-H-8B)"),
    ("nemotron3_nano_30b_a3b", "total", "31.6", B, "NVIDIA Nemotron 3 Nano 30B-A3B model card (31.6B total)"),
    ("nemotron3_nano_30b_a3b", "active", "3.6", B, "Nemotron 3 Nano model card (3.6B active including embeddings)"),
    ("gemma3_27b", "total", "27", B, "Gemma 3 technical report arXiv 2503.19786 (27B; text model counted here)"),
    ("gpt_oss_20b", "total", "20.91", B, "gpt-oss model card arXiv 2508.10925"),
    ("gpt_oss_20b", "active_no_input_emb", "3.61", B, "gpt-oss model card arXiv 2508.10925"),
    ("grok_1", "total", "314", B, "xai-org/grok-1 README (314B parameters)"),
    ("jamba_v0_1", "total", "52", B, "Jamba paper arXiv 2403.19887 (52B available parameters); model card"),
    ("jamba_v0_1", "active", "12", B, "Jamba paper arXiv 2403.19887 (12B active); model card"),
    ("jamba_1_5_large", "total", "398", B, "Jamba-1.5 paper arXiv 2408.12570 (398B total)"),
    ("jamba_1_5_large", "active", "94", B, "Jamba-1.5 paper arXiv 2408.12570 (94B active)"),
    ("falcon_h1_7b", "total", "7.59", B, "tiiuae/Falcon-H1-7B-Base Hugging Face page (7.59B params); not opened from "
                                         "this machine, the report arXiv 2507.22448 labels it 7B"),
    ("nemotron_h_56b", "total", "56", B, "Nemotron-H paper arXiv 2504.03624 (Nemotron-H-56B)"),
    ("kimi_linear_48b_a3b", "active_no_emb", "3", B,
     "Kimi Linear report arXiv 2510.26692 (3B activated); convention inferred (ours with embeddings: 3.48B)"),
]
# Published figures autopar's count from the released config does not meet, kept as strict expected failures so a
# change in either is noticed: (zoo name, quantity, printed, unit, source, why).
DISAGREES = [
    ("kimi_linear_48b_a3b", "total", "48", B, "Kimi Linear report arXiv 2510.26692 (48B total)",
     "the config's 26 MoE layers x 256 experts of 1024 alone hold 47.1B; autopar counts 49.12B (+2.3 %)"),
]
# MoE models whose source prints no active count, and what it prints instead.
NO_ACTIVE_FIGURE = {"report_hybrid_17b": "the report prints total, expert and non-expert counts only",
                    "grok_1": "xAI states only '25% of the weights active on a given token' (ours: 26.5 %)"}


def measure(m: ModelSpec, quantity: str) -> int:
    """The count a published figure of kind ``quantity`` refers to (see the module docstring)."""
    input_emb = m.embedding_params
    head = 0 if m.tie_embeddings else m.vocab_size * m.hidden_size
    return {
        "total": m.total_params,
        "total_no_emb": m.total_params - input_emb - head,
        "active": m.active_params,
        "active_no_input_emb": m.active_params - input_emb,
        "active_no_emb": m.active_params - input_emb - head,
        "mtp": m.mtp_layers * m.mtp_module_params,
        "expert": m.expert_params_total,
        "nonexpert": m.total_params - m.expert_params_total,
    }[quantity]


def tolerance(printed: str, unit: float) -> float:
    """Relative tolerance: max(2 %, half a unit of the last printed digit)."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    half_unit = 0.5 * 10.0 ** -decimals
    return max(0.02, half_unit / float(printed))


ZOO = zoo_names("models")


# ---- every file ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ZOO)
def test_zoo_file_loads_under_its_own_name(name):
    m = load_model(name)
    assert isinstance(m, ModelSpec)
    assert m.name == name, f"models/{name}.yaml: name is {m.name!r}, must equal the file stem"
    assert m.source, f"models/{name}.yaml: source is empty"


@pytest.mark.parametrize("name", ZOO)
def test_zoo_file_opens_with_a_source_comment(name):
    lines = (zoo_dir("models") / f"{name}.yaml").read_text().splitlines()
    assert lines[0].startswith("# "), f"models/{name}.yaml must open with a comment naming its source"
    header = " ".join(line for line in lines if line.startswith("#"))
    assert any(key in header for key in ("Source:", "config.json", "arXiv", "README")), (
        f"models/{name}.yaml: the opening comment names no source, config.json, paper or README")


@pytest.mark.parametrize("name", ZOO)
def test_zoo_file_has_no_defaulted_core_fields(name):
    """Core shape fields are written out, not left to ModelSpec defaults."""
    data = yaml.safe_load((zoo_dir("models") / f"{name}.yaml").read_text())
    for key in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size",
                "tie_embeddings", "gated_mlp", "norm"):
        assert key in data, f"models/{name}.yaml: '{key}' must be given explicitly"


def test_every_model_of_the_validation_runs_is_in_the_zoo():
    with open(DATA / "published_runs.csv", newline="") as f:
        names = {row["model"] for row in csv.DictReader(f)}
    missing = sorted(names - set(ZOO))
    assert not missing, f"data/published_runs.csv names models with no zoo file: {missing}"
    for name in names:  # by exact name, dots included (megatron_gpt_1.7b)
        assert load_model(name).name == name


# ---- published parameter counts -----------------------------------------------------------------------------
@pytest.mark.parametrize("name,quantity,printed,unit,source", PUBLISHED,
                         ids=[f"{r[0]}-{r[1]}" for r in PUBLISHED])
def test_parameter_count_matches_published(name, quantity, printed, unit, source):
    m = load_model(name)
    ours = measure(m, quantity)
    published = float(printed) * unit
    rel = abs(ours - published) / published
    tol = tolerance(printed, unit)
    assert rel <= tol, (f"{name} {quantity}: ours {ours / unit:.4g} vs published {printed} ({source}): "
                        f"off by {rel:.2%}, tolerance {tol:.2%}")


@pytest.mark.parametrize("name,quantity,printed,unit,source,why", DISAGREES, ids=[f"{r[0]}-{r[1]}" for r in DISAGREES])
def test_known_disagreements_with_published_counts(name, quantity, printed, unit, source, why):
    rel = abs(measure(load_model(name), quantity) - float(printed) * unit) / (float(printed) * unit)
    if rel > tolerance(printed, unit):
        pytest.xfail(f"{name} {quantity} off by {rel:.2%} from {printed} ({source}): {why}")
    pytest.fail(f"{name} {quantity} now matches {printed}: move the row to PUBLISHED")


def test_every_public_moe_model_has_an_active_figure():
    moe = {n for n in ZOO if load_model(n).is_moe} - set(NO_ACTIVE_FIGURE)
    with_active = {r[0] for r in PUBLISHED if r[1].startswith("active")}
    assert moe <= with_active, f"MoE models without a published active count: {sorted(moe - with_active)}"


def test_tolerance_rule():
    assert tolerance("7", B) == pytest.approx(0.5 / 7)      # "7B" means 6.5B-7.5B
    assert tolerance("116.83", B) == 0.02                   # precise figures get the 2 % floor
    assert tolerance("1.04", T) == 0.02


# ---- custom GPT shapes of the validation set ----------------------------------------------------------------
def _custom_rows() -> list[dict[str, str]]:
    with open(DATA / "models_custom.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("row", _custom_rows(), ids=lambda r: r["name"])
def test_custom_shape_matches_models_custom_csv(row):
    m = load_model(row["name"])
    assert m.num_layers == int(row["layers"])
    assert m.hidden_size == int(row["hidden"])
    assert m.num_attention_heads == int(row["heads"])
    assert m.kv_heads == m.num_attention_heads, "the custom GPT shapes use multi-head attention"
    assert m.vocab_size == int(row["vocab"])
    assert m.max_position_embeddings == int(row["seq_len"])
    if row["ffn_hidden"]:
        assert m.ffn_hidden_size == int(row["ffn_hidden"])
    else:  # not given by the source; the file documents the assumption (4·hidden, plain MLP)
        assert (m.ffn_hidden_size, m.gated_mlp) == (4 * m.hidden_size, False)
    label = row["params_b"]
    rel = abs(m.total_params / B - float(label)) / float(label)
    tol = tolerance(label, B)
    assert rel <= tol, (f"{row['name']}: ours {m.total_params / B:.3f}B vs params_b {label}: "
                        f"off by {rel:.2%}, tolerance {tol:.2%}")


def test_megatron_2021_count_is_the_paper_formula_plus_final_norm():
    """Narayanan et al. 2021 count P = 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h)); ModelSpec adds the final LayerNorm."""
    for row in _custom_rows():
        if not row["name"].startswith("megatron_gpt_"):
            continue
        m = load_model(row["name"])
        l, h, V, s = m.num_layers, m.hidden_size, m.vocab_size, m.max_position_embeddings
        paper = 12 * l * h * h + 13 * l * h + (V + s) * h
        assert m.total_params == paper + 2 * h, row["name"]


def test_a_copied_model_recounts_its_layers():
    """Layer counts are cached per model; a copy with other fields must not keep the original's (pydantic copies
    cached values along with the fields)."""
    from autopar.specs.loaders import load_model
    dsv3 = load_model("deepseek_v3")
    assert (dsv3.num_moe_layers, dsv3.num_dense_layers) == (58, 3)
    longer = dsv3.model_copy(update={"num_layers": 64})
    assert (longer.num_moe_layers, longer.num_dense_layers, len(longer._layer_mixers)) == (61, 3, 64)
