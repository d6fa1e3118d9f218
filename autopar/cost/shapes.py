"""The kernels of one transformer layer, by class, as the compute term prices them.

A layer is inventoried once per (model, sequence length) as a :class:`LayerKind`: its linear layers (GEMMs, each
with its weight shape K x N and how tensor parallelism splits it), its attention core (the flash-attention
kernel), and the HBM bytes its memory-bound kernels move per token. Layers with the same inventory share one
kind, so a pipeline stage is priced as a count per kind (:meth:`autopar.cost.layer_sums.ModelProfile.kind_counts`).

Module names follow Megatron-Core's recompute modules (``--recompute-modules``) so that selective recomputation
can redo exactly the kernels it names: ``core_attn``, ``mla_up_proj``, ``mlp``, ``moe``, ``moe_act``,
``shared_experts``, ``layernorm``; ``attn`` (QKV/out projections, never recomputed alone) and ``residual``,
``rope``, ``router`` belong to no module.

Memory-bound bytes (elements per token, forward and backward) come from the blocks (:mod:`autopar.blocks`; each
block file counts its kernels op by op, one HBM pass each, with sources) and add up per entry of ``TP_SPLIT``:
``norm`` and ``residual`` (the token-mixer and channel sub-blocks' own), ``bda`` and ``bda_bias`` (the elements
entering each bias-dropout-add, priced by the recipe's switches), ``rope``, ``mlp_act``, ``mlp_act_unfused`` (what
the activation adds when it runs unfused), ``shared_act``,
``rope_unfused`` (Megatron-Core's RoPE where YaRN scales cos/sin), ``moe_act``, ``moe_act_clamp`` (a clamped expert
activation's eager clamps, Megatron-Core's unfused path),
``permute``, ``ssm_scan`` (a linear mixer's scan kernels, split by heads), ``batch_major`` (copies
between the [s, b, ·] and [b, s, ·] layouts, paid only when the micro-batch holds more than one sequence); and
``grad_sum``, ``grad_sum_eager``, ``expert_grad_sum`` where a stack runs separate projections on one input (autograd
adds their input gradients, :func:`_grad_sums`). Also:

* FP8 recipes (Transformer Engine): every GEMM input activation is cast to FP8 with its transpose for the
  weight-gradient GEMM (``cast_transpose``: read 2 B, write 2 x 1 B) in forward, and every output gradient the
  same in backward: 4 B per element of each GEMM's input width and output width -> counted in bytes, not
  elements (``fp8_cast_width``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autopar.blocks import SPLITS, Linear  # noqa: F401  (re-exported: the kernel vocabulary of the compute term)
from autopar.specs.model import ModelSpec


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
    window: int = 0              # sliding window w (keys) of a windowed attention layer, 0 for none: picks the
                                 # hardware file's measured windowed-attention rates (autopar.cost.kernels)

    def key(self) -> tuple:
        return (self.linears, self.attn_flops, self.attn_window, self.head_dim, self.window, self.is_moe,
                tuple(sorted(self.membound.items())), self.fp8_cast_width, self.fp8_cast_width_expert)


# Which memory-bound entries are split by TP (sequence-parallel regions are split only when SP is on; "full": every
# TP rank runs it over all T tokens and the whole hidden width).
TP_SPLIT = {"rope": "tp", "rope_unfused": "tp", "mlp_act": "tp", "mlp_act_unfused": "tp", "shared_act": "tp",
            "norm": "sp",
            "residual": "sp", "bda": "sp", "bda_bias": "sp",
            "moe_act": "routed", "permute": "routed", "grad_sum": "full", "grad_sum_eager": "full",
            "expert_grad_sum": "routed", "ssm_scan": "tp", "batch_major": "tp", "expert_bias": "routed",
            "moe_act_clamp": "routed"}
# Entries a layer's token mixers share when it has several in parallel (one pre-norm, one residual add).
SHARED_BY_MIXERS = ("norm", "residual", "bda", "bda_bias")

# Autograd's sum of input gradients where n separate projections read one input (a GEMM and the ones after it with
# Linear.shares_input): each writes its own input gradient (T x K; before TP's reduce-scatter / all-reduce every TP rank
# holds a partial sum over all T tokens and the whole width K), and autograd adds them (PyTorch autograd
# InputBuffer::accumulate). Elements per token per unit of K, backward only: one kernel reading the n gradients and
# writing their sum, n + 1 (what torch.compile's Inductor makes of the chain of adds, a pointwise fusion), ``grad_sum``;
# eager runs n - 1 adds of read 2, write 1, 3(n - 1), the excess 2n - 4 over the one kernel being ``grad_sum_eager``
# (torchtitan's q, k, v: 6 against 4; w1, w3: 3 either way), which compiled elementwise kernels do not pay
# (autopar.cost.compute.ELEMENTWISE_BYTES). A fused GEMM writes one input gradient and needs neither.


def _grad_sums(linears: tuple[Linear, ...], top_k: int) -> dict[str, tuple[float, float]]:
    """(forward, backward) elements per token of the input-gradient sums of ``linears`` (see the comment above):
    ``grad_sum`` and ``grad_sum_eager`` for TP-split GEMMs, ``expert_grad_sum`` for routed-expert GEMMs (k routed copies
    per token, counted where the tokens' permutation is; their groups are gate and up, n = 2, where eager and one
    kernel move the same)."""
    groups: list[list[Linear]] = []
    for lin in linears:
        if lin.shares_input and groups:
            groups[-1].append(lin)
        else:
            groups.append([lin])
    one = eager = expert = 0.0
    for g in groups:
        n, k = len(g), g[0].k
        if n < 2:
            continue
        if g[0].split.startswith("expert"):
            expert += (n + 1) * k
        else:
            one += (n + 1) * k
            eager += (2 * n - 4) * k
    out = {}
    if one:
        out["grad_sum"] = (0.0, one)
    if eager:
        out["grad_sum_eager"] = (0.0, eager)
    if expert:
        out["expert_grad_sum"] = (0.0, top_k * expert)
    return out


def layer_kind(m: ModelSpec, i: int, seq_len: int, projections: str = "fused") -> LayerKind:
    """Inventory of layer ``i`` of ``m`` at sequence length ``seq_len``: the GEMMs, memory-bound bytes and FP8
    cast widths of its blocks (:mod:`autopar.blocks`), in order (token mixers, softmax attention first; then the
    channel mixer). A layer with parallel mixers (Falcon-H1) lists the kernels of each; a layer without softmax
    attention has no attention core (its heads and head dim are the model's, for the key only).

    ``projections`` (``TrainingSpec.projections``): the GEMMs as the stack launches them, ``fused`` (Megatron-Core:
    one QKV, one gate-up GEMM) or ``separate`` (torchtitan: one GEMM per projection, :meth:`Block.separate_gemms`);
    each listed GEMM is priced at its own shape (:func:`autopar.cost.compute.layer_parts`), and the GEMMs that share
    an input add autograd's sum of their input gradients (:func:`_grad_sums`)."""
    channel = m.channel_block(i)
    blocks = (*m.mixer_blocks(i), *((channel,) if channel is not None else ()))
    att = next((b for b in blocks if b.keeps_kv), None)
    membound = {"norm": (0.0, 0.0), "residual": (0.0, 0.0), "rope": (0.0, 0.0)}
    cast = cast_exp = 0.0
    # Parallel token mixers (Falcon-H1) read one pre-norm and add one residual: the largest of their counts.
    shared: dict[str, tuple[float, float]] = {}
    for b in blocks:
        for name, (fwd, bwd) in b.membound().items():
            if b is not channel and name in SHARED_BY_MIXERS:
                f0, b0 = shared.get(name, (0.0, 0.0))
                shared[name] = (max(f0, fwd), max(b0, bwd))
            else:
                f0, b0 = membound.get(name, (0.0, 0.0))
                membound[name] = (f0 + fwd, b0 + bwd)
        cast += b.fp8_cast_width()
        cast_exp += b.fp8_cast_width_expert()
    for name, (fwd, bwd) in shared.items():
        f0, b0 = membound.get(name, (0.0, 0.0))
        membound[name] = (f0 + fwd, b0 + bwd)
    routed = channel if channel is not None and channel.routed else None
    linears = tuple(lin for b in blocks for lin in b.launched_gemms(projections))
    membound.update(_grad_sums(linears, routed.top_k if routed else 0))
    return LayerKind(linears=linears,
                     attn_flops=att.attention_core_flops(seq_len) if att else 0.0,
                     attn_ctx=max(att.context(seq_len) if att else 0.0, 1.0), heads=m.num_attention_heads,
                     attn_window=att.span(seq_len) if att else float(seq_len), head_dim=m.qk_head_dim,
                     window=(att.window or 0) if att else 0,
                     is_moe=routed is not None, top_k=routed.top_k if routed else 0,
                     num_experts=routed.num_experts if routed else 0, membound=membound, fp8_cast_width=float(cast),
                     fp8_cast_width_expert=float(cast_exp))
