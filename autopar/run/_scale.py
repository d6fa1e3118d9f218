"""Scaling a ModelSpec down to fit the machine at hand (torch-free, so the CLI can use it cheaply).

Re-exported as ``autopar.run.model.scale_model``.
"""

from __future__ import annotations

from pydantic import ValidationError

from autopar.errors import AutoparInputError
from autopar.specs.loaders import format_validation_error
from autopar.specs.model import ModelSpec


def scale_model(model: ModelSpec, *, layers: int | None = None, hidden: int | None = None,
                ffn: int | None = None, heads: int | None = None, kv_heads: int | None = None,
                experts: int | None = None, vocab: int | None = None) -> ModelSpec:
    """A smaller model of the same architecture (norm, gating, GQA ratio, MoE/MLA kind, biases kept).

    ``ffn`` sets the dense FFN width AND the routed/shared expert width. When ``hidden`` or ``heads``
    changes, the head dim becomes hidden / heads (MLA head dims are scaled by the same ratio). ``experts``
    sets the routed expert count (top_k is clamped to it). Leading dense MoE layers are scaled in proportion
    to ``layers``. Divisibility by the layout's degrees is checked later by ``resolve_layout``."""
    given = {"num_layers": layers, "vocab_size": vocab, "ffn_hidden_size": ffn, "hidden_size": hidden,
             "num_attention_heads": heads, "num_kv_heads": kv_heads}
    upd: dict = {"name": f"{model.name}_scaled", "mtp_layers": 0,
                 **{field: v for field, v in given.items() if v is not None}}
    if kv_heads is None and heads is not None and model.num_kv_heads is not None:
        # keep the GQA ratio a/g
        ratio = model.num_attention_heads // model.kv_heads
        upd["num_kv_heads"] = max(1, heads // ratio)
    if hidden is not None or heads is not None:
        upd["head_dim"] = None
        if model.mla is not None:
            # MLA head dims scale with h/a (DeepSeek's are larger than h/a; the proportion is kept).
            r = ((hidden or model.hidden_size) / (heads or model.num_attention_heads)) \
                / (model.hidden_size / model.num_attention_heads)
            m = model.mla
            upd["mla"] = m.model_copy(update={
                "q_lora_rank": None if m.q_lora_rank is None else max(1, round(m.q_lora_rank * r)),
                "kv_lora_rank": max(1, round(m.kv_lora_rank * r)),
                "qk_nope_head_dim": max(1, round(m.qk_nope_head_dim * r)),
                "qk_rope_head_dim": max(2, 2 * round(m.qk_rope_head_dim * r / 2)),
                "v_head_dim": max(1, round(m.v_head_dim * r))})
    if model.moe is not None:
        m = model.moe
        mu: dict = {}
        if experts is not None:
            mu["num_experts"] = experts
            mu["top_k"] = min(m.top_k, experts)
        if ffn is not None:
            mu["expert_ffn_hidden_size"] = ffn
            mu["shared_expert_ffn_hidden_size"] = None
        if layers is not None:
            mu["first_dense_layers"] = min(layers - 1, m.first_dense_layers * layers // model.num_layers)
        upd["moe"] = m.model_copy(update=mu)
    data = model.model_dump()
    data.update({k: (v.model_dump() if hasattr(v, "model_dump") else v) for k, v in upd.items()})
    try:
        return ModelSpec.model_validate(data)
    except ValidationError as err:
        raise AutoparInputError(f"cannot scale {model.name}: " + format_validation_error(err, "scaled model")) \
            from None
