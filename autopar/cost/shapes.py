"""The kernels of one transformer layer, by class, as the compute term prices them.

A layer is inventoried once per (model, sequence length) as a :class:`LayerKind`: its linear layers (GEMMs, each
with its weight shape K x N and how tensor parallelism splits it), its attention core (the flash-attention
kernel), and the HBM bytes its memory-bound kernels move per token. Layers with the same inventory share one
kind, so a pipeline stage is priced as a count per kind (:meth:`autopar.cost.profile.ModelProfile.kind_counts`).

Module names follow Megatron-Core's recompute modules (``--recompute-modules``) so that selective recomputation
can redo exactly the kernels it names: ``core_attn``, ``mla_up_proj``, ``mlp``, ``moe``, ``moe_act``,
``shared_experts``, ``layernorm``; ``attn`` (QKV/out projections, never recomputed alone) and ``residual``,
``rope``, ``router`` belong to no module.

Memory-bound bytes (elements per token, forward and backward, summed over the kernels a module launches) are
counted op by op from what each kernel must read and write in HBM, one pass each (no fusion assumed unless
stated); symbols: h hidden, a query heads, g KV heads, d head dim, f FFN width (f_e one routed expert's), k
routed experts per token. Sources: the kernels' definitions (RMSNorm: Zhang & Sennrich 2019, arXiv 1910.07467;
SwiGLU: Shazeer 2020, arXiv 2002.05202; RoPE: Su et al. 2021, arXiv 2104.09864) and Megatron-Core's
implementations (``megatron/core/transformer``, ``fusions``):

* norm (RMSNorm/LayerNorm), 2 per layer: forward reads x, writes y (2h); backward reads x and dy, writes dx (3h)
  -> 5h each;
* residual add, 2 per layer: forward reads 2h, writes h; backward the gradient is added into the skip branch
  (reads 2h, writes h) -> 6h each;
* RoPE on Q and K (rotary dims only): forward reads and writes (a+g)·d_r, backward the same -> 4(a+g)·d_r;
* activation of a gated MLP of width f (SwiGLU, Megatron's fused bias-swiglu): forward reads 2f, writes f;
  backward reads 2f and df, writes 2f -> 8f; plain GELU MLP: forward f+f, backward 2f+f -> 5f;
* MoE token permutation (Megatron's ``permute``/``unpermute``): each routed copy of a token is written once by
  the permute and read once by the unpermute's weighted sum, in forward and backward -> 4·k·h (+ 2h for the
  token read/written around it, counted with the residual);
* FP8 recipes (Transformer Engine): every GEMM input activation is cast to FP8 with its transpose for the
  weight-gradient GEMM (``cast_transpose``: read 2 B, write 2 x 1 B) in forward, and every output gradient the
  same in backward: 4 B per element of each GEMM's input width and output width -> counted in bytes, not
  elements (``fp8_cast_width``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autopar.specs.model import ModelSpec

# How tensor parallelism splits a linear layer (Megatron: column-parallel splits N, row-parallel splits K);
# routed experts are split by expert-tensor parallelism (ETP) instead of TP; "replicated": every TP rank
# computes it whole (the MoE router).
SPLITS = ("col", "row", "replicated", "expert_col", "expert_row")


@dataclass(frozen=True)
class Linear:
    """One linear layer: y[T, N] = x[T, K] · W[K, N] per token row; 2·K·N FLOPs per token forward."""

    k: int
    n: int
    split: str
    module: str

    @property
    def params(self) -> int:
        return self.k * self.n


@dataclass(frozen=True)
class LayerKind:
    """Everything the compute term needs about one layer, independent of the layout."""

    linears: tuple[Linear, ...]
    attn_flops: float            # attention core forward FLOPs per token: 2·ctx·a·(d_qk + d_v)
    heads: int                   # query heads a
    attn_ctx: float              # average keys a query attends to (causal s/2, window min(w, s/2))
    attn_window: float           # longest key span of one query (s, or the window) - sets the kernel's tile count
    head_dim: int                # d_qk, which sets the flash kernel's efficiency
    is_moe: bool
    top_k: int
    num_experts: int
    # memory-bound elements per token by entry: (forward, backward); split by TP as marked in TP_SPLIT
    membound: dict[str, tuple[float, float]] = field(default_factory=dict)
    fp8_cast_width: float = 0.0  # sum of input + output widths of the layer's non-expert GEMMs (elements)
    fp8_cast_width_expert: float = 0.0   # the same for one routed copy through the expert GEMMs

    def key(self) -> tuple:
        return (self.linears, self.attn_flops, self.attn_window, self.head_dim, self.is_moe,
                tuple(sorted(self.membound.items())), self.fp8_cast_width, self.fp8_cast_width_expert)


# Which memory-bound entries are split by TP (sequence-parallel regions are split only when SP is on).
TP_SPLIT = {"rope": "tp", "mlp_act": "tp", "shared_act": "tp", "norm": "sp", "residual": "sp",
            "moe_act": "routed", "permute": "routed"}


def layer_kind(m: ModelSpec, i: int, seq_len: int) -> LayerKind:
    """Inventory of layer ``i`` of ``m`` at sequence length ``seq_len``.

    Hybrid models (:mod:`autopar.specs.mixers`): a layer without a token mixer has no attention linears or core; a
    linear-attention / SSM mixer has its projections as column-parallel GEMMs (h -> everything split by heads) and a
    row-parallel output GEMM, and its chunked scan (``ModelSpec.mixer_core_flops_per_token``) priced as one more
    column-parallel GEMM of the same FLOPs with K = its key head dim (Mamba-1: its state size N), in module
    ``core_attn`` (what selective recomputation redoes) — an approximation until the scan has a kernel class of its
    own; an attention mixer's output gate is one more column-parallel GEMM h -> a·d_v. A layer with parallel mixers
    (Falcon-H1) lists the kernels of each."""
    h, a, g = m.hidden_size, m.num_attention_heads, m.kv_heads
    mx = m.attention_part(i)
    channel = m.channel_of(i)
    lin: list[Linear] = []
    rope_width = 0
    cast = 0.0
    attn_flops = ctx = 0.0
    window = float(seq_len)
    if mx is not None:
        if m.mla:
            ml = m.mla
            dq = ml.qk_nope_head_dim + ml.qk_rope_head_dim
            if ml.q_lora_rank:
                lin += [Linear(h, ml.q_lora_rank, "replicated", "attn"),
                        Linear(ml.q_lora_rank, a * dq, "col", "mla_up_proj")]
            else:
                lin.append(Linear(h, a * dq, "col", "attn"))
            lin += [Linear(h, ml.kv_lora_rank + ml.qk_rope_head_dim, "replicated", "attn"),
                    Linear(ml.kv_lora_rank, a * (ml.qk_nope_head_dim + ml.v_head_dim), "col", "mla_up_proj"),
                    Linear(a * ml.v_head_dim, h, "row", "attn")]
            rope_width = (a + 1) * ml.qk_rope_head_dim
        else:
            d = m.dim_per_head
            lin += [Linear(h, (a + 2 * g) * d, "col", "attn"), Linear(a * d, h, "row", "attn")]
            rope_width = (a + g) * d if m.position_embedding == "rope" else 0
        if mx.output_gate:
            lin.append(Linear(h, a * m.v_head_dim, "col", "attn"))
        cast = h + (a + 2 * g) * m.dim_per_head if not m.mla else h + a * m.qk_head_dim
        cast += a * m.v_head_dim + h
        ctx = m._attention_context(i, seq_len)
        attn_flops = 2.0 * ctx * a * (m.qk_head_dim + m.v_head_dim)
        span = mx.window or mx.chunk
        window = float(min(span, seq_len)) if span else float(seq_len)
    for lx in (p for p in m.mixers_of(i) if p.is_linear):     # parallel mixers (Falcon-H1) add their kernels
        out_w, in_w = lx.out_width(), lx.in_width(h)
        lin += [Linear(h, in_w, "col", "attn"), Linear(out_w, h, "row", "attn")]
        scan = lx.core_flops()
        kdim = max(lx.state_size or 1, 1) if lx.kind == "mamba1" else max(lx.dk, 1)
        lin.append(Linear(kdim, int(round(scan / (2.0 * kdim))), "col", "core_attn"))
        cast += h + in_w + out_w + h
    gated = m.gated_mlp
    act = (3.0, 5.0) if gated else (2.0, 3.0)
    n_in = 2 if gated else 1
    blocks = (mx is not None) + (channel != "none")
    membound = {"norm": (blocks * 2.0 * h, blocks * 3.0 * h), "residual": (blocks * 3.0 * h, blocks * 3.0 * h),
                "rope": (2.0 * rope_width, 2.0 * rope_width)}
    is_moe = channel == "moe"
    cast_exp = 0.0
    top_k = num_experts = 0
    if is_moe:
        mo = m.moe
        top_k, num_experts = mo.top_k, mo.num_experts
        lin.append(Linear(h, mo.num_experts, "replicated", "router"))
        if mo.num_shared_experts:
            fs = mo.num_shared_experts * mo.shared_ffn
            lin += [Linear(h, n_in * fs, "col", "shared_experts"), Linear(fs, h, "row", "shared_experts")]
            membound["shared_act"] = (act[0] * fs, act[1] * fs)
            cast += h + n_in * fs + fs + h
        fe = mo.expert_ffn_hidden_size
        lin += [Linear(h, n_in * fe, "expert_col", "moe"), Linear(fe, h, "expert_row", "moe")]
        membound["moe_act"] = (top_k * act[0] * fe, top_k * act[1] * fe)
        membound["permute"] = (2.0 * top_k * h, 2.0 * top_k * h)
        cast_exp = h + n_in * fe + fe + h
    elif channel == "dense":
        f = m.ffn_hidden_size
        lin += [Linear(h, n_in * f, "col", "mlp"), Linear(f, h, "row", "mlp")]
        membound["mlp_act"] = (act[0] * f, act[1] * f)
        cast += h + n_in * f + f + h
    return LayerKind(linears=tuple(lin), attn_flops=attn_flops, attn_ctx=max(ctx, 1.0),
                     heads=a, attn_window=window, head_dim=m.qk_head_dim, is_moe=is_moe, top_k=top_k,
                     num_experts=num_experts, membound=membound, fp8_cast_width=float(cast),
                     fp8_cast_width_expert=float(cast_exp))
