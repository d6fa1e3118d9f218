"""Softmax attention (MHA, GQA, MQA) with its per-layer options: sliding window, chunk, sinks, output gate.

Parameters (Megatron-Core ``SelfAttention``): Q h·a·d, K and V h·g·d each, O a·d·h (+ biases); sinks a (GPT-OSS:
one learned logit per head, arXiv 2508.10925); output gate h·a·d_v (Qwen3-Next ``Qwen3NextAttention``: a sigmoid
gate projected from the hidden state). Biases and sinks are counted as GEMM weights (below 0.01 %).

Causal attention is counted **once per unmasked score**: the QK^T and AV products of a token at position i
touch i keys, so over a sequence of length s the average context is s/2 (FlashAttention's causal kernels skip the
masked half; Megatron-Core's ``num_floating_point_operations`` after 2024). A sliding window w gives
min(w, s/2); chunked attention (Llama 4: a token sees the earlier tokens of its chunk of c) gives c/2 when c < s.

GEMMs: Megatron-Core fuses Q, K and V into one column-parallel GEMM h -> (a + 2g)·d (``linear_qkv``, a Transformer
Engine ``TELayerNormColumnParallelLinear``; megatron/core/transformer/attention.py SelfAttention), then O a·d -> h
row-parallel. A stack with separate projections (``TrainingSpec.projections``; torchtitan's ``wq``, ``wk``, ``wv``)
launches Q h -> a·d, K and V h -> g·d each: the same FLOPs in three GEMMs whose N is smaller (K and V under GQA at
TP 8: g·d/8, 128 for Llama 3), priced each at its own shape by the kernel model (autopar.cost.kernels). MLA's
projections (autopar.blocks.mla) are separate GEMMs in both stacks.

Memory-bound kernels (elements per token, forward and backward, one HBM pass per kernel; Megatron-Core
``megatron/core/transformer``): the sub-block's norm reads x, writes y (2h) and backward reads x, dy, writes dx
(3h); its residual add 3h each way; RoPE on the rotary dims of Q and K reads and writes (a+g)·d each way (Su et
al. 2021, arXiv 2104.09864), and where YaRN scales cos/sin, Megatron-Core's unfused RoPE beyond that
(``rope_unfused``, :data:`ROPE_UNFUSED_EXTRA`). Stored activations (FlashAttention keeps no s x s scores, Dao
et al. 2022, arXiv
2205.14135): Q, K, V (a·d + 2·g·d), the gate's input (a·d_v), the core's output (a·d_v).

Symbols: h hidden, a query heads, g KV heads, d head dim, s sequence length.
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.blocks._base import Block, Linear, Rule, norm_residual


# Megatron-Core's unfused RoPE, what a model whose cos/sin carry a YaRN concentration factor other than 1 runs even
# with apply_rope_fusion on: apply_rotary_pos_emb falls back "mscale=... is not supported by TE's fused RoPE. Using
# unfused implementation." (NVIDIA/Megatron-LM@3f6a2ed8 megatron/core/models/common/embeddings/rope_utils.py lines
# 279-284, added for gpt-oss in 98739581, 2025-11-22; attention.py passes _yarn_get_concentration_factor_from_config,
# 0.1·ln(32) + 1 = 1.347 for gpt-oss, whose bridge sets yarn_mscale None: NVIDIA-NeMo/Megatron-Bridge@v0.4.1
# src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py). _apply_rotary_pos_emb_bshd, per element of the rotary width
# r = (a+g)·d, one HBM pass per PyTorch kernel (cos/sin are s x d, negligible): forward t·cos (2), rotate_half's
# negation of one half (1) and cat (2), ·sin (2), the sum (3), the final cat with the empty pass-through part (2) = 12
# against the fused kernel's 2 -> 10; backward: ·sin (2), the negation (1), the chunk's cat of the half gradients
# (2), ·cos (2), autograd's sum of t's two gradients (3) = 10 against 2 -> 8. Megatron-Core's stack only (an eager
# stack's own RoPE is priced by autopar.cost.compute.ELEMENTWISE_BYTES).
ROPE_UNFUSED_EXTRA = (10.0, 8.0)


@dataclass(frozen=True)
class Attention(Block):
    kind = "attention"
    title = "softmax attention (GQA/MQA/MHA, or MLA when the model sets mla; window, chunk, sinks, output gate)"
    source = "Megatron-Core SelfAttention; FlashAttention arXiv 2205.14135"
    keeps_kv = True

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    qkv_bias: bool = False
    linear_bias: bool = False
    rope: bool = True
    rope_mscale: float = 1.0        # ModelSpec.rope_mscale: other than 1, Megatron-Core's RoPE runs unfused
    window: int | None = None
    chunk: int | None = None
    sinks: bool = False
    output_gate: bool = False

    @classmethod
    def from_spec(cls, model, mixer=None) -> "Attention":
        """From a ModelSpec's attention fields and, optionally, an attention MixerSpec's options."""
        return cls(hidden=model.hidden_size, heads=model.num_attention_heads, kv_heads=model.kv_heads,
                   head_dim=model.dim_per_head, qkv_bias=model.qkv_bias, linear_bias=model.linear_bias,
                   rope=model.position_embedding == "rope", rope_mscale=model.rope_mscale, **_options(mixer))

    @classmethod
    def field_problem(cls, spec) -> str | None:
        """Why a MixerSpec of this kind is malformed (None = it is not): heads and dims are the model's."""
        extra = [f for f in ("num_heads", "num_value_heads", "head_dim", "value_head_dim", "gate_low_rank",
                             "state_size") if getattr(spec, f) is not None]
        if extra:
            return f"attention mixers use the model's heads and dims; unset {extra}"
        if spec.window and spec.chunk:
            return "an attention mixer has a window or a chunk, not both"
        return None

    # ---- shape ----
    @property
    def qk_dim(self) -> int:
        """Per-head Q·K dot-product width."""
        return self.head_dim

    @property
    def v_dim(self) -> int:
        return self.head_dim

    def projection_params(self) -> int:
        """Q, K, V and O weights (+ biases), without this layer's sinks and gate."""
        h, a, g, d = self.hidden, self.heads, self.kv_heads, self.head_dim
        qkv = h * (a + 2 * g) * d
        if self.qkv_bias or self.linear_bias:
            qkv += (a + 2 * g) * d
        out = a * d * h + (h if self.linear_bias else 0)
        return qkv + out

    def params(self) -> int:
        a = self.heads
        return (self.projection_params() + (a if self.sinks else 0)
                + (self.hidden * a * self.v_dim if self.output_gate else 0))

    def gemm_params(self) -> int:
        return self.params()

    def kv_params(self) -> float:
        return 2.0 * self.hidden * self.kv_heads * self.head_dim

    # ---- FLOPs ----
    def context(self, seq_len: int) -> float:
        """Average number of keys a query attends to: causal s/2, window min(w, s/2), chunk min(c/2, s/2)."""
        ctx = seq_len / 2
        if self.window is not None:
            ctx = min(float(self.window), ctx)
        if self.chunk is not None:
            ctx = min(self.chunk / 2, ctx)
        return ctx

    def span(self, seq_len: int) -> float:
        """Longest key span of one query (s, the window or the chunk): sets the flash kernel's tile count."""
        span = self.window or self.chunk
        return float(min(span, seq_len)) if span else float(seq_len)

    def attention_core_flops(self, seq_len: int) -> float:
        """QK^T and AV: 2·ctx·a·d_qk + 2·ctx·a·d_v."""
        return 2.0 * self.context(seq_len) * self.heads * (self.qk_dim + self.v_dim)

    # ---- kernels ----
    def _projections(self) -> list[Linear]:
        h, a, g, d = self.hidden, self.heads, self.kv_heads, self.head_dim
        return [Linear(h, (a + 2 * g) * d, "col", "attn"), Linear(a * d, h, "row", "attn")]

    def _separate_projections(self) -> list[Linear]:
        """Q, K, V as three GEMMs on one input (torchtitan@9dec370 torchtitan/models/llama/model.py Attention: wq
        h -> a·d, wk and wv h -> g·d, each an ``nn.Linear``), then O."""
        h, a, g, d = self.hidden, self.heads, self.kv_heads, self.head_dim
        return [Linear(h, a * d, "col", "attn"), Linear(h, g * d, "col", "attn", shares_input=True),
                Linear(h, g * d, "col", "attn", shares_input=True), Linear(a * d, h, "row", "attn")]

    def _gate(self) -> list[Linear]:
        return [Linear(self.hidden, self.heads * self.v_dim, "col", "attn")] if self.output_gate else []

    def gemms(self) -> tuple[Linear, ...]:
        return tuple(self._projections() + self._gate())

    def separate_gemms(self) -> tuple[Linear, ...]:
        return tuple(self._separate_projections() + self._gate())

    def rope_width(self) -> int:
        return (self.heads + self.kv_heads) * self.head_dim if self.rope else 0

    def membound(self) -> dict[str, tuple[float, float]]:
        h, r = self.hidden, self.rope_width()
        out = {**norm_residual(h, self.linear_bias), "rope": (2.0 * r, 2.0 * r)}
        if r and self.rope_mscale != 1.0:
            out["rope_unfused"] = (ROPE_UNFUSED_EXTRA[0] * r, ROPE_UNFUSED_EXTRA[1] * r)
        return out

    def _qkv_width(self) -> int:
        """Width of the QKV GEMM's output (the FP8 cast of its result)."""
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    def fp8_cast_width(self) -> int:
        """QKV in (h) and out, O in (a·d_v) and out (h); the output gate's GEMM is not counted."""
        h = self.hidden
        return h + self._qkv_width() + self.heads * self.v_dim + h

    # ---- memory ----
    def _stored_qkv(self) -> dict[str, float]:
        a, g, dq = self.heads, self.kv_heads, self.qk_dim
        return {"qkv": a * dq + 2 * g * dq}

    def stored(self) -> dict[str, float]:
        out = self._stored_qkv()
        if self.output_gate:
            out["qkv"] += self.heads * self.v_dim
        out["attn_out"] = self.heads * self.v_dim
        return out

    def ring_elems(self, tp) -> float:
        """K and V elements per token one TP rank passes around the context-parallel ring (Megatron-Core context
        parallelism): g_local = max(g/tp, 1) KV heads (replicated when fewer than tp), K and V of d each. ``tp`` may
        be a numpy array (elementwise result; the max written as a 0/1 selection, exact for plain numbers)."""
        local = self.kv_heads / tp
        return 2 * (local * (local >= 1) + 1.0 * (local < 1)) * self.head_dim

    # ---- layout ----
    def rules(self) -> tuple[Rule, ...]:
        """Heads split by TP; KV heads fewer than tp are replicated tp/g times (Megatron-LM), so g and tp must
        divide one another."""
        return (Rule("tp", "num_attention_heads", self.heads),
                Rule("tp", "num_kv_heads", self.kv_heads, mutual=True,
                     note=" (KV heads are replicated when fewer than tp)"))


def _options(mixer) -> dict:
    """An attention MixerSpec's per-layer options (none for the model's plain attention)."""
    if mixer is None:
        return {}
    return dict(window=mixer.window, chunk=mixer.chunk, sinks=mixer.sinks, output_gate=mixer.output_gate)
