"""Data-parallel communication: gradient reduction and ZeRO/FSDP parameter gathers (Rajbhandari et al.
2020, arXiv 1910.02054 sec. 7: ZeRO-1/2 move 2Ψ per step like an all-reduce, ZeRO-3 3Ψ).

Groups: dense weights over dp·cp ranks tp apart (Megatron's dp-cp group); expert weights over edp ranks,
ep·etp apart in the stage's expert mesh. HSDP shards over ``hsdp_shard`` ranks and all-reduces the shards
across the replicas.

    ZeRO-0:   AR(grads)                         once per step
    ZeRO-1/2: RS(grads) + AG(weights)           once per step (Megatron distributed optimizer)
    ZeRO-3:   per micro-batch AG(weights) for forward and again for backward, RS(grads) (FSDP2 default)

Overlap (Megatron --overlap-grad-reduce / --overlap-param-gather; FSDP prefetch): the step's gradient
reduction can hide behind the backward pass of the last micro-batch and the parameter gather behind the
forward of the first; FSDP's per-micro-batch traffic hides behind that micro-batch's compute. What cannot
be hidden is exposed:  exposed = max(0, T_comm − dp_overlap · T_hiding_compute).
"""

from __future__ import annotations

from autopar.cost._select import where
from autopar.cost.collectives import Network
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import Layout
from autopar.specs.training import TrainingSpec


def _groups(L: Layout) -> list[tuple[str, int, int]]:
    """(which params, group size, stride) of the sharding groups."""
    dense_n, dense_stride = L.dp * L.cp, L.tp
    exp_n, exp_stride = L.edp, L.ep * L.etp
    if L.hsdp_shard:
        dense_n, exp_n = min(dense_n, L.hsdp_shard), min(exp_n, L.hsdp_shard)
    return [("dense", dense_n, dense_stride), ("expert", exp_n, exp_stride)]


def dp_time_per_step(dense: float, expert: float, L: Layout, tr: TrainingSpec, hw: HardwareSpec, net: Network,
                     t_fwd_mb: float, t_bwd_mb: float) -> tuple[float, float]:
    """(exposed seconds, total seconds) of data-parallel traffic per step for one GPU holding ``dense`` and
    ``expert`` parameters (before sharding). ``L.zero_stage``, ``L.grad_accum`` and the compute times may be
    broadcastable numpy arrays (the search's tables): the result is then elementwise."""
    ov = hw.efficiency.dp_overlap if tr.dp_comm_overlap else 0.0
    M = L.grad_accum
    z = L.zero_stage
    total = exposed = 0.0
    for (kind, n, stride), params in zip(_groups(L), (dense, expert)):
        if params == 0:
            continue
        g_bytes, w_bytes = params * tr.grad_bytes, params * tr.weight_bytes
        replicate = (L.dp * L.cp if kind == "dense" else L.edp) // n if L.hsdp_shard else 1
        # ZeRO-3 / FSDP: per micro-batch gathers and reduce-scatter, hidden behind that micro-batch's compute
        per_mb = 2 * net.time("all_gather", w_bytes, n, stride) + net.time("reduce_scatter", g_bytes, n, stride)
        tot3, exp3 = M * per_mb, M * _exposed(per_mb, ov * (t_fwd_mb + t_bwd_mb))
        if replicate > 1:  # HSDP: all-reduce the gradient shards across replicas once per step
            t = net.time("all_reduce", g_bytes / n, replicate, stride * n)
            tot3, exp3 = tot3 + t, exp3 + _exposed(t, ov * t_bwd_mb)
        # ZeRO-0: all-reduce the gradients; ZeRO-1/2: reduce-scatter them and all-gather the updated weights
        t_grad = where(z == 0, net.time("all_reduce", g_bytes, n, stride),
                       net.time("reduce_scatter", g_bytes, n, stride))
        t_param = where(z == 0, 0.0, net.time("all_gather", w_bytes, n, stride))
        tot12 = t_grad + t_param if n > 1 else 0.0
        exp12 = _exposed(t_grad, ov * t_bwd_mb) + _exposed(t_param, ov * t_fwd_mb) if n > 1 else 0.0
        total = total + where(z >= 3, tot3, tot12)
        exposed = exposed + where(z >= 3, exp3, exp12)
    return exposed, total


def _exposed(comm, hiding):
    """max(0, comm − hiding), elementwise for arrays."""
    return where(comm > hiding, comm - hiding, 0.0)
