"""Map a Hugging Face ``config.json`` to a :class:`ModelSpec`.

``model_from_hf_config(data, name, where)`` returns the spec and the set of config keys it did not use that
could change what autopar computes (for example ``quantization_config``, a vision tower, or Llama 4's
``attention_chunk_size``). Keys that cannot matter (token ids, dropout, initialisation, norm epsilons, RoPE
settings, routing hyper-parameters without weights) are listed with the reason in :data:`IGNORED_KEYS`.

Supported ``model_type`` values (the config classes of Hugging Face ``transformers`` and the ``modeling_*.py``
shipped with the checkpoints; key names as in those classes):

=====================================  ==========================================================================
``llama``                              Llama 2 / 3 / 3.1 (gated SiLU MLP, RMSNorm, optional GQA)
``mistral``, ``mixtral``               Mistral (sliding window on every layer), Mixtral (top-k experts, no shared)
``qwen2``, ``qwen2_moe``               Qwen2 / 2.5 (Q/K/V biases always on), Qwen2-MoE (one gated shared expert)
``qwen3``, ``qwen3_moe``               Qwen3 dense / MoE (``head_dim`` explicit, ``decoder_sparse_step``)
``olmoe``                              OLMoE (64 experts, top-8, no shared expert)
``deepseek_v2``, ``deepseek_v3``,      MLA attention, shared experts, ``first_k_dense_replace`` leading dense
``kimi_k2``                            layers, ``num_nextn_predict_layers`` MTP modules (Moonlight and Kimi K2
                                       use the DeepSeek-V3 code)
``deepseek_v32``                       DeepSeek-V3.2: V3 plus DeepSeek Sparse Attention's lightning indexer
                                       (``index_n_heads``, ``index_head_dim``, ``index_topk``; autopar.blocks.mla)
``glm4_moe``                           GLM-4.5 / 4.5-Air (Q/K/V biases, shared expert, leading dense layers, MTP)
``gpt_oss``                            GPT-OSS (attention and expert biases, alternating sliding window; the
                                       experts' clamp ``swiglu_limit``, YaRN's factor from ``rope_scaling``)
``llama4``, ``llama4_text``            Llama 4 (``text_config``; MoE every ``interleave_moe_layer_step``-th
                                       layer, dense layers of width ``intermediate_size_mlp``, 1 shared expert)
``qwen3_next``                         Qwen3-Next: Gated DeltaNet layers and gated softmax attention every
                                       ``full_attention_interval``-th layer (or ``layer_types``), MoE + 1 shared
``nemotron_h``                         Nemotron-H and Nemotron 3: one mixer per layer from
                                       ``hybrid_override_pattern`` / ``layers_block_type`` (M Mamba-2, * attention,
                                       - squared-ReLU MLP, E MoE with one shared expert); Nemotron 3 Super and
                                       Ultra's LatentMoE (``moe_latent_size``) and MTP modules
                                       (``num_nextn_predict_layers`` of ``mtp_layers_block_type`` sub-layers)
``kimi_linear``                        Kimi Linear: Kimi Delta Attention and MLA (``linear_attn_config``), MoE
``gemma3``, ``gemma3_text``            Gemma 3 (``text_config``; 5 local sliding-window layers : 1 global,
                                       ``sliding_window_pattern`` or ``layer_types``; tied embeddings)
``jamba``                              Jamba / Jamba 1.5: Mamba-1 mixers and attention without positional
                                       encoding every ``attn_layer_period``-th layer (or ``layers_block_type``),
                                       MoE every ``expert_layer_period``-th layer, dense SwiGLU MLPs elsewhere
``falcon_h1``                          Falcon-H1: attention and a Mamba-2 mixer in parallel in every layer
                                       (layer_pattern ``attention+mamba``), SwiGLU MLP
``phi3``                               Phi-3 / Phi-4 (Llama shape, packed qkv_proj and gate_up_proj)
``smollm3``                            SmolLM3 (Llama shape, tied embeddings, RoPE left out on some layers)
``minimax_m2``                         MiniMax-M2 (GQA with explicit head_dim, every layer MoE, MTP modules)
``bailing_moe``                        Ling / Ring v1 and v2 (shared experts, leading dense layers, MTP)
``ernie4_5_moe``                       ERNIE 4.5 MoE (MoE from moe_layer_start_index, shared experts)
=====================================  ==========================================================================

Each mixer a family maps to names its block class (:mod:`autopar.blocks`), whose ``field_problem`` checks the
fields read here; a new mixer kind is one block file, its torch twin and a reader here (docs/architectures.md).

Weights that exist in these checkpoints but are not modelled by ModelSpec, all under 0.01 % of the total:
Q/K-norm scales (Qwen3, OLMoE, GLM-4.5: 2·d or (a+g)·d per layer), router and expert-score-correction biases
(E per MoE layer), GPT-OSS attention sinks (a per layer), the Qwen2-MoE shared-expert gate (h per layer), and
the output-projection bias of a Llama config with ``attention_bias`` but no ``mlp_bias`` (h per layer).
"""

from __future__ import annotations

import math
from typing import Any

from autopar.blocks import KDA, Attention, GatedDeltaNet, Mamba1, Mamba2
from autopar.errors import AutoparInputError
from autopar.specs._base import build_spec
from autopar.specs._hf_reader import IGNORED_KEYS, _base, _mla, _moe_from_lists, _Reader, _window
from autopar.specs.model import ModelSpec

__all__ = ["IGNORED_KEYS", "SUPPORTED_MODEL_TYPES", "model_from_hf_config"]

