"""Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 sec. 2.1, eq. 9-13): low-rank Q and a joint KV latent.

Parameters: W_DQ h·r_q (+ the latent's RMSNorm r_q), W_UQ r_q·a·(d_nope + d_rope) (without r_q: a full h·a·d_qk
Q), W_DKV h·(d_c + d_rope) (+ RMSNorm d_c), W_UKV d_c·a·(d_nope + d_v), O a·d_v·h. The down-projections are
replicated over TP ranks (Megatron-Core ``MLASelfAttention``); the up-projections are recompute module
``mla_up_proj``. RoPE runs on the decoupled rotary dims of a query heads and the one shared key: (a+1)·d_rope.
Stored activations: the two latents, the rotary key, and the up-projected Q, K, V (a·(2·d_qk + d_v), dropped by
``mla_up_proj`` recompute). Window, chunk, sinks and output gate work as for :mod:`autopar.blocks.attention`.

Symbols: h hidden, a heads, r_q q_lora_rank, d_c kv_lora_rank, d_nope / d_rope / d_v per-head dims.
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

    @classmethod
    def from_spec(cls, model, mixer=None) -> "MLA":
        m = model.mla
        return cls(hidden=model.hidden_size, heads=model.num_attention_heads, kv_heads=model.kv_heads,
                   head_dim=model.dim_per_head, rope=model.position_embedding == "rope",
                   q_lora_rank=m.q_lora_rank, kv_lora_rank=m.kv_lora_rank, qk_nope_head_dim=m.qk_nope_head_dim,
                   qk_rope_head_dim=m.qk_rope_head_dim, v_head_dim=m.v_head_dim, **_options(mixer))

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
        return q + kv + a * self.v_head_dim * h

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
        return lin + [Linear(h, self.kv_lora_rank + self.qk_rope_head_dim, "replicated", "attn"),
                      Linear(self.kv_lora_rank, a * (self.qk_nope_head_dim + self.v_head_dim), "col", "mla_up_proj"),
                      Linear(a * self.v_head_dim, h, "row", "attn")]

    def rope_width(self) -> int:
        return (self.heads + 1) * self.qk_rope_head_dim

    def _qkv_width(self) -> int:
        return self.heads * self.qk_dim

    def _stored_qkv(self) -> dict[str, float]:
        a, dq, dv = self.heads, self.qk_dim, self.v_dim
        up = a * (2 * dq + dv)
        return {"mla_up": up, "qkv": (self.q_lora_rank or 0) + self.kv_lora_rank + self.qk_rope_head_dim + up}

    def ring_elems(self, tp: int) -> float:
        """Megatron-Core exchanges the up-projected K and V of the local heads: a/tp · (d_qk + d_v)."""
        return self.heads / tp * (self.qk_dim + self.v_dim)

    def rules(self) -> tuple[Rule, ...]:
        """Heads split by TP; the latent is replicated, so no KV-head rule."""
        return (Rule("tp", "num_attention_heads", self.heads),)
