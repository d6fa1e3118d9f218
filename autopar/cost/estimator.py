"""Assemble the terms into one prediction: per-GPU memory of the fullest stage and the step time.

Step time (the critical path of the slowest pipeline stage, Narayanan et al. 2021 sec. 3.5's composition):

    t_mb   = compute_mb + tp_mb + cp_mb + ep_mb + off_mb   (slowest stage, one micro-batch)
    T_step = M·compute_mb + M·tp_mb + M·cp_mb + M·ep_mb     (steady state: compute, tp, cp, ep)
           + M·off_mb                                        (offload: exposed activation-offload copies)
           + (p − 1)·t_mb / v                                (pp_bubble)
           + exposed p2p                                     (pp_p2p)
           + max over stages of (exposed DP/FSDP + optimizer) (dp, optimizer)

Overlap is not free: each communication term (tp, cp, ep, dp) includes what its hidden part costs the compute it
hides under (:func:`autopar.cost.overlap.overlap_cost`, the hardware file's measured slowdown per engine), so a
collective that hides still costs h·s/(1 + s) for h hidden seconds.

Throughput: tokens/s/GPU = B·s / (T_step · N); model TFLOP/s/GPU = F_token · tokens/s/GPU with F_token the
model's training FLOPs per token (no recomputation; see autopar.specs.model for how causal attention is
counted); MFU = model TFLOP/s / dense peak of the training precision (PaLM, arXiv 2204.02311 app. B).
"""

from __future__ import annotations

import operator
from typing import NamedTuple

from autopar.cost import compute as _compute
from autopar.cost._select import where
from autopar.cost.collectives import Network
from autopar.cost.cp import cp_ring_seconds, cp_times
from autopar.cost.dp import dp_time_per_step
from autopar.cost.ep import ep_comm_seconds, ep_time_per_microbatch
from autopar.cost.kernels import Kernels
from autopar.cost.memory import offloaded_activation_bytes, shard_groups, stage_memory, stage_params
from autopar.cost.offload import offload_time_per_microbatch
from autopar.cost.overlap import overlap_cost
from autopar.cost.optimizer import optimizer_time
from autopar.cost.pipeline import bubble_time, p2p_time
from autopar.cost.layer_sums import ModelProfile
from autopar.cost.result import GIB, Estimate, MemoryBreakdown, TimeBreakdown
from autopar.cost.stage import Stage, memoised, split_stages
from autopar.cost.tp import tp_comm_seconds, tp_time_per_microbatch
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import Layout, resolve_layout
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec


class StageTimes(NamedTuple):
    """Seconds of one micro-batch on one pipeline stage, by term (:meth:`Estimator.stage_times`)."""

    compute: float   # forward + backward (+ recomputation) kernels and the per-layer overhead
    tp: float        # exposed TP/SP communication
    cp: float        # exposed context-parallel communication
    ep: float        # expert-parallel all-to-all (times the dropless imbalance)
    forward: float   # the forward part of compute alone (what DP communication can hide behind); inside compute
    offload: float   # exposed activation-offload copies


def microbatch_seconds(times: StageTimes) -> float:
    """t_mb of one stage from :meth:`Estimator.stage_times`: compute + tp + cp + ep + offload (not the forward-only
    compute, which is part of compute)."""
    return times.compute + times.tp + times.cp + times.ep + times.offload


def step_seconds(L: Layout, t_mb: float, p2p: float, tail: float) -> float:
    """T_step of the module docstring from the slowest stage's micro-batch time t_mb (compute + tp + cp + ep +
    offload, :func:`microbatch_seconds`): M·t_mb + pp_bubble + pp_p2p + tail, tail = max over stages of (exposed
    DP/FSDP + optimizer). The terms :meth:`Estimator.assemble` lists one by one, summed; the search sums its
    tables with this function, with ``L.grad_accum``, ``L.pp``, ``L.vpp`` and the times as broadcastable numpy
    arrays over its candidate grid."""
    return L.grad_accum * t_mb + bubble_time(L, t_mb) + p2p + tail