# ---- families -------------------------------------------------------------------------------------------------
def _llama_like(r: _Reader, kv_required: bool, head_dim_required: bool = False) -> dict[str, Any]:
    f = _base(r, kv_required, head_dim_required)
    f["ffn_hidden_size"] = r.get("intermediate_size")
    attn_bias = r.get("attention_bias", False, kind=bool)
    mlp_bias = r.get("mlp_bias", False, kind=bool)
    if attn_bias and mlp_bias:
        f["linear_bias"] = True
    elif attn_bias:
        f["qkv_bias"] = True
    elif mlp_bias:
        r.used.discard("mlp_bias")  # MLP-only biases are not representable: report the key
    return f


def _llama(r: _Reader) -> dict[str, Any]:
    return _llama_like(r, kv_required=False)


def _mistral(r: _Reader) -> dict[str, Any]:
    f = _llama_like(r, kv_required=True)
    f.update(_window(r, f["num_layers"], all_layers_key=True))
    return f


def _mixtral(r: _Reader) -> dict[str, Any]:
    f = _mistral(r)
    f["moe"] = dict(num_experts=r.get("num_local_experts"), top_k=r.get("num_experts_per_tok"),
                    expert_ffn_hidden_size=f["ffn_hidden_size"])
    return f


def _qwen_moe(r: _Reader, f: dict[str, Any], shared: bool = False) -> dict[str, Any]:
    """Qwen2-MoE / Qwen3-MoE layer pattern: layer i is MoE unless listed in mlp_only_layers, and only if
    (i + 1) % decoder_sparse_step == 0. ``shared``: the family has one optional shared expert of width
    shared_expert_intermediate_size (Qwen2-MoE, Qwen3-Next)."""
    n = f["num_layers"]
    step = r.count("decoder_sparse_step", 1)
    mlp_only = set(r.layer_list("mlp_only_layers", []))
    moe_layers = [i for i in range(n) if i not in mlp_only and (i + 1) % step == 0]
    first_dense, interval = _moe_from_lists(r, n, moe_layers, "decoder_sparse_step / mlp_only_layers")
    moe = dict(num_experts=r.get("num_experts"), top_k=r.get("num_experts_per_tok"),
               expert_ffn_hidden_size=r.get("moe_intermediate_size"),
               first_dense_layers=first_dense, moe_layer_interval=interval)
    width = r.get("shared_expert_intermediate_size", 0) if shared else 0
    if width:
        moe.update(num_shared_experts=1, shared_expert_ffn_hidden_size=width)
    return moe


def _qwen2(r: _Reader) -> dict[str, Any]:
    f = _llama_like(r, kv_required=True)
    f["qkv_bias"] = True  # Qwen2 attention: q_proj, k_proj, v_proj always have biases (o_proj has none)
    f.update(_window(r, f["num_layers"], all_layers_key=False))
    return f


def _qwen2_moe(r: _Reader) -> dict[str, Any]:
    f = _qwen2(r)
    f["moe"] = _qwen_moe(r, f, shared=True)
    return f


def _qwen3(r: _Reader) -> dict[str, Any]:
    f = _llama_like(r, kv_required=True, head_dim_required=True)
    f.update(_window(r, f["num_layers"], all_layers_key=False))
    return f


def _qwen3_moe(r: _Reader) -> dict[str, Any]:
    f = _qwen3(r)
    f["moe"] = _qwen_moe(r, f)
    return f


def _olmoe(r: _Reader) -> dict[str, Any]:
    f = _llama_like(r, kv_required=False)
    f["moe"] = dict(num_experts=r.get("num_experts"), top_k=r.get("num_experts_per_tok"),
                    expert_ffn_hidden_size=f["ffn_hidden_size"])
    return f


def _deepseek_moe(r: _Reader, f: dict[str, Any], what: str) -> dict[str, Any] | None:
    """DeepSeek-style MoE keys (also GLM-4.5): layer i is MoE iff i >= first_k_dense_replace (and, for
    DeepSeek, i % moe_layer_freq == 0; only moe_layer_freq = 1 is supported)."""
    experts = r.get("n_routed_experts", None, nullable=True)
    if experts is None:
        return None
    if "moe_layer_freq" in r.data:
        freq = r.get("moe_layer_freq")
        if freq != 1:
            raise r.fail(f"moe_layer_freq = {freq} is not supported for {what} (only 1: every layer after "
                         "first_k_dense_replace is MoE)")
    return dict(num_experts=experts, top_k=r.get("num_experts_per_tok"),
                expert_ffn_hidden_size=r.get("moe_intermediate_size"),
                num_shared_experts=r.get("n_shared_experts", 0, nullable=False),
                first_dense_layers=r.get("first_k_dense_replace", 0))


def _deepseek(r: _Reader) -> dict[str, Any]:
    f = _base(r, kv_required=False)
    r.mark("num_key_value_heads")  # MLA: K and V come from the shared latent; the key repeats the head count
    f["num_kv_heads"] = None
    f["ffn_hidden_size"] = r.get("intermediate_size")
    if r.get("attention_bias", False, kind=bool):
        r.used.discard("attention_bias")  # MLA with biases is not modelled: report the key
    f["mla"] = _mla(r)
    if r.family == "deepseek_v32":
        # DeepSeek Sparse Attention: the lightning indexer next to MLA (autopar.blocks.mla)
        f["mla"]["indexer"] = dict(n_heads=r.get("index_n_heads"), head_dim=r.get("index_head_dim"),
                                   topk=r.get("index_topk"))
        r.mark("indexer_rope_interleave")   # RoPE layout of the index key: no weights
    moe = _deepseek_moe(r, f, r.family)
    if moe is not None:
        f["moe"] = moe
    f["mtp_layers"] = r.get("num_nextn_predict_layers", 0)
    return f


