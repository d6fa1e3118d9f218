"""Scaling a ModelSpec down to fit the machine at hand (torch-free, so the CLI can use it cheaply).

Re-exported as ``autopar.run.model.scale_model``.
"""

from __future__ import annotations

import math

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
    to ``layers``. Hybrid models: linear-attention / SSM mixers keep their head dims and state size and scale
    their width (heads; Mamba-1's inner width, Δ rank and gate ranks) with ``hidden``; fewer ``layers`` keep
    the mix of layer kinds (:func:`_sample_patterns`). Divisibility by the layout's degrees is checked later by ``resolve_layout``."""
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
    if layers is not None and model.layer_pattern is not None and layers < model.num_layers:
        upd.update(_sample_patterns(model, layers))
    if model.mixers and hidden is not None and hidden != model.hidden_size:
        upd["mixers"] = {name: _scale_mixer(mx, hidden / model.hidden_size)
                         for name, mx in upd.get("mixers", model.mixers).items()}
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


def scale_notes(model: ModelSpec, scaled: ModelSpec) -> list[str]:
    """What scaling changed beyond the sizes asked for, said to the user: a routed top-k clamped to fewer experts
    (top-8 of 4 experts cannot route 8), multi-token prediction layers left out."""
    notes = []
    if model.moe is not None and scaled.moe is not None and scaled.moe.top_k < model.moe.top_k:
        notes.append(f"routing is top-{scaled.moe.top_k} in the scaled model, not {model.name}'s "
                     f"top-{model.moe.top_k}: it has only {scaled.moe.num_experts} experts")
    if model.mtp_layers and not scaled.mtp_layers:
        notes.append(f"the scaled model leaves out {model.name}'s {model.mtp_layers} multi-token prediction layer(s)")
    return notes


def _scale_mixer(mx, r: float):
    """A linear-attention / SSM mixer with its width scaled by r (heads, keeping d_k, d_v, N and the chunk)."""
    if mx.kind == "attention":
        return mx
    upd: dict = {}
    if mx.kind == "mamba1":
        upd["inner_size"] = max(1, round(mx.inner_size * r))
        upd["dt_rank"] = max(1, round(mx.dt_rank * r))
    else:
        heads = max(1, round(mx.num_heads * r))
        if mx.num_heads & (mx.num_heads - 1) == 0:       # a power of two stays one (TP degrees divide it)
            heads = 1 << max(0, round(math.log2(mx.num_heads * r)))
        if mx.kind == "gated_deltanet" and mx.num_value_heads:
            per = mx.num_value_heads // mx.num_heads       # value heads per key head, kept
            upd["num_value_heads"] = heads * per
        if mx.kind == "mamba2":
            groups = min(mx.n_groups, heads)
            while heads % groups:
                groups -= 1
            upd["n_groups"] = groups
        upd["num_heads"] = heads
        if mx.gate_low_rank:
            upd["gate_low_rank"] = max(1, round(mx.gate_low_rank * r))
    return mx.model_copy(update=upd)


def _sample_patterns(model: ModelSpec, layers: int) -> dict:
    """layer_pattern / mlp_pattern of a ``layers``-layer model with the mix of the full pattern's layer kinds (a
    kind = its mixer and channel entries): largest-remainder shares, and every kind at least one layer where
    there are layers enough; the layers are then taken in the full pattern's order. Mixers no layer uses are
    dropped."""
    n = model.num_layers
    mlp = model.mlp_pattern
    full = [(model.layer_pattern[i % len(model.layer_pattern)], mlp[i % len(mlp)] if mlp else None) for i in range(n)]
    counts: dict = {}
    for k in full:
        counts[k] = counts.get(k, 0) + 1
    kinds = list(counts)
    share = {k: layers * counts[k] / n for k in kinds}
    quota = {k: int(share[k]) for k in kinds}
    for k in sorted(kinds, key=lambda k: share[k] - quota[k], reverse=True)[:layers - sum(quota.values())]:
        quota[k] += 1
    for k in sorted(kinds, key=lambda k: -counts[k]):     # a kind left out takes a layer from the largest one
        if quota[k] == 0 and sum(1 for v in quota.values() if v) < layers:
            quota[max(kinds, key=lambda j: quota[j])] -= 1
            quota[k] = 1
    picked: list = []
    i = 0
    while len(picked) < layers:
        k = full[i % n]
        if quota.get(k, 0) > 0:
            quota[k] -= 1
            picked.append(k)
        i += 1
    out: dict = {"layer_pattern": tuple(k[0] for k in picked)}
    if mlp is not None:
        out["mlp_pattern"] = tuple(k[1] for k in picked)
    used = {name for entry in out["layer_pattern"] for name in entry.split("+")}
    out["mixers"] = {name: mx for name, mx in model.mixers.items() if name in used}
    return out
