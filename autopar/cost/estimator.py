"""Assemble the terms into one prediction: per-GPU memory of the fullest stage and the step time.

Step time (the critical path of the slowest pipeline stage, Narayanan et al. 2021 sec. 3.5's composition):

    t_mb   = compute_mb + tp_mb + cp_mb + ep_mb            (slowest stage, one micro-batch)
    T_step = M·compute_mb + M·tp_mb + M·cp_mb + M·ep_mb     (steady state: compute, tp, cp, ep)
           + (p − 1)·t_mb / v                                (pp_bubble)
           + exposed p2p                                     (pp_p2p)
           + max over stages of (exposed DP/FSDP + optimizer) (dp, optimizer)

Throughput: tokens/s/GPU = B·s / (T_step · N); model TFLOP/s/GPU = F_token · tokens/s/GPU with F_token the
model's training FLOPs per token (no recomputation; see autopar.specs.model for how causal attention is
counted); MFU = model TFLOP/s / dense peak of the training precision (PaLM, arXiv 2204.02311 app. B).
"""

from __future__ import annotations

from autopar.cost import compute as _compute
from autopar.cost.collectives import Network
from autopar.cost.cp import cp_time_per_microbatch
from autopar.cost.dp import dp_time_per_step
from autopar.cost.ep import ep_time_per_microbatch
from autopar.cost.memory import shard_groups, stage_memory, stage_params
from autopar.cost.optimizer import optimizer_time
from autopar.cost.pipeline import bubble_time, p2p_time
from autopar.cost.profile import ModelProfile
from autopar.cost.result import Estimate, MemoryBreakdown, TimeBreakdown
from autopar.cost.stage import Stage, split_stages
from autopar.cost.tp import tp_time_per_microbatch
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import Layout, resolve_layout
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec


class Estimator:
    """Predicts memory and step time of layouts for one (model, hardware, training, gpus).

    Build once, call :meth:`estimate` many times (the search does): model-derived constants are computed in
    the constructor."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, training: TrainingSpec, gpus: int):
        self.model, self.hardware, self.training, self.gpus = model, hardware, training, gpus
        self.profile = ModelProfile(model, training)
        self.net = Network(hardware)
        self.peak = hardware.peak_tflops(training.precision) * 1e12
        self.flops_per_s = self.peak * hardware.efficiency.gemm_for(training.precision)
        self._stages: dict[tuple[int, ...], list[Stage]] = {}

    def resolve(self, layout: Layout, allow_cross_domain_tp: bool = True) -> Layout:
        return resolve_layout(layout, self.model, self.training, self.gpus, self.hardware, allow_cross_domain_tp)

    def estimate(self, layout: Layout, *, resolved: bool = False) -> Estimate:
        """Predict one layout. ``resolved=True`` skips validation (the caller resolved it already)."""
        L = layout if resolved else self.resolve(layout)
        prof, tr, hw, net = self.profile, self.training, self.hardware, self.net
        stages = self._stages.get(L.stage_layers)
        if stages is None:
            stages = self._stages[L.stage_layers] = split_stages(L.stage_layers)

        worst_mem: MemoryBreakdown | None = None
        worst_stage = 0
        slow = None  # (t_mb, compute, tp, cp, ep, fwd_time, bwd_time) of the slowest stage
        tail = 0.0
        tail_terms = (0.0, 0.0)
        for st in stages:
            mem = stage_memory(prof, st, L, tr, hw)
            if worst_mem is None or mem.total > worst_mem.total:
                worst_mem, worst_stage = mem, st.index
            fwd_f, tot_f = _compute.microbatch_flops(prof, st, L, tr.seq_len)
            t_comp = tot_f / self.flops_per_s
            t_tp = tp_time_per_microbatch(prof, st, L, tr, hw, net)
            t_cp = cp_time_per_microbatch(prof, st, L, tr, hw, net, self.flops_per_s)
            t_ep = ep_time_per_microbatch(prof, st, L, tr, hw, net)
            t_mb = t_comp + t_tp + t_cp + t_ep
            t_fwd = fwd_f / self.flops_per_s
            if slow is None or t_mb > slow[0]:
                slow = (t_mb, t_comp, t_tp, t_cp, t_ep, t_fwd, t_comp - t_fwd)
            dense, expert = stage_params(prof, st, L)
            dp_exposed, _ = dp_time_per_step(dense, expert, L, tr, hw, net, t_fwd, t_comp - t_fwd)
            sd, se = shard_groups(L)
            p_local = dense / (sd if L.zero_stage >= 1 else 1) + expert / (se if L.zero_stage >= 1 else 1)
            t_opt = optimizer_time(p_local, tr, hw)
            if dp_exposed + t_opt > tail:
                tail, tail_terms = dp_exposed + t_opt, (dp_exposed, t_opt)

        M = L.grad_accum
        t_mb, t_comp, t_tp, t_cp, t_ep, _, _ = slow
        times = TimeBreakdown(
            compute=M * t_comp, tp=M * t_tp, cp=M * t_cp, ep=M * t_ep, dp=tail_terms[0],
            pp_bubble=bubble_time(L, t_mb), pp_p2p=p2p_time(L, tr, prof.hidden, hw, net),
            optimizer=tail_terms[1])
        step = times.total
        tok = tr.global_batch * tr.seq_len / (step * self.gpus)
        model_tflops = prof.model_flops_per_token * tok / 1e12
        return Estimate(
            layout=L, gpus=self.gpus, fits=worst_mem.total <= hw.hbm_gib, hbm_gib=hw.hbm_gib,
            memory_gib=worst_mem, time_s=times, tokens_per_s_per_gpu=tok, model_tflops_per_gpu=model_tflops,
            mfu=model_tflops * 1e12 / self.peak, bottleneck=times.largest(), worst_stage=worst_stage)