def _glm4_moe(r: _Reader) -> dict[str, Any]:
    f = _base(r, kv_required=True, head_dim_required=True)
    f["ffn_hidden_size"] = r.get("intermediate_size")
    f["qkv_bias"] = r.get("attention_bias", False, kind=bool)  # Glm4MoeAttention: bias on q/k/v, not on o_proj
    moe = _deepseek_moe(r, f, "glm4_moe")
    if moe is not None:
        f["moe"] = moe
    f["mtp_layers"] = r.get("num_nextn_predict_layers", 0)
    return f


def _gpt_oss(r: _Reader) -> dict[str, Any]:
    f = _base(r, kv_required=True, head_dim_required=True)
    f["ffn_hidden_size"] = r.get("intermediate_size")
    # attention_bias: q/k/v and o projections carry biases; experts always do (gpt_oss/torch/model.py).
    f["linear_bias"] = r.get("attention_bias", False, kind=bool)
    top_k = r.get("num_experts_per_tok", None, nullable=True)
    alias = r.get("experts_per_token", None, nullable=True)
    if top_k is None and alias is None:
        raise r.fail("required key 'num_experts_per_tok' (or 'experts_per_token') is missing "
                     "(needed for model_type 'gpt_oss')")
    if top_k is not None and alias is not None and top_k != alias:
        raise r.fail(f"num_experts_per_tok ({top_k}) and experts_per_token ({alias}) disagree")
    f["moe"] = dict(num_experts=r.get("num_local_experts"), top_k=top_k if top_k is not None else alias,
                    expert_ffn_hidden_size=f["ffn_hidden_size"], expert_bias=True)
    # swiglu_limit: the experts clamp the activation's inputs (gpt_oss/torch/model.py swiglu), priced by the clamp's
    # kernels (autopar.blocks.moe.CLAMP_ELEMS); absent or null = no clamp.
    limit_ = r.data.get("swiglu_limit")
    r.used.add("swiglu_limit")
    if limit_ is not None:
        if isinstance(limit_, bool) or not isinstance(limit_, (int, float)) or not 0 < limit_ <= 1e6:
            raise r.fail(f"key 'swiglu_limit' must be a number in (0, 1e6], got {limit_!r}")
        f["moe"]["activation_clamp"] = float(limit_)
    # rope_scaling: YaRN scales RoPE's cos and sin by its concentration factor (Megatron-Core
    # _yarn_get_concentration_factor: with mscale and mscale_all_dim unset, 0.1·ln(factor) + 1; with both,
    # the ratio of the two), which Megatron-Core's fused RoPE does not take
    # (autopar.blocks.attention.ROPE_UNFUSED_EXTRA).
    rs = r.data.get("rope_scaling")
    r.used.add("rope_scaling")
    if rs is not None and not isinstance(rs, dict):
        raise r.fail(f"key 'rope_scaling' must be a mapping or null, got {rs!r}")
    kind = (rs or {}).get("rope_type", (rs or {}).get("type"))
    if kind is not None and not isinstance(kind, str):
        raise r.fail(f"key 'rope_scaling.rope_type' must be a string, got {kind!r}")
    if kind == "yarn":
        factor = rs.get("factor", 1.0)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 1.0 <= factor <= 1e6:
            raise r.fail(f"key 'rope_scaling.factor' must be a number in [1, 1e6], got {factor!r}")
        ms, ms_all = rs.get("mscale"), rs.get("mscale_all_dim")
        for key, v in (("mscale", ms), ("mscale_all_dim", ms_all)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1e6):
                raise r.fail(f"key 'rope_scaling.{key}' must be a number in [0, 1e6] or null, got {v!r}")

        def _mscale(m: float) -> float:
            return 0.1 * m * math.log(factor) + 1.0 if factor > 1 else 1.0
        # Megatron-Core takes the ratio only where both are given (not None), else the default of mscale 1
        conc = _mscale(1.0) if ms is None or ms_all is None else _mscale(ms) / _mscale(ms_all)
        if not 1e-3 <= conc <= 1e3:   # ModelSpec.rope_mscale's bounds
            raise r.fail(f"rope_scaling: mscale {ms} over mscale_all_dim {ms_all} at factor {factor} gives a "
                         f"concentration factor of {conc:.4g}, outside [0.001, 1000]")
        f["rope_mscale"] = round(conc, 4)
    # Without layer_types: the window on even layers (openai/gpt-oss gpt_oss/torch/model.py: layer_idx % 2 == 0).
    default = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(f["num_layers"])]
    f.update(_window(r, f["num_layers"], all_layers_key=False, default_types=default))
    return f


def _llama4_text(r: _Reader) -> dict[str, Any]:
    f = _base(r, kv_required=True, head_dim_required=True)
    f["ffn_hidden_size"] = r.get("intermediate_size_mlp")  # dense layers
    if r.get("attention_bias", False, kind=bool):
        f["qkv_bias"] = True
    n = f["num_layers"]
    step = r.count("interleave_moe_layer_step", 1)
    moe_layers = r.layer_list("moe_layers", None, nullable=True)
    if moe_layers is None:  # transformers' Llama4TextConfig default
        moe_layers = list(range(step - 1, n, step))
    first_dense, interval = _moe_from_lists(r, n, sorted(moe_layers), "interleave_moe_layer_step / moe_layers")
    expert = r.get("intermediate_size")
    # Llama4TextMoe always has one shared expert of the routed experts' width.
    f["moe"] = dict(num_experts=r.get("num_local_experts"), top_k=r.get("num_experts_per_tok"),
                    expert_ffn_hidden_size=expert, num_shared_experts=1,
                    first_dense_layers=first_dense, moe_layer_interval=interval)
    return f


