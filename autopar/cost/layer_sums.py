"""Per-layer quantities of one model at one sequence length, with prefix sums so that any pipeline stage's
totals cost O(1). Built once per (model, training) by :class:`autopar.cost.Estimator`.

Everything here is per token (FLOPs, parameters, bytes of stored activations) and independent of the layout;
the term modules divide by the parallel degrees.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from autopar.cost.shapes import LayerKind, layer_kind
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec


def _prefix(values: list[float]) -> list[float]:
    return [0.0, *accumulate(values)]


@dataclass(frozen=True)
class LayerSums:
    """Prefix sums over layers; ``between(k, a, b)`` sums quantity k over layers a..b-1."""

    dense_params: list[float]      # weights sharded by TP (mixer, dense MLP, router, shared experts, norms)
    expert_params: list[float]     # routed-expert weights (sharded by EP·ETP)
    kv_params: list[float]         # K and V projection weights of GQA attention layers (replicated when kv_heads < tp)
    fwd_flops: list[float]         # forward FLOPs per token, whole layer (attention scores / mixer scan included)
    attn_core_flops: list[float]   # forward FLOPs of softmax attention's QK^T and AV per token (what selective
    #                                recompute redoes on attention layers; 0 on other layers)
    mixer_core_flops: list[float]  # forward FLOPs per token of a linear-attention / SSM layer's chunked scan and short
    #                                convolution (autopar.blocks): small batched matmuls over C-token chunks and
    #                                d_k x d_v states, not the projections (those are in fwd_flops as GEMM FLOPs, like
    #                                attention's). 0 on softmax-attention layers. Also what core_attn recompute redoes
    #                                on these layers.
    mlp_flops: list[float]         # forward FLOPs of dense MLP / routed+shared experts per token
    moe_layers: list[float]        # 1 for MoE layers
    tp_blocks: list[float]         # blocks whose output TP reduces (one all-reduce, or reduce-scatter with SP, per pass):
    #                                1 for a token mixer (parallel mixers add their row-parallel partial sums before
    #                                one reduce) + 1 for a dense MLP or a MoE block's shared experts (a TP-split MLP:
    #                                Megatron-Core's SharedExpertMLP); the routed tokens travel by the expert
    #                                all-to-all instead (autopar.cost.tp)
    moe_mlp_flops: list[float]     # forward FLOPs per token of routed + shared experts (MoE layers only)
    routed_flops: list[float]      # forward FLOPs per token of the k routed experts (grouped GEMMs)
    attn_layers: list[float]       # 1 for softmax-attention layers (they exchange K and V around the CP ring)
    state_layers: list[float]      # 1 for linear-attention / SSM layers (they pass a recurrent state between CP ranks)
    mixer_state_elems: list[float]  # recurrent state of ONE sequence per layer, elements (H·d_k·d_v; Mamba-2 H·P·N;
    #                                 + conv tail); per sequence, not per token. Split by TP (by heads).
    mixer_a2a_elems: list[float]   # per token, the linear/SSM mixers' input-projection output + scan output widths:
    #                                what all-to-all context parallelism swaps between a sequence and a head split
    #                                (the blocks' in_width + out_width); split by TP
    # Stored activation elements per token, by tensor (see ModelProfile for the derivation):
    act_norm_in: list[float]       # inputs of the layer's norms (h each); split by SP
    act_norm_out: list[float]      # outputs of the norms = inputs of the mixer and MLP linears (h each); split by SP
    act_qkv: list[float]           # Q, K, V (MLA: latents and up-projected Q, K, V; linear/SSM mixers: the scan's
    #                                inputs q, k, v, gates / x, B, C, dt, z, the conv input and the scan's output,
    #                                which no selective recompute drops: autopar.blocks._recurrent); split by TP
    act_attn_out: list[float]      # softmax attention output (a·d_v); split by TP; dropped by selective recompute
    act_mla_up: list[float]        # MLA up-projected Q, K, V (dropped by mla_up_proj recompute)
    act_mlp: list[float]           # dense MLP internals (gated: 3f, plain: 2f); split by TP
    act_shared: list[float]        # shared-expert internals; split by TP
    act_moe_io: list[float]        # routed tokens' k copies entering the experts (k·h; k·l under LatentMoE)
    act_moe_latent: list[float]    # LatentMoE's projection tensors (2·l; 0 without LatentMoE)
    act_moe_inner: list[float]     # routed-expert internals (k·3f_e gated, k·2f_e plain)
    act_moe_act: list[float]       # routed-expert activation-function outputs (k·f_e, dropped by moe_act)
    act_moe_act_clamp: list[float]  # the eager clamps' saved fc1 output beside the activation's (k·2f_e, clamped
    #                                experts only: autopar.blocks.moe CLAMP_STORED; dropped by moe_act)

    def between(self, name: str, a: int, b: int) -> float:
        arr = getattr(self, name)
        return arr[b] - arr[a]


class ModelProfile:
    """Model-derived constants for the cost model (per token, per layer)."""

    def kind_counts(self, first: int, last: int) -> tuple[tuple[int, int], ...]:
        """(kind index, number of layers of that kind) among layers [first, last); kept per range (every stage
        time asks it several times)."""
        hit = self._kind_counts.get((first, last))
        if hit is None:
            hit = self._kind_counts[(first, last)] = tuple(
                (j, n) for j, pre in enumerate(self._kind_prefix) if (n := int(round(pre[last] - pre[first]))))
        return hit

    def __init__(self, model: ModelSpec, training: TrainingSpec):
        self.model = model
        self.training = training
        self._kind_counts: dict[tuple[int, int], tuple[tuple[int, int], ...]] = {}
        m, s = model, training.seq_len
        h, g = m.hidden_size, m.kv_heads
        cols: dict[str, list[float]] = {f: [] for f in LayerSums.__dataclass_fields__}
        for i in range(m.num_layers):
            mixers, channel = m.mixer_blocks(i), m.channel_block(i)
            row = dict.fromkeys(cols, 0.0)
            row["attn_core_flops"] = m.attention_core_flops_per_token(i, s)
            row["mixer_core_flops"] = m.mixer_core_flops_per_token(i)
            mlp_f = m.channel_forward_flops_per_token(i)
            row.update(dense_params=m.layer_nonexpert_params(i), expert_params=m.layer_expert_params(i))
            if channel is not None and channel.routed:
                row.update(moe_layers=1.0, moe_mlp_flops=mlp_f, routed_flops=channel.routed_flops())
            row["tp_blocks"] = (1.0 if mixers else 0.0) + (1.0 if channel is not None and channel.tp_reduces else 0.0)
            row["fwd_flops"] = m.layer_forward_flops_per_token(i, s)
            row["mlp_flops"] = mlp_f
            # Stored activations (elements per token), derived tensor by tensor for a pre-norm block with
            # FlashAttention (no s x s scores kept; Dao et al. 2022, arXiv 2205.14135) and no dropout, block by block
            # (autopar.blocks). This refines Korthikanti et al. 2022 (arXiv 2205.05198) eq. 1-2 (34·s·b·h + 5·a·s²·b
            # bytes per layer), which assumes GPT-3: MHA, a 4h GELU MLP, dropout masks and materialised scores.
            n_norms = m.layer_norms(i) / m.norm_params
            row["act_norm_in"] = n_norms * h
            row["act_norm_out"] = n_norms * h
            # Parallel mixers (Falcon-H1) add up: the layer holds both the attention tensors and the scan's.
            for b in mixers:
                row["attn_layers"] = max(row["attn_layers"], float(b.keeps_kv))
                row["state_layers"] = max(row["state_layers"], float(b.has_state))
                row["kv_params"] += b.kv_params()
                row["mixer_state_elems"] += b.state_elems()
                row["mixer_a2a_elems"] += b.a2a_elems()
            for b in (*mixers, *((channel,) if channel is not None else ())):
                for role, elems in b.stored().items():
                    row["act_" + role] += elems
            for k, v in row.items():
                cols[k].append(float(v))
        self.layers = LayerSums(**{k: _prefix(v) for k, v in cols.items()})
        # Kernel inventory (autopar.cost.shapes): layers with the same inventory share a kind.
        self.kinds: list[LayerKind] = []
        self.kind_of: list[int] = []
        index: dict[tuple, int] = {}
        for i in range(m.num_layers):
            lk = layer_kind(m, i, s, training.projections)
            j = index.setdefault(lk.key(), len(self.kinds))
            if j == len(self.kinds):
                self.kinds.append(lk)
            self.kind_of.append(j)
        self._kind_prefix = [_prefix([1.0 if k == j else 0.0 for k in self.kind_of]) for j in range(len(self.kinds))]
        self.mtp_layers = m.mtp_layers
        self.num_layers = m.num_layers
        self.embedding_params = float(m.embedding_params)
        self.head_params = float(m.lm_head_params)
        self.head_fwd_flops = m.head_forward_flops_per_token()
        self.mtp_params = float(m.mtp_layers * m.mtp_module_params)
        self.mtp_fwd_flops = m.mtp_forward_flops_per_token(s)
        self.model_flops_per_token = m.training_flops_per_token(s)
        self.hidden = h
        self.vocab = m.vocab_size
        self.kv_heads = g
        self.is_moe = m.is_moe
        self.top_k = m.moe.top_k if m.moe else 0
