"""Reading a Hugging Face ``config.json``: typed key access that remembers what was used (:class:`_Reader`), the
keys that cannot change what autopar computes (:data:`IGNORED_KEYS`, each group with its reason), and the field
groups many families share (depth and width, the MoE placement, sliding windows, MLA). The families themselves
and the entry point are in :mod:`autopar.specs.hf_config`.
"""

from __future__ import annotations

from typing import Any

from autopar.errors import AutoparInputError
from autopar.specs.bounds import bound_note, limit

# Keys that never change parameter counts, FLOPs or memory as autopar models them. Each group says why.
IGNORED_KEYS: dict[str, str] = {}


def _ignore(reason: str, *keys: str) -> None:
    for key in keys:
        IGNORED_KEYS[key] = reason


_ignore("bookkeeping of the checkpoint or of transformers",
        "architectures", "auto_map", "_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache",
        "return_dict", "output_hidden_states", "output_attentions", "torchscript", "pruned_heads",
        "tie_encoder_decoder", "is_encoder_decoder", "is_decoder", "chunk_size_feed_forward", "id2label",
        "label2id", "problem_type", "tokenizer_class", "prefix", "finetuning_task", "task_specific_params",
        "cross_attention_hidden_size", "add_cross_attention", "_attn_implementation_autoset",
        "_attn_implementation", "pretraining_tp", "for_llm_compressor")
_ignore("special token ids",
        "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
        "boi_token_index", "eoi_token_index", "image_token_index")
_ignore("generation defaults (inference only)",
        "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
        "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
        "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
        "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
        "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
        "suppress_tokens", "begin_suppress_tokens")
_ignore("initialisation and regularisation (no effect on shapes)",
        "rescale_prenorm_residual", "time_step_min", "time_step_max", "time_step_floor", "time_step_limit",
        "initializer_range", "attention_dropout", "hidden_dropout", "embd_pdrop", "resid_pdrop",
        "router_aux_loss_coef", "aux_loss_alpha", "seq_aux", "output_router_logits", "router_z_loss_coef",
        "router_jitter_noise")
_ignore("normalisation epsilon", "rms_norm_eps", "layer_norm_eps", "norm_eps", "layer_norm_epsilon")
_ignore("position encoding without weights (RoPE variants, NoPE layers)",
        "rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor", "rope_interleave",
        "no_rope_layers", "no_rope_layer_interval", "initial_context_length")
_ignore("activation function: the MLP shape (gated or not) is fixed by the architecture family",
        "hidden_act", "mlp_hidden_act", "mamba_hidden_act")
_ignore("inference or kernel settings (no effect on training shapes or FLOPs)",
        "num_logits_to_keep", "use_mamba_kernels", "mamba_ssm_cache_dtype", "residual_in_fp32")
_ignore("routing rule or activation clamp, no weights",
        "norm_topk_prob", "n_group", "topk_group", "topk_method", "scoring_func", "routed_scaling_factor",
        "ep_size", "swiglu_limit", "clip_qkv")
_ignore("attention scaling without weights (Llama 4 temperature tuning, L2 Q/K norm)",
        "attn_temperature_tuning", "floor_scale", "attn_scale")
_ignore("Q/K RMSNorm scales: 2·d weights per layer, below 0.01 % of any supported model",
        "use_qk_norm")
_ignore("µP scalar multipliers (Falcon-H1): constants on activations, no weights, elementwise FLOPs only",
        "lm_head_multiplier", "embedding_multiplier", "mlp_multipliers", "key_multiplier",
        "attention_out_multiplier", "attention_in_multiplier", "ssm_multipliers", "ssm_in_multiplier",
        "ssm_out_multiplier")

_REQUIRED = object()
_KINDS = {int: "an integer", bool: "true or false", list: "a list", dict: "a mapping", str: "a string"}


class _Reader:
    """Reads keys from one config mapping, checks their types, and remembers which keys were used."""

    def __init__(self, data: dict, where: str, family: str, prefix: str = ""):
        self.data, self.where, self.family, self.prefix = data, where, family, prefix
        self.used: set[str] = set()

    def get(self, key: str, default: Any = _REQUIRED, kind: type = int, nullable: bool = False) -> Any:
        self.used.add(key)
        if key not in self.data:
            if default is _REQUIRED:
                raise AutoparInputError(
                    f"{self.where}: required key '{self.prefix}{key}' is missing "
                    f"(needed for model_type '{self.family}')")
            return default
        value = self.data[key]
        if value is None:
            if nullable:
                return None
            if default is not _REQUIRED:
                return default
            raise AutoparInputError(f"{self.where}: key '{self.prefix}{key}' is null; expected {_KINDS[kind]}")
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is int and isinstance(value, float) and value.is_integer():
            value, ok = int(value), True
        if not ok:
            raise AutoparInputError(
                f"{self.where}: key '{self.prefix}{key}' must be {_KINDS[kind]}, got {value!r}")
        return value

    def count(self, key: str, default: Any = _REQUIRED, bound: str | None = None) -> int:
        """A positive whole number (a size, a layer step), at most autopar's ``bound`` (see specs/bounds.py)."""
        value = self.get(key, default)
        if value < 1:
            raise self.fail(f"key '{self.prefix}{key}' must be at least 1, got {value}")
        if bound is not None and value > limit(bound):
            raise self.fail(f"key '{self.prefix}{key}' = {value:,}: autopar's bound {bound_note(bound)}")
        return value

    def layer_list(self, key: str, default: Any = _REQUIRED, nullable: bool = False) -> list[int] | None:
        """A list of 0-based layer indices."""
        value = self.get(key, default, kind=list, nullable=nullable)
        if value is not None and not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
            raise self.fail(f"key '{self.prefix}{key}' must be a list of layer numbers, got {value!r:.80}")
        return value

    def mark(self, *keys: str) -> None:
        """Declare keys as consumed (their meaning is fixed by the family or checked elsewhere)."""
        self.used.update(keys)

    def unmapped(self) -> set[str]:
        return {f"{self.prefix}{k}" for k in self.data if k not in self.used and k not in IGNORED_KEYS}

    def fail(self, message: str) -> AutoparInputError:
        return AutoparInputError(f"{self.where}: {message}")