def _qwen3_next(r: _Reader) -> dict[str, Any]:
    """Qwen3-Next (transformers Qwen3NextConfig): layer i is gated softmax attention when layer_types says
    'full_attention' (default: every full_attention_interval-th layer), else a Gated DeltaNet. The attention's
    q_proj also yields a sigmoid output gate of a·d (Qwen3NextAttention); the DeltaNet has H_k query/key heads,
    H_v value heads, a short convolution and an output gate (Qwen3NextGatedDeltaNet)."""
    f = _base(r, kv_required=True, head_dim_required=True)
    f["ffn_hidden_size"] = r.get("intermediate_size")
    if r.get("attention_bias", False, kind=bool):
        f["qkv_bias"] = True
    n = f["num_layers"]
    interval = r.get("full_attention_interval", 4)
    types = r.get("layer_types", None, kind=list, nullable=True)
    if types is None:
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    if len(types) != n:
        raise r.fail(f"layer_types has {len(types)} entries but num_hidden_layers is {n}")
    unknown = sorted({t for t in types if t not in ("full_attention", "linear_attention")})
    if unknown:
        raise r.fail(f"layer_types: unsupported type(s) {unknown} (qwen3_next has full_attention, linear_attention)")
    f["mixers"] = {
        "gated_attention": dict(kind=Attention.kind, output_gate=True),
        "gated_deltanet": dict(kind=GatedDeltaNet.kind, num_heads=r.get("linear_num_key_heads"),
                               num_value_heads=r.get("linear_num_value_heads"),
                               head_dim=r.get("linear_key_head_dim"),
                               value_head_dim=r.get("linear_value_head_dim"),
                               conv_kernel=r.get("linear_conv_kernel_dim", 4), output_gate=True)}
    f["layer_pattern"] = ["gated_attention" if t == "full_attention" else "gated_deltanet" for t in types]
    f["moe"] = _qwen_moe(r, f, shared=True)
    return f


_NEMOTRON_KINDS = {"M": ("mamba", "none"), "*": ("attention", "none"), "-": ("none", "dense"), "E": ("none", "moe")}
_NEMOTRON_NAMES = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}


def _nemotron_h(r: _Reader) -> dict[str, Any]:
    """Nemotron-H / Nemotron 3 (NVIDIA's configuration_nemotron_h.py): each layer is ONE block after one norm —
    Mamba-2 mixer (M), attention (*), squared-ReLU MLP (-) or MoE (E: squared-ReLU routed experts and one shared
    expert) — from ``hybrid_override_pattern`` or ``layers_block_type``."""
    h = r.get("hidden_size")
    a = r.get("num_attention_heads")
    kv = r.get("num_key_value_heads", None, nullable=True)
    head_dim = r.get("head_dim", None, nullable=True)
    alias = r.get("attention_head_dim", None, nullable=True)
    if head_dim is None:
        head_dim = alias
    pattern = r.get("hybrid_override_pattern", None, kind=str, nullable=True)
    blocks = r.get("layers_block_type", None, kind=list, nullable=True)
    if pattern is None and blocks is not None:
        bad = sorted({b for b in blocks if b not in _NEMOTRON_NAMES})
        if bad:
            raise r.fail(f"layers_block_type: unknown block type(s) {bad} (mamba, attention, mlp, moe)")
        pattern = "".join(_NEMOTRON_NAMES[b] for b in blocks)
    if pattern is None:
        raise r.fail("required key 'hybrid_override_pattern' (or 'layers_block_type') is missing "
                     "(needed for model_type 'nemotron_h')")
    bad = sorted(set(pattern) - set(_NEMOTRON_KINDS))
    if bad:
        raise r.fail(f"hybrid_override_pattern: unknown symbol(s) {bad} (M Mamba-2, * attention, - MLP, E MoE)")
    n = r.get("num_hidden_layers", len(pattern))
    if len(pattern) != n:
        raise r.fail(f"hybrid_override_pattern has {len(pattern)} layers but num_hidden_layers is {n}")
    for key in ("use_bias", "mlp_bias", "attention_bias", "mamba_proj_bias"):
        if r.get(key, False, kind=bool):
            r.used.discard(key)   # biases on these layers are not modelled: report the key
    r.mark("use_conv_bias")       # the Mamba-2 convolution bias is counted (Mamba2.other_params)
    f: dict[str, Any] = dict(
        num_layers=n, hidden_size=h, num_attention_heads=a, num_kv_heads=None if kv in (None, a) else kv,
        head_dim=None if head_dim in (None, h // a) else head_dim, vocab_size=r.get("vocab_size"),
        tie_embeddings=r.get("tie_word_embeddings", False, kind=bool), gated_mlp=False, norm="rmsnorm",
        position_embedding="none",
        ffn_hidden_size=r.get("intermediate_size", None, nullable=True) or r.get("moe_intermediate_size"))
    max_pos = r.get("max_position_embeddings", None, nullable=True)
    if max_pos is not None:
        f["max_position_embeddings"] = max_pos
    # The MLP layers' activation (transformers NemotronHConfig mlp_hidden_act, default "relu2" = ReLU squared in
    # ACT2FN): priced op by op where a recipe runs it unfused (ModelSpec.activation).
    act = r.get("mlp_hidden_act", "relu2", kind=str)
    if act in ("relu2", "relu", "gelu"):
        f["activation"] = {"relu2": "squared_relu"}.get(act, act)
    if "M" in pattern:
        heads, hd = r.get("mamba_num_heads"), r.get("mamba_head_dim")
        expand = r.get("expand", None, nullable=True)
        if expand is not None and expand * h != heads * hd:
            raise r.fail(f"expand·hidden_size = {expand}·{h} != mamba_num_heads·mamba_head_dim = {heads}·{hd}")
        f["mixers"] = {"mamba": dict(kind=Mamba2.kind, num_heads=heads, head_dim=hd, state_size=r.get("ssm_state_size"),
                                     n_groups=r.get("n_groups", 1), conv_kernel=r.get("conv_kernel", 4),
                                     chunk_size=r.get("chunk_size", 128))}
    f["layer_pattern"] = [_NEMOTRON_KINDS[c][0] for c in pattern]
    f["mlp_pattern"] = [_NEMOTRON_KINDS[c][1] for c in pattern]
    if "E" in pattern:
        shared = r.get("moe_shared_expert_intermediate_size", 0)
        # LatentMoE (Nemotron 3 Super / Ultra): the routed experts run at moe_latent_size (autopar.blocks.moe)
        f["moe"] = dict(num_experts=r.get("n_routed_experts"), top_k=r.get("num_experts_per_tok"),
                        expert_ffn_hidden_size=r.get("moe_intermediate_size"),
                        num_shared_experts=1 if shared else 0, shared_expert_ffn_hidden_size=shared or None,
                        latent_size=r.get("moe_latent_size", None, nullable=True))
    else:
        r.mark("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
               "moe_shared_expert_intermediate_size", "moe_latent_size")
    # MTP (Nemotron 3 Super / Ultra): num_nextn_predict_layers modules, each the sub-layers of
    # mtp_layers_block_type (["attention", "moe"]) or mtp_hybrid_override_pattern ("*E")
    f["mtp_layers"] = r.get("num_nextn_predict_layers", 0)
    kinds = r.get("mtp_layers_block_type", None, kind=list, nullable=True)
    mtp = r.get("mtp_hybrid_override_pattern", None, kind=str, nullable=True)
    if mtp is None and kinds is not None:
        bad = sorted({str(b) for b in kinds if b not in _NEMOTRON_NAMES})
        if bad:
            raise r.fail(f"mtp_layers_block_type: unknown block type(s) {bad} (mamba, attention, mlp, moe)")
        mtp = "".join(_NEMOTRON_NAMES[b] for b in kinds)
    if f["mtp_layers"] and mtp:
        bad = sorted(set(mtp) - set(pattern))
        if bad:
            raise r.fail(f"the MTP sub-layers {mtp!r} use block kinds {bad} that no main layer has")
        f["mtp_layer_pattern"] = [_NEMOTRON_KINDS[c][0] for c in mtp]
        f["mtp_mlp_pattern"] = [_NEMOTRON_KINDS[c][1] for c in mtp]
    return f


def _gemma3_text(r: _Reader) -> dict[str, Any]:
    """Gemma 3 text model (transformers Gemma3TextConfig): GeGLU MLP, tied embeddings, local sliding-window layers
    with every sliding_window_pattern-th layer global (or layer_types). Gemma's extra post-attention and post-MLP
    norms and Q/K norms (2·h + 2·d per layer) are below 0.01 % and not counted."""
    f = _base(r, kv_required=True, head_dim_required=True)
    f["ffn_hidden_size"] = r.get("intermediate_size")
    f["tie_embeddings"] = r.get("tie_word_embeddings", True, kind=bool)
    if r.get("attention_bias", False, kind=bool):
        f["qkv_bias"] = True
    every = r.get("sliding_window_pattern", 6)
    default = ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(f["num_layers"])]
    f.update(_window(r, f["num_layers"], all_layers_key=False, default_types=default))
    r.mark("hidden_activation", "query_pre_attn_scalar", "rope_local_base_freq", "attn_logit_softcapping",
           "final_logit_softcapping", "cache_implementation")
    return f


