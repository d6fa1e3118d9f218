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
"""

from __future__ import annotations

from autopar.cost.collectives import Network
from autopar.cost.kernels import Kernels
from autopar.cost.profile import ModelProfile
from autopar.cost.stage import Stage
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import Layout
from autopar.specs.training import TrainingSpec


def cp_time_per_microbatch(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, hw: HardwareSpec,
                           net: Network, kern: Kernels) -> float:
    if L.cp == 1:
        return 0.0
    m = prof.model
    if m.mla:
        per_token = m.num_attention_heads / L.tp * (m.qk_head_dim + m.v_head_dim)
    else:
        per_token = 2 * max(m.kv_heads / L.tp, 1.0) * m.dim_per_head
    kv_bytes = L.micro_batch * (tr.seq_len / L.cp) * per_token * tr.activation_bytes
    passes = 4 if L.recompute == "full" else 3
    comm = st.n_layers * passes * (L.cp - 1) * net.time("send_recv", kv_bytes, 2, L.tp)
    tokens = L.micro_batch * tr.seq_len / (L.tp * L.cp)
    span = tr.seq_len / L.cp
    fwd, bwd = kern.attention(st.sum(prof, "attn_core_flops") * tokens, span, m.qk_head_dim)
    attn = fwd + bwd + (fwd if L.recompute == "full" else 0.0)
    return max(0.0, comm - hw.efficiency.cp_overlap * attn)
