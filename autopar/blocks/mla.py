"""Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 sec. 2.1, eq. 9-13): low-rank Q and a joint KV latent.

Parameters: W_DQ h·r_q (+ the latent's RMSNorm r_q), W_UQ r_q·a·(d_nope + d_rope) (without r_q: a full h·a·d_qk
Q), W_DKV h·(d_c + d_rope) (+ RMSNorm d_c), W_UKV d_c·a·(d_nope + d_v), O a·d_v·h. The down-projections are
replicated over TP ranks (Megatron-Core ``MLASelfAttention``); the up-projections are recompute module
``mla_up_proj``. RoPE runs on the decoupled rotary dims of a query heads and the one shared key: (a+1)·d_rope.
Stored activations: the two latents, the rotary key, and the up-projected Q, K, V (a·(2·d_qk + d_v), dropped by
``mla_up_proj`` recompute). Window, chunk, sinks and output gate work as for :mod:`autopar.blocks.attention`.

DeepSeek Sparse Attention (DeepSeek-V3.2-Exp, its tech report sec. 2.1; Megatron-Core ``DSAIndexer``,
Megatron-LM@d98e8a64ddf3 megatron/core/transformer/experimental_attention_variant/dsa.py:1090-1330): a
*lightning indexer* next to MLA scores every earlier key with its own small multi-query attention, I(t, s) =
sum_j w_j(t) · ReLU(q_j(t) · k(s)), over H_I index heads of width d_I and ONE shared index key per token, and each
query then attends only to the top-k (``index_topk``) keys it selects. Its weights: W_q^I r_q·H_I·d_I (from MLA's
query latent), W_k^I h·d_I, a LayerNorm on the key (2·d_I), W_w h·H_I; all four ``parallel_mode="duplicated"``
(whole on every TP rank). FLOPs per token: the index scores over all ctx = s/2 causal keys, 2·ctx·H_I·d_I for the
dot products and 2·ctx·H_I for the weighted ReLU sum (priced with the attention core: an approximation, the
indexer runs its own FP8 kernel); MLA's QK^T and AV over min(s/2 ..., k) keys: a query at position t sees min(t, k),
so the mean over a sequence is s/2 when s <= k, else k - k^2/(2s). Stored: the index queries, key and weights
(H_I·d_I + d_I + H_I, with Q, K, V). Not priced: the top-k selection's pass over the scores (memory-bound, a few bytes per key).

Symbols: h hidden, a heads, r_q q_lora_rank, d_c kv_lora_rank, d_nope / d_rope / d_v per-head dims; H_I, d_I, k the
indexer's heads, head width and top-k.
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.blocks._base import Linear, Rule
from autopar.blocks.attention import Attention, _options


@dataclass(frozen=True)
class MLA(Attention):
    kind = "mla"
    title = "multi-head latent attention (MLA)"
    source = "DeepSeek-V2 arXiv 2405.04434 eq. 9-13"

    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    index_heads: int = 0                # DeepSeek Sparse Attention's indexer (0: dense MLA)
    index_head_dim: int = 0
    index_topk: int = 0

    @classmethod
    def from_spec(cls, model, mixer=None) -> "MLA":
        m = model.mla
        ix = m.indexer
        return cls(hidden=model.hidden_size, heads=model.num_attention_heads, kv_heads=model.kv_heads,
                   head_dim=model.dim_per_head, rope=model.position_embedding == "rope",
                   q_lora_rank=m.q_lora_rank, kv_lora_rank=m.kv_lora_rank, qk_nope_head_dim=m.qk_nope_head_dim,
                   qk_rope_head_dim=m.qk_rope_head_dim, v_head_dim=m.v_head_dim,
                   index_heads=ix.n_heads if ix else 0, index_head_dim=ix.head_dim if ix else 0,
                   index_topk=ix.topk if ix else 0, **_options(mixer))

    @property
    def qk_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def v_dim(self) -> int:
        return self.v_head_dim

    def projection_params(self) -> int:
        h, a, r_q, d_c = self.hidden, self.heads, self.q_lora_rank, self.kv_lora_rank
        q_dim = a * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        q = (h * r_q + r_q + r_q * q_dim) if r_q else h * q_dim
        kv = h * (d_c + self.qk_rope_head_dim) + d_c + d_c * a * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv + a * self.v_head_dim * h + self.indexer_params()

    # ---- DeepSeek Sparse Attention's indexer ----
    def indexer_params(self) -> int:
        """W_q^I (r_q·H_I·d_I, from the query latent; h·H_I·d_I without one), W_k^I h·d_I, the key's LayerNorm
        2·d_I, W_w h·H_I."""
        if not self.index_heads:
            return 0
        hi, di, h = self.index_heads, self.index_head_dim, self.hidden
        return (self.q_lora_rank or h) * hi * di + h * di + 2 * di + h * hi

    def context(self, seq_len: int) -> float:
        """Keys a query attends to: with the indexer, the mean over positions t of min(t, k) (s/2 when s <= k,
        else k - k^2/(2s)), before any window or chunk."""
        ctx = super().context(seq_len)
        k = self.index_topk
        if k:
            ctx = min(ctx, seq_len / 2 if seq_len <= k else k - k * k / (2.0 * seq_len))
        return ctx

    def indexer_core_flops(self, seq_len: int) -> float:
        """The index scores over all ctx = s/2 earlier keys: 2·ctx·H_I·d_I (dot products) + 2·ctx·H_I (weighted
        ReLU sum)."""
        if not self.index_heads:
            return 0.0
        return 2.0 * (seq_len / 2) * self.index_heads * (self.index_head_dim + 1)

    def attention_core_flops(self, seq_len: int) -> float:
        """MLA's QK^T and AV over the selected keys, plus the indexer's scores over all keys."""
        return super().attention_core_flops(seq_len) + self.indexer_core_flops(seq_len)

    def kv_params(self) -> float:
        """MLA's K and V come from the latent: nothing is replicated by KV head."""
        return 0.0

    def _projections(self) -> list[Linear]:
        h, a, r_q = self.hidden, self.heads, self.q_lora_rank
        dq = self.qk_dim
        if r_q:
            lin = [Linear(h, r_q, "replicated", "attn"), Linear(r_q, a * dq, "col", "mla_up_proj")]
        else:
            lin = [Linear(h, a * dq, "col", "attn")]
        lin += [Linear(h, self.kv_lora_rank + self.qk_rope_head_dim, "replicated", "attn"),
                Linear(self.kv_lora_rank, a * (self.qk_nope_head_dim + self.v_head_dim), "col", "mla_up_proj"),
                Linear(a * self.v_head_dim, h, "row", "attn")]
        if self.index_heads:     # the indexer's projections, whole on every TP rank (Megatron-Core DSAIndexer)
            hi, di = self.index_heads, self.index_head_dim
            lin += [Linear(r_q or h, hi * di, "replicated", "attn"), Linear(h, di, "replicated", "attn"),
                    Linear(h, hi, "replicated", "attn")]
        return lin

    def _separate_projections(self) -> list[Linear]:
        """MLA's projections are separate GEMMs in Megatron-Core and torchtitan alike (wq_a/wq_b, wkv_a/wkv_b, wo)."""
        return self._projections()

    def rope_width(self) -> int:
        return (self.heads + 1) * self.qk_rope_head_dim

    def _qkv_width(self) -> int:
        return self.heads * self.qk_dim

    def _stored_qkv(self) -> dict[str, float]:
        a, dq, dv = self.heads, self.qk_dim, self.v_dim
        up = a * (2 * dq + dv)
        out = {"mla_up": up, "qkv": (self.q_lora_rank or 0) + self.kv_lora_rank + self.qk_rope_head_dim + up}
        if self.index_heads:     # index queries, the shared index key, the head weights (counted with Q, K, V, so
            #                    split by TP as they are: the indexer's are whole on every rank, a small undercount)
            out["qkv"] += self.index_heads * self.index_head_dim + self.index_head_dim + self.index_heads
        return out

    def ring_elems(self, tp) -> float:
        """Megatron-Core exchanges the up-projected K and V of the local heads: a/tp · (d_qk + d_v). ``tp`` may be a
        numpy array."""
        return self.heads / tp * (self.qk_dim + self.v_dim)

    def rules(self) -> tuple[Rule, ...]:
        """Heads split by TP; the latent is replicated, so no KV-head rule."""
        return (Rule("tp", "num_attention_heads", self.heads),)