def _kimi_linear(r: _Reader) -> dict[str, Any]:
    """Kimi Linear (moonshotai's configuration_kimi.py): MLA on the layers of linear_attn_config.full_attn_layers and
    Kimi Delta Attention on its kda_layers (both 1-based), DeepSeek-V3-style MoE (num_experts, num_experts_per_token,
    num_shared_experts, first_k_dense_replace)."""
    f = _base(r, kv_required=False)
    r.mark("num_key_value_heads")
    f["num_kv_heads"] = None
    f["ffn_hidden_size"] = r.get("intermediate_size")
    f["mla"] = _mla(r)
    n = f["num_layers"]
    lin = r.get("linear_attn_config", kind=dict)
    sub = _Reader(lin, r.where, r.family, prefix="linear_attn_config.")
    full = sub.get("full_attn_layers", kind=list)
    kda = sub.get("kda_layers", [i for i in range(1, n + 1) if i not in full], kind=list)
    if sorted(full + kda) != list(range(1, n + 1)):
        raise r.fail(f"linear_attn_config: full_attn_layers {full} and kda_layers {kda} must cover layers 1..{n} once")
    f["mixers"] = {"kda": dict(kind=KDA.kind, num_heads=sub.get("num_heads"), head_dim=sub.get("head_dim"),
                               conv_kernel=sub.get("short_conv_kernel_size", 4))}
    f["layer_pattern"] = ["attention" if i + 1 in full else "kda" for i in range(n)]
    sub.mark("gate_lower_bound", "use_full_rank_gate")
    if "moe_layer_freq" in r.data and r.get("moe_layer_freq") != 1:
        raise r.fail("moe_layer_freq other than 1 is not supported for kimi_linear")
    f["moe"] = dict(num_experts=r.get("num_experts"), top_k=r.get("num_experts_per_token"),
                    expert_ffn_hidden_size=r.get("moe_intermediate_size"),
                    num_shared_experts=r.get("num_shared_experts", 0),
                    first_dense_layers=r.get("first_k_dense_replace", 0))
    r.mark("mla_use_nope", "moe_router_activation_func", "num_expert_group", "moe_renormalize")
    r.used.update(f"linear_attn_config.{k}" for k in sub.used)
    _UNMAPPED_SUB[id(r)] = sub.unmapped()
    return f


_UNMAPPED_SUB: dict[int, set[str]] = {}