# ---- shared pieces ------------------------------------------------------------------------------------------
def _base(r: _Reader, kv_required: bool, head_dim_required: bool = False) -> dict[str, Any]:
    """Fields every decoder-only config has: depth, width, heads, vocabulary, tying."""
    h = r.count("hidden_size", bound="hidden")
    a = r.count("num_attention_heads", bound="heads")
    kv = r.get("num_key_value_heads") if kv_required else r.get("num_key_value_heads", None, nullable=True)
    head_dim = r.get("head_dim") if head_dim_required else r.get("head_dim", None, nullable=True)
    if head_dim is not None and h % a == 0 and head_dim == h // a:
        head_dim = None  # the default; keeps specs from different sources identical
    fields: dict[str, Any] = dict(
        num_layers=r.count("num_hidden_layers", bound="layers"), hidden_size=h, num_attention_heads=a,
        num_kv_heads=None if kv in (None, a) else kv, head_dim=head_dim,
        vocab_size=r.get("vocab_size"), tie_embeddings=r.get("tie_word_embeddings", False, kind=bool),
        gated_mlp=True, norm="rmsnorm", position_embedding="rope")
    max_pos = r.get("max_position_embeddings", None, nullable=True)
    if max_pos is not None:
        fields["max_position_embeddings"] = max_pos
    return fields


def _moe_from_lists(r: _Reader, num_layers: int, moe_layers: list[int], what: str) -> tuple[int, int]:
    """(first_dense_layers, moe_layer_interval) reproducing exactly the 0-based MoE layer list ``moe_layers``
    under ModelSpec.is_moe_layer: layer i is MoE iff i >= first_dense and (i - first_dense + 1) % interval == 0."""
    if not moe_layers:
        raise r.fail(f"{what}: no layer is an MoE layer; a dense model should not carry expert keys")
    first = moe_layers[0]
    for interval in range(1, first + 2):
        first_dense = first - interval + 1
        expected = [i for i in range(num_layers) if i >= first_dense and (i - first_dense + 1) % interval == 0]
        if expected == list(moe_layers):
            return first_dense, interval
    raise r.fail(f"{what}: MoE layers {list(moe_layers)} of {num_layers} do not follow the pattern autopar "
                 "models (k leading dense layers, then every n-th layer MoE)")


def _window(r: _Reader, num_layers: int, all_layers_key: bool,
            default_types: list[str] | None = None) -> dict[str, Any]:
    """Sliding-window fields from ``layer_types`` (or the family's default list of it), else ``sliding_window`` on
    every layer (``all_layers_key``: Mistral) or Qwen's ``use_sliding_window`` / ``max_window_layers``."""
    types = r.get("layer_types", default_types, kind=list, nullable=True)
    window = r.get("sliding_window", None, nullable=True)
    use = r.get("use_sliding_window", None, kind=bool, nullable=True)
    max_window_layers = r.get("max_window_layers", None, nullable=True)
    if types is not None:
        if len(types) != num_layers:
            raise r.fail(f"layer_types has {len(types)} entries but num_hidden_layers is {num_layers}")
        windowed = [t == "sliding_attention" for t in types]
        unknown = sorted({str(t) for t in types if t not in ("sliding_attention", "full_attention")})
        if unknown:
            raise r.fail(f"layer_types: unsupported attention type(s) {unknown} "
                         "(autopar models 'full_attention' and 'sliding_attention')")
    elif use is not None:  # Qwen2/Qwen3: layers from max_window_layers on use the window, if enabled
        if not use:
            return {}
        start = max_window_layers or 0
        windowed = [i >= start for i in range(num_layers)]
    elif window is not None and all_layers_key:
        windowed = [True] * num_layers
    else:
        return {}
    if not any(windowed):
        return {}
    if window is None:
        raise r.fail("some layers use sliding-window attention but 'sliding_window' is not set")
    if all(windowed):
        return dict(sliding_window=window, sliding_window_every=0)
    for every in range(2, num_layers + 1):
        if windowed == [(i + 1) % every != 0 for i in range(num_layers)]:
            return dict(sliding_window=window, sliding_window_every=every)
    raise r.fail("the pattern of sliding-window layers is not 'every n-th layer global'; autopar cannot model it")


def _mla(r: _Reader) -> dict[str, Any]:
    return dict(q_lora_rank=r.get("q_lora_rank", None, nullable=True), kv_lora_rank=r.get("kv_lora_rank"),
                qk_nope_head_dim=r.get("qk_nope_head_dim"), qk_rope_head_dim=r.get("qk_rope_head_dim"),
                v_head_dim=r.get("v_head_dim"))
