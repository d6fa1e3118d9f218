"""Context-parallel communication: ring attention's KV exchange (Liu et al. 2023, arXiv 2310.01889;
Megatron-Core context parallelism with the load-balanced zig-zag split).

Each GPU holds s/cp tokens. Per layer and micro-batch the forward pass passes K and V around the ring in
cp − 1 steps; the backward pass passes K, V and their gradients (2x): 3(cp − 1) transfers of

    KV = b · (s/cp) · 2 · g_local · d · e bytes,   g_local = max(g/tp, 1) KV heads per TP rank
    (MLA: Megatron exchanges the up-projected K and V of the local heads: a/tp · (d_qk + d_v)),

as point-to-point sends between neighbours tp ranks apart; full recomputation adds one forward pass.
Ring attention overlaps each transfer with the attention block it feeds, so only what the attention math of
the layer cannot cover is exposed:  T_cp = max(0, T_comm − cp_overlap · T_attention), with T_attention the
flash-attention core's forward + backward (+ recomputed forward) time from :mod:`autopar.cost.kernels` at the
ring's block span s/cp.

Linear-attention and SSM layers (autopar.blocks) keep no KV: each CP rank scans its own s/cp tokens from
a zero state, and the ranks then pass the d_k x d_v state along the sequence, rank r adding its chunk's
contribution to what rank r − 1 hands over (LASP, Sun et al. 2024, arXiv 2404.02882, sec. 3: the ring of
KV-states instead of keys and values; the same for Mamba-2's SSD states, arXiv 2405.21060 sec. 8). Per layer
and micro-batch that is cp − 1 sequential sends of the state forward and cp − 1 of its gradient backward
(+1 pass with full recompute), each

    STATE = b · state_elems / tp · e bytes    (state_elems: H·d_k·d_v, Mamba-2 H·P·N; heads split by TP),

and it cannot hide behind the scan that needs it (counted fully exposed, an upper bound: LASP overlaps the
intra-chunk part with it). That is ``training.linear_cp = 'state_pass'``. autopar's runner passes the states
another way: one all-gather of every chunk's (transition, zero-state final state) summary, 2x (decay kinds) to 4x
(delta rule, Mamba-1) these bytes in one collective instead of cp − 1 dependent hops; the estimate keeps the ring.

Megatron-Core runs these layers' CP differently (``training.linear_cp = 'all_to_all'``, the default:
megatron/core/ssm/mamba_context_parallel.py, gated_delta_net/gdn.py): an all-to-all swaps the sequence split for
a head split before the convolution and scan, and another swaps back after, so each rank scans the whole
sequence for H/(tp·cp) heads (as DeepSpeed-Ulysses does for attention, Jacobs et al. 2023, arXiv 2309.14509).
Per layer and micro-batch: 2 all-to-alls forward and 2 backward (+2 with full recompute), each of

    A2A = b · (s/cp) · (in_width + out_width) / tp · e bytes   over cp ranks tp apart,

with in_width the input projections' output (q, k, v, gates; Mamba's z, x, B, C, dt) and out_width the scan's
output; on the critical path (counted exposed).
"""

from __future__ import annotations

from autopar.cost.collectives import Network
from autopar.cost.kernels import Kernels
from autopar.cost.layer_sums import ModelProfile
from autopar.cost.stage import Stage
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import Layout
from autopar.specs.training import TrainingSpec


def cp_time_per_microbatch(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, hw: HardwareSpec,
                           net: Network, kern: Kernels) -> float:
    if L.cp == 1:
        return 0.0
    m = prof.model
    per_token = m.attention_block.ring_elems(L.tp)
    kv_bytes = L.micro_batch * (tr.seq_len / L.cp) * per_token * tr.activation_bytes
    passes = 4 if L.recompute == "full" else 3
    n_attn = st.sum(prof, "attn_layers")
    comm = n_attn * passes * (L.cp - 1) * net.time("send_recv", kv_bytes, 2, L.tp)
    tokens = L.micro_batch * tr.seq_len / (L.tp * L.cp)
    span = tr.seq_len / L.cp
    fwd, bwd = kern.attention(st.sum(prof, "attn_core_flops") * tokens, span, m.qk_head_dim)
    attn = fwd + bwd + (fwd if L.recompute == "full" else 0.0)
    t = max(0.0, comm - (hw.efficiency.cp_overlap if tr.cp_comm_overlap else 0.0) * attn)
    n_state = st.sum(prof, "state_layers")
    if n_state and tr.linear_cp == "all_to_all":
        a2a_bytes = L.micro_batch * (tr.seq_len / L.cp) * st.sum(prof, "mixer_a2a_elems") / L.tp * tr.activation_bytes
        c, t0 = net.coefficients("all_to_all", L.cp, L.tp)
        # 2 per pass; each layer's latency counted once per all-to-all
        t += 2 * (passes - 1) * (a2a_bytes * c + n_state * t0)
    elif n_state:
        # all state layers of the stage; the per-layer latency is counted once per layer and pass
        state_bytes = L.micro_batch * st.sum(prof, "mixer_state_elems") / L.tp * tr.activation_bytes
        c, t0 = net.coefficients("send_recv", 2, L.tp)
        t += (passes - 1) * (L.cp - 1) * (state_bytes * c + n_state * t0)
    return t