def _shortest_period(pattern: list[str]) -> list[str]:
    """The shortest prefix that repeats to ``pattern`` (ModelSpec repeats a layer_pattern to num_layers)."""
    n = len(pattern)
    return next(pattern[:p] for p in range(1, n + 1) if n % p == 0 and pattern == pattern[:p] * (n // p))


def _jamba(r: _Reader) -> dict[str, Any]:
    """Jamba (transformers JambaConfig / modeling_jamba.py, which AI21's checkpoints use): layer i is attention
    when i % attn_layer_period == attn_layer_offset (or ``layers_block_type`` says so), else a Mamba-1 mixer
    (``JambaMambaMixer``: d = mamba_expand·h, state mamba_d_state, conv mamba_d_conv, Δ rank mamba_dt_rank, "auto"
    = ceil(h/16), RMSNorms on Δ, B, C); an MoE block when i % expert_layer_period == expert_layer_offset (or
    ``layers_num_experts`` > 1), else a SwiGLU MLP of intermediate_size; experts are the same MLP. Attention has
    no positional encoding (JambaAttention applies none) and no biases."""
    f = _base(r, kv_required=True)
    f["position_embedding"] = "none"
    f["ffn_hidden_size"] = r.get("intermediate_size")
    n, h = f["num_layers"], f["hidden_size"]
    if r.get("sliding_window", None, nullable=True) is not None:
        r.used.discard("sliding_window")     # a windowed Jamba is not modelled: report the key
    types = r.get("layers_block_type", None, kind=list, nullable=True)
    if types is None:
        period, offset = r.count("attn_layer_period", 8), r.get("attn_layer_offset", 4)
        types = ["attention" if i % period == offset else "mamba" for i in range(n)]
    if len(types) != n or not set(types) <= {"attention", "mamba"}:
        raise r.fail(f"layers_block_type must list 'attention' or 'mamba' for each of the {n} layers")
    experts = r.get("layers_num_experts", None, kind=list, nullable=True)
    if experts is None:
        period, offset = r.count("expert_layer_period", 2), r.get("expert_layer_offset", 1)
        num = r.count("num_experts", 16, bound="experts")
        experts = [num if i % period == offset else 1 for i in range(n)]
    if len(experts) != n:
        raise r.fail(f"layers_num_experts has {len(experts)} entries but num_hidden_layers is {n}")
    r.mark("num_experts")
    moe_layers = [i for i, e in enumerate(experts) if e > 1]
    if "mamba" in types:
        rank = r.data.get("mamba_dt_rank", "auto")
        r.mark("mamba_dt_rank")
        if rank == "auto":
            rank = -(-h // 16)          # JambaConfig: math.ceil(hidden_size / 16)
        elif not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise r.fail(f"key 'mamba_dt_rank' must be a positive integer or \"auto\", got {rank!r}")
        if r.get("mamba_proj_bias", False, kind=bool):
            r.used.discard("mamba_proj_bias")    # in/out projection biases are not modelled: report the key
        r.mark("mamba_conv_bias")                # the convolution bias is counted (Mamba1.other_params)
        f["mixers"] = {"mamba": dict(kind=Mamba1.kind, inner_size=r.count("mamba_expand", 2) * h,
                                     state_size=r.count("mamba_d_state", 16), conv_kernel=r.count("mamba_d_conv", 4),
                                     dt_rank=rank, bc_norms=True)}
    f["layer_pattern"] = _shortest_period(types)      # one Jamba block of attn_layer_period layers
    if moe_layers:
        if len({e for e in experts if e > 1}) != 1:
            raise r.fail(f"layers_num_experts {experts}: MoE layers with different expert counts are not modelled")
        first_dense, interval = _moe_from_lists(r, n, moe_layers, "expert_layer_period / expert_layer_offset")
        f["moe"] = dict(num_experts=experts[moe_layers[0]], top_k=r.get("num_experts_per_tok"),
                        expert_ffn_hidden_size=f["ffn_hidden_size"], first_dense_layers=first_dense,
                        moe_layer_interval=interval)
    else:
        r.mark("num_experts_per_tok")
    return f


def _falcon_h1(r: _Reader) -> dict[str, Any]:
    """Falcon-H1 (transformers FalconH1Config / modeling_falcon_h1.py): every layer runs softmax attention (GQA,
    RoPE, ``head_dim``) and a Mamba-2 mixer (``FalconH1Mixer``: d_ssm = mamba_d_ssm or mamba_expand·h channels in
    mamba_n_heads heads of mamba_d_head, mamba_n_groups groups, state mamba_d_state, conv mamba_d_conv) side by side
    on the same normed input, outputs summed; then a SwiGLU MLP. The µP multipliers are constants (ignored).
    Counted although absent when ``mamba_rms_norm`` is false: the Mamba-2 gated norm, d_ssm weights per layer
    (< 0.01 %)."""
    f = _base(r, kv_required=True)
    f["ffn_hidden_size"] = r.get("intermediate_size")
    h = f["hidden_size"]
    for key in ("attention_bias", "mlp_bias", "projectors_bias", "mamba_proj_bias"):
        if r.get(key, False, kind=bool):
            r.used.discard(key)                  # biases on these projections are not modelled: report the key
    d_ssm = r.get("mamba_d_ssm", None, nullable=True)
    if d_ssm is None:
        d_ssm = r.count("mamba_expand", 2) * h
    r.mark("mamba_expand")
    heads = r.count("mamba_n_heads", bound="heads")
    head_dim = r.data.get("mamba_d_head", "auto")
    r.mark("mamba_d_head")
    if head_dim == "auto":
        head_dim = d_ssm // heads
    if not isinstance(head_dim, int) or isinstance(head_dim, bool) or heads * head_dim != d_ssm:
        raise r.fail(f"mamba_n_heads·mamba_d_head = {heads}·{head_dim!r} must equal the SSM width {d_ssm} "
                     "(mamba_d_ssm, or mamba_expand·hidden_size)")
    r.mark("mamba_conv_bias", "mamba_rms_norm", "mamba_norm_before_gate")
    f["mixers"] = {"mamba": dict(kind=Mamba2.kind, num_heads=heads, head_dim=head_dim,
                                 state_size=r.count("mamba_d_state"), n_groups=r.count("mamba_n_groups", 1),
                                 conv_kernel=r.count("mamba_d_conv", 4), chunk_size=r.count("mamba_chunk_size", 256))}
    f["layer_pattern"] = ["attention+mamba"]
    return f


def _phi3(r: _Reader) -> dict[str, Any]:
    """Phi-3 / Phi-4 (transformers Phi3Config / modeling_phi3.py): the Llama shape with Q/K/V packed into one
    ``qkv_proj`` and gate/up into one ``gate_up_proj`` (same weights, same FLOPs as separate projections). Phi-4
    (microsoft/phi-4) has no sliding window (``sliding_window`` null); Phi-3-mini's 2047-token window on every
    layer is read like Mistral's. ``partial_rotary_factor`` (Phi-4-mini) has no weights."""
    f = _llama_like(r, kv_required=False)
    f.update(_window(r, f["num_layers"], all_layers_key=True))
    r.mark("original_max_position_embeddings", "resid_pdrop")
    return f


def _smollm3(r: _Reader) -> dict[str, Any]:
    """SmolLM3 (transformers SmolLM3Config): the Llama shape (GQA, SwiGLU, tied embeddings by default) with RoPE
    left out on every ``no_rope_layer_interval``-th layer (``no_rope_layers``: no weights, ignored)."""
    f = _llama_like(r, kv_required=True)
    f["tie_embeddings"] = r.get("tie_word_embeddings", True, kind=bool)
    f.update(_window(r, f["num_layers"], all_layers_key=False))
    return f


def _minimax_m2(r: _Reader) -> dict[str, Any]:
    """MiniMax-M2 (MiniMaxAI's configuration_minimax_m2.py / transformers MiniMaxM2Config): GQA attention with an
    explicit ``head_dim`` (48 heads of 128 on a 3072-wide model), Q/K RMSNorm, every layer a MoE of
    ``num_local_experts`` SwiGLU experts of width ``intermediate_size``, sigmoid routing, no shared expert;
    ``num_mtp_modules`` multi-token prediction modules when ``use_mtp``. The routing bias (E per layer) is below
    0.01 % and not counted."""
    f = _base(r, kv_required=True, head_dim_required=True)
    width = r.get("intermediate_size")
    f["ffn_hidden_size"] = width
    if r.get("attention_bias", False, kind=bool):
        f["qkv_bias"] = True
    shared = r.get("shared_intermediate_size", 0)
    f["moe"] = dict(num_experts=r.get("num_local_experts"), top_k=r.get("num_experts_per_tok"),
                    expert_ffn_hidden_size=width, num_shared_experts=1 if shared else 0,
                    shared_expert_ffn_hidden_size=shared or None)
    use_mtp = r.get("use_mtp", False, kind=bool)
    modules = r.get("num_mtp_modules", 0)
    per_module = r.get("mtp_transformer_layers", 1)
    f["mtp_layers"] = modules * per_module if use_mtp else 0
    f.update(_window(r, f["num_layers"], all_layers_key=False))
    r.mark("rotary_dim", "use_routing_bias", "qk_norm_type", "attn_type_list", "layernorm_full_attention_beta",
           "layernorm_full_attention_alpha", "layernorm_mlp_alpha", "layernorm_mlp_beta",
           "layernorm_linear_attention_alpha", "layernorm_linear_attention_beta", "full_attn_alpha_factor",
           "full_attn_beta_factor", "linear_attn_alpha_factor", "linear_attn_beta_factor", "mlp_alpha_factor",
           "mlp_beta_factor", "postnorm", "use_gradient_checkpointing", "block_size", "head_dim_rope")
    return f


def _bailing_moe(r: _Reader) -> dict[str, Any]:
    """Ling / Ring (inclusionAI's configuration_bailing_moe.py and configuration_bailing_moe_v2.py, both
    ``model_type`` bailing_moe): GQA, SwiGLU experts of ``moe_intermediate_size``, ``num_shared_experts`` always-on
    shared experts (each of ``moe_shared_expert_intermediate_size``, else of the routed width: BailingMoeV2 sizes
    the shared block as ``moe_intermediate_size * num_shared_experts``), ``first_k_dense_replace`` leading dense
    layers of ``intermediate_size``; v2 adds Q/K norms (``use_qk_norm``), sigmoid group routing and
    ``num_nextn_predict_layers`` MTP layers. ``use_qkv_bias`` puts biases on Q/K/V."""
    f = _base(r, kv_required=True)
    f["ffn_hidden_size"] = r.get("intermediate_size")
    if r.get("use_qkv_bias", False, kind=bool):
        f["qkv_bias"] = True
    if r.get("use_bias", False, kind=bool):
        r.used.discard("use_bias")    # biases on every linear layer are not modelled: report the key
    expert = r.get("moe_intermediate_size")
    shared = r.get("num_shared_experts", 0, nullable=False)
    f["moe"] = dict(num_experts=r.get("num_experts"), top_k=r.get("num_experts_per_tok"),
                    expert_ffn_hidden_size=expert, num_shared_experts=shared,
                    shared_expert_ffn_hidden_size=r.get("moe_shared_expert_intermediate_size", None, nullable=True),
                    first_dense_layers=r.get("first_k_dense_replace", 0))
    f["mtp_layers"] = r.get("num_nextn_predict_layers", 0)
    r.mark("norm_head", "norm_softmax", "embedding_dropout", "output_dropout", "use_rmsnorm", "score_function",
           "moe_router_enable_expert_bias", "router_dtype", "use_qk_norm", "mtp_loss_scaling_factor")
    return f


def _ernie4_5_moe(r: _Reader) -> dict[str, Any]:
    """ERNIE 4.5 MoE (transformers Ernie4_5_MoeConfig / baidu's configuration_ernie4_5_moe.py): GQA, SwiGLU
    experts; layer i is MoE when moe_layer_start_index <= i <= moe_layer_end_index (default: the last layer) and
    (i - start) % moe_layer_interval == 0, else a dense SwiGLU MLP of ``intermediate_size``;
    ``moe_num_shared_experts`` shared experts of the routed width. ``use_bias`` puts biases on every linear layer
    (not modelled; reported)."""
    f = _base(r, kv_required=True)
    f["ffn_hidden_size"] = r.get("intermediate_size")
    f["tie_embeddings"] = r.get("tie_word_embeddings", True, kind=bool)
    if r.get("use_bias", False, kind=bool):
        r.used.discard("use_bias")
    n = f["num_layers"]
    start = r.get("moe_layer_start_index", 1)
    end = r.get("moe_layer_end_index", None, nullable=True)
    end = n - 1 if end is None or end < 0 else end
    interval = r.count("moe_layer_interval", 1)
    moe_layers = [i for i in range(n) if start <= i <= end and (i - start) % interval == 0]
    first_dense, every = _moe_from_lists(r, n, moe_layers, "moe_layer_start_index / moe_layer_end_index / "
                                         "moe_layer_interval")
    f["moe"] = dict(num_experts=r.get("moe_num_experts"), top_k=r.get("moe_k"),
                    expert_ffn_hidden_size=r.get("moe_intermediate_size"),
                    num_shared_experts=r.get("moe_num_shared_experts", 0, nullable=False),
                    first_dense_layers=first_dense, moe_layer_interval=every)
    f["mtp_layers"] = r.get("num_nextn_predict_layers", 0)
    r.mark("moe_gate_act", "moe_capacity", "moe_gate", "moe_use_aux_free", "moe_norm_min", "use_rmsnorm",
           "compression_ratio", "fuse_rms_norm", "use_flash_attention", "multi_token_pred_lambda",
           "enable_mtp_magic_send")
    return f


def _refuse(why: str):
    def family(r: _Reader) -> dict[str, Any]:
        raise r.fail(why)
    return family


_FAMILIES = {
    "llama": _llama, "mistral": _mistral, "mixtral": _mixtral, "qwen2": _qwen2, "qwen2_moe": _qwen2_moe,
    "qwen3": _qwen3, "qwen3_moe": _qwen3_moe, "olmoe": _olmoe, "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek, "deepseek_v32": _deepseek, "kimi_k2": _deepseek, "glm4_moe": _glm4_moe,
    "gpt_oss": _gpt_oss,
    "llama4_text": _llama4_text, "qwen3_next": _qwen3_next, "nemotron_h": _nemotron_h, "gemma3_text": _gemma3_text,
    "kimi_linear": _kimi_linear, "jamba": _jamba, "falcon_h1": _falcon_h1, "phi3": _phi3, "smollm3": _smollm3,
    "minimax_m2": _minimax_m2, "bailing_moe": _bailing_moe, "ernie4_5_moe": _ernie4_5_moe,
}
_REFUSED: dict[str, str] = {}
_WRAPPERS = {"llama4": ("llama4_text", _llama4_text), "gemma3": ("gemma3_text", _gemma3_text)}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted([*_FAMILIES, *_WRAPPERS]))


def model_from_hf_config(data: dict, name: str, where: str) -> tuple[ModelSpec, set[str]]:
    """A ModelSpec from a parsed Hugging Face ``config.json`` and the keys it did not use that could matter.

    ``where`` names the file in every error. Raises :class:`AutoparInputError` for an unsupported or missing
    ``model_type``, a missing required key, a value of the wrong type, a layer pattern autopar cannot model,
    and (through :func:`build_spec`) values the ModelSpec rejects."""
    if not isinstance(data, dict):
        raise AutoparInputError(f"{where}: expected a JSON object, got {type(data).__name__}")
    model_type = data.get("model_type")
    if model_type is None:
        arch = data.get("architectures")
        hint = f" (architectures: {arch})" if arch else ""
        raise AutoparInputError(f"{where}: required key 'model_type' is missing{hint}; "
                                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    if isinstance(model_type, str) and model_type in _REFUSED:
        raise AutoparInputError(f"{where}: {_REFUSED[model_type]}")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise AutoparInputError(f"{where}: unsupported model_type {model_type!r}; "
                                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    top = _Reader(data, where, model_type)
    top.mark("model_type")
    if model_type in _WRAPPERS:  # multimodal wrapper: the language model is text_config
        text_type, family = _WRAPPERS[model_type]
        text = dict(top.get("text_config", kind=dict))
        if "tie_word_embeddings" in data:  # Llama4Config may carry it at the top level
            top.mark("tie_word_embeddings")
            text.setdefault("tie_word_embeddings", data["tie_word_embeddings"])
        r = _Reader(text, where, text_type, prefix="text_config.")
        r.mark("model_type")
        fields = family(r)
        unmapped = top.unmapped() | r.unmapped()
    else:
        fields = _FAMILIES[model_type](top)
        unmapped = top.unmapped() | _UNMAPPED_SUB.pop(id(top), set())
    fields = dict(name=name, source=f"Hugging Face config.json (model_type {model_type}): {where}", **fields)
    return build_spec(ModelSpec, fields, where), unmapped
