"""Expert-parallel communication: token dispatch and combine all-to-alls (Lepikhin et al. 2020, GShard,
arXiv 2006.16668; Megatron-Core's all-to-all token dispatcher).

Per MoE layer and micro-batch each GPU holds b·s/(cp·tp) tokens (SP splits them across the TP group) and
sends each to k experts: dispatch and combine in the forward pass, the same two in the backward pass
(4 all-to-alls; full recomputation adds 2), each of

    A2A = b·s/(cp·tp) · k · h · e bytes  over ep ranks, etp apart in the stage's expert mesh
    (l instead of h under LatentMoE, whose tokens travel at the latent width),

priced by :meth:`autopar.cost.collectives.Network.moe_dispatch_time`: a plain all-to-all inside one NVLink
domain, hierarchical across domains (each token crosses the network once per destination domain and is
forwarded over NVLink, as DeepSeek-V3's dispatcher and DeepEP do).

With ETP > 1 the routed tokens are also all-gathered and reduce-scattered in the ETP group (2 per pass).
Exposed fraction: 1 − ep_overlap (Megatron's 1F1B A2A overlap hides part of it).
"""

from __future__ import annotations

from autopar.blocks import channel_block
from autopar.cost.collectives import Network
from autopar.cost.layer_sums import ModelProfile
from autopar.cost.stage import Stage
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import Layout
from autopar.specs.training import TrainingSpec


def ep_time_per_microbatch(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, hw: HardwareSpec,
                           net: Network) -> float:
    n_moe = st.sum(prof, "moe_layers")
    if not n_moe or (L.ep == 1 and L.etp == 1):
        return 0.0
    per_pass = 3 if L.recompute == "full" else 2     # forward, backward (+ recomputed forward)
    # a routed token is h wide, or l under LatentMoE (autopar.blocks.moe)
    width = channel_block(prof.model, "moe").routed_width
    token_bytes = L.micro_batch * tr.seq_len / (L.cp * L.tp) * width * tr.activation_bytes
    nbytes = token_bytes * prof.top_k
    t = 2 * per_pass * net.moe_dispatch_time(token_bytes, prof.top_k, prof.model.moe.num_experts, L.ep, L.etp)
    if L.etp > 1:
        t += per_pass * (net.time("all_gather", nbytes * L.etp, L.etp, 1)
                         + net.time("reduce_scatter", nbytes * L.etp, L.etp, 1))
    return (1.0 - (hw.efficiency.ep_overlap if tr.ep_comm_overlap else 0.0)) * n_moe * t