# The Layout fields the terms of Estimator._stage_shared read (compute, hiding windows, TP, CP, EP volume, offload:
# autopar/cost/compute.py, tp.py, cp.py, ep.ep_comm_seconds, offload.py); the key of its memo. A term that comes to
# read another field must add it here (tests/cost/test_estimator_cache.py checks warm against cold estimates).
SHARED_TERM_FIELDS = ("micro_batch", "cp", "tp", "sp", "ep", "etp", "recompute", "offload_activations")
_shared_key = operator.attrgetter(*SHARED_TERM_FIELDS)


def _memoised(priced: dict, st: Stage, name: str, L: Layout, price):
    """``price(L, st)``, kept in ``priced`` (an Estimator's, emptied whenever it binds hardware) by
    :func:`autopar.cost.stage.memoised` under the stage's place (index, pp, first, last: it names the stage's layers,
    and with them everything the Estimator's profile sums over them) and L's :data:`SHARED_TERM_FIELDS`."""
    return memoised(priced, name, (st.index, st.pp, st.first, st.last, *_shared_key(L)), price, L, st)


class Estimator:
    """Predicts memory and step time of layouts for one (model, hardware, training, gpus).

    Build once, call :meth:`estimate` many times (the search does): model-derived constants are computed in
    the constructor."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, training: TrainingSpec, gpus: int):
        self.model, self.hardware, self.training, self.gpus = model, hardware, training, gpus
        self.profile = ModelProfile(model, training)
        self._bind(hardware)
        self._stages: dict[tuple[int, ...], list[Stage]] = {}

    def _bind(self, hardware: HardwareSpec) -> None:
        """Hardware-derived prices: network, kernel classes, calibrated overhead and imbalance."""
        self.hardware = hardware
        self.net = Network(hardware)
        self.kernels = Kernels(hardware, self.training)
        self.peak = hardware.peak_tflops(self.training.precision) * 1e12
        host = _compute.HOST_OVERHEAD_SHARE[self.training.cuda_graphs]   # CUDA graphs take the host's share
        self.layer_overhead_s = host * hardware.efficiency.layer_overhead_us * 1e-6
        self.moe_overhead_s = host * hardware.efficiency.moe_layer_overhead_us * 1e-6
        self.host_expert_s = host * (hardware.host_us_per_expert_fwd or 0.0) * 1e-6   # compute.moe_host_time
        self.imbalance = (hardware.efficiency.moe_dropless_imbalance if self.training.moe_routing == "dropless"
                          else 1.0)
        self._priced: dict = {}   # hardware-priced stage terms (:func:`_memoised`), for this binding only

    def with_hardware(self, hardware: HardwareSpec) -> "Estimator":
        """The same model and training on other hardware constants, reusing the model profile and the stages
        (calibration); the hardware-priced terms kept so far are not carried over (:meth:`_bind`)."""
        other = object.__new__(Estimator)
        other.__dict__.update(self.__dict__)
        other._bind(hardware)
        return other

    def resolve(self, layout: Layout, allow_cross_domain_tp: bool = True) -> Layout:
        return resolve_layout(layout, self.model, self.training, self.gpus, self.hardware, allow_cross_domain_tp)

    def stages(self, stage_layers: tuple[int, ...]) -> list[Stage]:
        """The distinct stages of a split: among stages holding identical layers, only the lowest index is
        kept — it holds the most in-flight micro-batches, so it is the fullest and no slower than the others."""
        hit = self._stages.get(stage_layers)
        if hit is None:
            seen, hit = set(), []
            lay = self.profile.layers
            for st in split_stages(stage_layers):
                sig = (st.is_first, st.is_last) + tuple(
                    round(lay.between(k, st.first, st.last), 3) for k in lay.__dataclass_fields__)
                if sig not in seen:
                    seen.add(sig)
                    hit.append(st.with_sums(self.profile))
            self._stages[stage_layers] = hit
        return hit

    def stage_times(self, L: Layout, st: Stage) -> StageTimes:
        """Seconds of one micro-batch on stage ``st`` by term; the micro-batch time is the sum of all but the
        forward-only compute (:func:`microbatch_seconds`)."""
        return self._ep_exposed(L, st, self._stage_shared(L, st))

    def stage_times_interleaved(self, L: Layout, L_v: Layout, st: Stage) -> tuple[StageTimes, StageTimes]:
        """:meth:`stage_times` of ``L`` and of ``L_v``, the same layout with other virtual stages (only ``vpp``
        differs). Of the terms only the EP exposure reads ``vpp`` (the EP overlap's blockers,
        :func:`autopar.cost.ep.ep_overlap_blockers`); the rest :meth:`_stage_shared` keeps, priced once."""
        return self.stage_times(L, st), self.stage_times(L_v, st)

    def _stage_shared(self, L: Layout, st: Stage) -> tuple:
        """The terms of :meth:`stage_times` that do not read ``vpp``: (compute, forward compute, TP, CP exposed,
        the stage's kernel window W, T_ep times the imbalance, offload).

        Kept per stage and the layout fields these terms read, :data:`SHARED_TERM_FIELDS` (:func:`_memoised`):
        layouts that differ only in dp, ZeRO stage, gradient accumulation, virtual stages or HSDP price them once.
        Everything else they read (model, training, hardware, the calibrated overheads) is fixed per binding."""
        return _memoised(self._priced, st, "stage_shared", L, self._price_shared)

    def _price_shared(self, L: Layout, st: Stage) -> tuple:
        """:meth:`_stage_shared`'s terms, priced."""
        prof, tr, hw, net = self.profile, self.training, self.hardware, self.net
        t_tot, t_fwd = _compute.microbatch_time(prof, st, L, tr, self.kernels, self.layer_overhead_s,
                                                self.imbalance, self.moe_overhead_s,
                                                self.host_expert_s)
        gemm_w = kern_w = 0.0
        if (L.tp > 1 and (tr.tp_comm_overlap or tr.tp_dgrad_overlap)) or ((L.ep > 1 or L.etp > 1)
                                                                          and tr.ep_comm_overlap):
            gemm_w, kern_w = _compute.hiding_windows(prof, st, L, tr, self.kernels, self.imbalance)
        cp = self.cp_seconds(L, st)
        ep_total = ep_comm_seconds(prof, st, L, tr, net) * self.imbalance
        tp = tp_time_per_microbatch(prof, st, L, tr, hw, net, gemm_w, self.kernels)
        off = offload_time_per_microbatch(prof, st, L, tr, hw, t_fwd, t_tot) if L.offload_activations else 0.0
        return t_tot, t_fwd, tp, cp, kern_w, ep_total, off

    def cp_seconds(self, L: Layout, st: Stage) -> float:
        """The CP term of :meth:`stage_times` on stage ``st``: the exposed ring (``cp.cp_times``) plus what its hidden
        transfers cost the attention they hide under (``overlap.overlap_cost``). It reads tp, cp, the micro-batch
        and recompute of ``L``, and the stage's layers."""
        cp, cp_total = cp_times(self.profile, st, L, self.training, self.hardware, self.net, self.kernels)
        if L.cp > 1 and self.training.cp_comm_overlap:   # the ring's hidden transfers slow the attention they hide
            cp += overlap_cost(max(0.0, cp_total - cp), self.hardware, "sm", self.net.link(L.cp, L.tp))
        return cp

    def _ep_exposed(self, L: Layout, st: Stage, shared: tuple) -> StageTimes:
        """:class:`StageTimes` from :meth:`_stage_shared`'s terms and the EP exposure of ``L``."""
        prof, tr, hw, net = self.profile, self.training, self.hardware, self.net
        t_tot, t_fwd, tp, cp, kern_w, ep_total, off = shared
        ep = ep_time_per_microbatch(prof, st, L, tr, hw, net, self.imbalance, kern_w, ep_total)
        if tr.ep_comm_overlap and ep_total > ep:   # the partner micro-batch's kernels run beside the all-to-alls
            ep += overlap_cost(max(0.0, ep_total - ep), hw, "sm", net.link(L.ep, L.etp))
        return StageTimes(compute=t_tot, tp=tp, cp=cp, ep=ep, forward=t_fwd, offload=off)

    def stage_overhead_s(self, st: Stage) -> float:
        """Seconds per micro-batch on stage ``st`` that no kernel accounts for (``compute.overhead_time``: the
        calibrated per-layer and per-MoE-layer overheads): the part of :meth:`stage_times`' compute that
        :meth:`layer_seconds` leaves out."""
        return _compute.overhead_time(self.profile, st, self.layer_overhead_s, self.moe_overhead_s)

    def layer_seconds(self, L: Layout, kind: int) -> float:
        """Kernel seconds (forward + backward + recomputation) of one layer of kind ``kind`` (``profile.kinds``) for
        one micro-batch: what :meth:`stage_times`' compute sums over a stage's layers before it adds the head, the
        embedding gradient, ``layer_overhead_s`` per layer and the communication, none of them negative."""
        return _compute.layer_seconds(self.profile, kind, L, self.training, self.kernels, self.imbalance)

    def stage_tail(self, L: Layout, st: Stage, t_fwd: float | None = None,
                   t_bwd: float | None = None) -> tuple[float, float]:
        """(exposed DP/FSDP communication, optimizer) seconds per step of stage ``st``.

        The communication hides behind the kernels of a micro-batch: its forward ``t_fwd`` and its backward
        ``t_bwd``, the recomputation included (the micro-batch's compute less its forward), less the time the same
        link carries the stage's TP, CP and EP traffic of a micro-batch (forward and backward, the same for every
        recompute policy; :meth:`_link_busy`). Recomputation is hiding time: it runs inside the backward, layer by
        layer, while the gradient buckets already reduced by then and the prefetched gathers are in flight on their
        own streams (Megatron-Core's DDP buckets; Megatron-FSDP's reduce-scatter on its side stream and its
        backward-order prefetch, autopar.cost.dp). ``t_fwd`` and ``t_bwd`` (the micro-batch's forward and its
        backward with recomputation: ``StageTimes.forward`` and ``compute − forward``) may be passed when already
        known; with them, ``L.zero_stage``, ``L.micro_batch``, ``L.grad_accum`` and the times may be broadcastable
        numpy arrays (the search's tables), and the result is elementwise."""
        prof, tr, hw = self.profile, self.training, self.hardware
        dense, expert = stage_params(prof, st, L)
        if t_fwd is None or t_bwd is None:
            t_tot, t_fwd = self._stage_shared(L, st)[:2]
            t_bwd = t_tot - t_fwd
        dp_exposed, dp_total = dp_time_per_step(dense, expert, L, tr, hw, self.net, t_fwd, t_bwd,
                                                max(1, st.n_layers),
                                                # the memo's own dict: dp_time_per_step only reads it
                                                _memoised(self._priced, st, "link_busy", L, self._link_busy)
                                                if tr.dp_comm_overlap else None)
        # what hides slows the compute it hides under (NCCL kernels on SMs: autopar.cost.overlap), each sharding
        # group's share (by parameters) at its own link's rate
        hidden = dp_total - dp_exposed
        groups = ((dense, self.net.link(L.dp * L.cp, L.tp)), (expert, self.net.link(L.edp, L.ep * L.etp)))
        for params, link in groups:
            if params:
                dp_exposed = dp_exposed + overlap_cost(hidden * (params / (dense + expert)), hw, "sm", link)
        sd, se = shard_groups(L)
        p_local = dense / where(L.zero_stage >= 1, sd, 1) + expert / where(L.zero_stage >= 1, se, 1)
        return dp_exposed, optimizer_time(p_local, tr, hw)

    def _link_busy(self, L: Layout, st: Stage) -> dict[str, float]:
        """Seconds per micro-batch that NVLink and the network carry stage ``st``'s TP, CP and EP traffic (forward
        and backward, none hidden, at the mean expert load): what DP/FSDP traffic on the same link shares the
        bandwidth with. A group's traffic is put on the network when it spans NVLink domains. :meth:`stage_tail`
        keeps it as :meth:`_stage_shared`'s terms are (these volumes read no layout field beyond that key)."""
        prof, tr, net = self.profile, self.training, self.net
        busy = {"nvlink": 0.0, "network": 0.0}
        for t, n, stride in ((tp_comm_seconds(prof, st, L, tr, net, 2), L.tp, 1),
                             (cp_ring_seconds(prof, st, L, tr, net, 3), L.cp, L.tp),
                             (ep_comm_seconds(prof, st, L, tr, net, 2), L.ep * L.etp, 1)):
            if n > 1:   # t may be an array over the micro-batch (the search's tables)
                busy[net.link(n, stride)] += t
        return busy

    def compute_by_kernel(self, layout: Layout, *, resolved: bool = False) -> dict[str, float]:
        """Seconds per step of the slowest stage's compute by kernel class (dense GEMM, grouped GEMM, attention
        core, memory-bound, LM head + loss, per-layer overhead, recomputation): the ``compute`` term split up."""
        L = layout if resolved else self.resolve(layout)
        slowest = max(self.stages(L.stage_layers), key=lambda st: microbatch_seconds(self.stage_times(L, st)))
        per_mb = _compute.kernel_breakdown(self.profile, slowest, L, self.training, self.kernels,
                                           self.layer_overhead_s, self.imbalance, self.moe_overhead_s,
                                           self.host_expert_s)
        return {k: v * L.grad_accum for k, v in per_mb.items()}

    def estimate(self, layout: Layout, *, resolved: bool = False) -> Estimate:
        """Predict one layout. ``resolved=True`` skips validation (the caller resolved it already)."""
        L = layout if resolved else self.resolve(layout)
        prof, tr, hw = self.profile, self.training, self.hardware
        worst_mem: MemoryBreakdown | None = None
        worst_stage = 0
        slow = None  # (t_mb, StageTimes) of the slowest stage
        host = 0.0   # offloaded activation bytes in host memory (fullest stage)
        tail, tail_terms = -1.0, (0.0, 0.0)
        for st in self.stages(L.stage_layers):
            mem = stage_memory(prof, st, L, tr, hw)
            if worst_mem is None or mem.total > worst_mem.total:
                worst_mem, worst_stage = mem, st.index
            times = self.stage_times(L, st)
            t_mb = microbatch_seconds(times)
            if slow is None or t_mb > slow[0]:
                slow = (t_mb, times)
            if L.offload_activations:
                host = max(host, offloaded_activation_bytes(prof, st, L, tr))
            dp_t, opt_t = self.stage_tail(L, st, times.forward, times.compute - times.forward)
            if dp_t + opt_t > tail:
                tail, tail_terms = dp_t + opt_t, (dp_t, opt_t)
        return self.assemble(L, worst_mem, worst_stage, slow, tail_terms, host / GIB)

    def assemble(self, L: Layout, worst_mem: MemoryBreakdown, worst_stage: int, slow: tuple[float, StageTimes],
                 tail_terms: tuple[float, float], host_gib: float = 0.0) -> Estimate:
        """The Estimate from the fullest stage's memory, the slowest stage's (t_mb, :class:`StageTimes`) and the
        largest (exposed DP/FSDP, optimizer) tail."""
        prof, tr, hw = self.profile, self.training, self.hardware
        M = L.grad_accum
        t_mb, st_t = slow
        times = TimeBreakdown(
            compute=M * st_t.compute, tp=M * st_t.tp, cp=M * st_t.cp, ep=M * st_t.ep, dp=tail_terms[0],
            pp_bubble=bubble_time(L, t_mb), pp_p2p=p2p_time(L, tr, prof.hidden, hw, self.net),
            optimizer=tail_terms[1], offload=M * st_t.offload)
        notes = tuple(self.model.pricing_notes())
        if hw.host_memory_gib is not None and host_gib > hw.host_memory_gib:
            notes += (f"offloaded activations need {host_gib:.0f} GiB of host memory per GPU, more than the "
                      f"{hw.host_memory_gib:.0f} GiB {hw.name}'s reference server has",)
        step = times.total
        tok = tr.global_batch * tr.seq_len / (step * self.gpus)
        model_tflops = prof.model_flops_per_token * tok / 1e12
        return Estimate(
            layout=L, gpus=self.gpus, fits=worst_mem.total <= hw.hbm_gib, hbm_gib=hw.hbm_gib,
            memory_gib=worst_mem, time_s=times, tokens_per_s_per_gpu=tok, model_tflops_per_gpu=model_tflops,
            mfu=model_tflops * 1e12 / self.peak, bottleneck=times.largest(), worst_stage=worst_stage, notes=notes,
            host_offload_gib=host_gib)
