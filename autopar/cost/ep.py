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

Overlap (``training.ep_comm_overlap``; Megatron-Core --overlap-moe-expert-parallel-comm, the combined 1F1B
schedule: the forward of one micro-batch runs interleaved with the backward of another, so each one's
dispatch/combine hides behind the other's kernels; DeepSeek-V3, arXiv 2412.19437 sec. 3.2.1 on the same
pairing). Megatron-Core allows that schedule only with EP > 1, without full recomputation or 'moe' in the
recompute modules, with at most one MTP layer, and with virtual pipeline stages when PP > 1
(NVIDIA/Megatron-LM megatron/core/transformer/transformer_config.py, ``TransformerConfig.__post_init__``,
``if self.overlap_moe_expert_parallel_comm:``: "If enabling EP A2A overlap, virtual_pipeline_model_parallel_size
must be specified when pipeline_model_parallel_size > 1", "Disable full recomputation when enabling
overlap_moe_expert_parallel_comm"; and not Megatron-FSDP on an interleaved pipeline, combined_1f1b.py): the rules
with their pinned upstream lines are :data:`autopar.specs.launcher_rules.EP_OVERLAP_RULES`, asked by
:func:`ep_overlap_blockers`. Where it runs, one micro-batch in M has no
partner (the first forward and the last backward of the step); for the rest, the forward's all-to-alls (half of
T_ep) hide behind the partner's backward kernels (2/3 of W, the stage's kernels of one micro-batch,
:func:`autopar.cost.compute.hiding_windows`) and the backward's behind its forward (1/3 of W):

    exposed = T_ep / M + max(0, R/2 − 2W/3) + max(0, R/2 − W/3),   R = T_ep · (1 − 1/M)      (else T_ep)

What hides slows the partner's kernels (they share the SMs): priced once for every term by
:func:`autopar.cost.overlap.overlap_cost`, applied in :meth:`autopar.cost.Estimator.stage_times`.
"""

from __future__ import annotations

import functools

from autopar.blocks import channel_block
from autopar.cost._select import maximum
from autopar.cost.collectives import Network
from autopar.cost.layer_sums import ModelProfile
from autopar.cost.stage import Stage
from autopar.specs.hardware import HardwareSpec
from autopar.specs.launcher_rules import EP_OVERLAP_RULES, megatron_problems
from autopar.specs.layout import Layout
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec


def ep_overlap_blockers(L: Layout, model: ModelSpec) -> list[str]:
    """Why Megatron-Core refuses --overlap-moe-expert-parallel-comm for this layout, each with its upstream line; empty
    when it allows it. The rules are Megatron's own, kept once in :mod:`autopar.specs.launcher_rules` (the Megatron
    emitter checks its argv against the same ones): the layout is put as the settings Megatron would see."""
    return list(_ep_overlap_problems(L.ep, L.pp, L.vpp, L.recompute == "full", L.recompute_modules,
                                     model.mtp_layers, L.zero_stage == 3))


@functools.lru_cache(maxsize=None)
def _ep_overlap_problems(ep: int, pp: int, vpp: int, full: bool, modules: frozenset[str], mtp_layers: int,
                         megatron_fsdp: bool) -> tuple[str, ...]:
    """:func:`ep_overlap_blockers` of the few layout fields the rules read, kept: every stage time with EP overlap on
    asks it, over a handful of distinct answers."""
    settings = {"overlap_moe_expert_parallel_comm": True, "expert_model_parallel_size": ep,
                "pipeline_model_parallel_size": pp,
                "num_virtual_stages_per_pipeline_rank": vpp if vpp > 1 else None,
                "recompute_granularity": "full" if full else None, "recompute_method": "uniform" if full else None,
                "recompute_modules": sorted(modules), "bf16": True,
                "mtp_num_layers": mtp_layers, "use_megatron_fsdp": megatron_fsdp}
    return tuple(megatron_problems(settings, EP_OVERLAP_RULES))


def ep_comm_seconds(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, net: Network,
                    per_pass: int | None = None) -> float:
    """T_ep: every dispatch/combine (and ETP gather/scatter) of one micro-batch on stage ``st``, none hidden, at the
    mean load. ``per_pass`` overrides the passes (2: forward and backward, whatever the recompute policy)."""
    n_moe = st.sum(prof, "moe_layers")
    if not n_moe or (L.ep == 1 and L.etp == 1):
        return 0.0
    if per_pass is None:
        per_pass = 3 if L.recompute == "full" else 2     # forward, backward (+ recomputed forward)
    # a routed token is h wide, or l under LatentMoE (autopar.blocks.moe)
    width = channel_block(prof.model, "moe").routed_width
    token_bytes = L.micro_batch * tr.seq_len / (L.cp * L.tp) * width * tr.activation_bytes
    nbytes = token_bytes * prof.top_k
    t = 2 * per_pass * net.moe_dispatch_time(token_bytes, prof.top_k, prof.model.moe.num_experts, L.ep, L.etp)
    if L.etp > 1:
        t += per_pass * (net.time("all_gather", nbytes * L.etp, L.etp, 1)
                         + net.time("reduce_scatter", nbytes * L.etp, L.etp, 1))
    return n_moe * t


def ep_time_per_microbatch(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, hw: HardwareSpec,
                           net: Network, imbalance: float = 1.0, window: float = 0.0,
                           total: float | None = None) -> float:
    """Exposed EP seconds of one micro-batch: T_ep times ``imbalance`` (the busiest rank's load), less what the
    partner micro-batch's kernels (``window``, W above) hide where the schedule overlaps at all. ``total``: T_ep ·
    imbalance when the caller has it already (the estimator prices the hidden part too). ``total``, ``window`` and
    ``L.grad_accum`` may be broadcastable numpy arrays (the search's step-time floors): the result is elementwise."""
    t = ep_comm_seconds(prof, st, L, tr, net) * imbalance if total is None else total
    if (getattr(t, "ndim", 0) == 0 and not t) or not tr.ep_comm_overlap or ep_overlap_blockers(L, prof.model):
        return t
    m = L.grad_accum
    rest = t * (1.0 - 1.0 / m)
    return t / m + maximum(0.0, rest / 2 - 2.0 * window / 3) + maximum(0.0, rest / 2 - window / 3)
