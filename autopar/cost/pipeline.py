"""Pipeline parallelism: the bubble and the stage-to-stage sends.

Bubble (Narayanan et al. 2021, arXiv 2104.04473 sec. 2.2.1-2.2.2): with M micro-batches of duration t on
each of p stages and v virtual stages per rank (interleaved 1F1B), fill and drain idle each stage for
(p − 1)·t/v, i.e. a fraction (p − 1)/(v·M + p − 1) of the step. autopar takes t from the slowest stage
(uneven stages: an approximation — faster stages idle longer, the critical path is the slowest stage).

Point-to-point: each micro-batch crosses every stage boundary once forward and once backward (v times per
rank when interleaved), b·(s/cp)·h·e bytes, split across the TP group when SP is on (Megatron scatters p2p
tensors over TP ranks). Stages are tp·cp·dp ranks apart; the sends on the critical path are
2·(v·M + p − 1) transfers, exposed fraction 1 − pp_overlap.
"""

from __future__ import annotations

from autopar.cost.collectives import Network
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import Layout
from autopar.specs.training import TrainingSpec


def bubble_fraction(pp: int, vpp: int, m: int) -> float:
    """(p − 1)/(v·M + p − 1): idle share of a 1F1B / interleaved-1F1B step."""
    return (pp - 1) / (vpp * m + pp - 1)


def bubble_time(L: Layout, t_mb: float) -> float:
    """Fill + drain time given the slowest stage's per-micro-batch time t_mb: (p − 1)·t_mb / v."""
    return (L.pp - 1) * t_mb / L.vpp


def p2p_time(L: Layout, tr: TrainingSpec, hidden: int, hw: HardwareSpec, net: Network) -> float:
    if L.pp == 1:
        return 0.0
    nbytes = L.micro_batch * (tr.seq_len / L.cp) * hidden * tr.activation_bytes / (L.tp if L.sp else 1)
    n_xfer = 2 * (L.vpp * L.grad_accum + L.pp - 1)
    return (1.0 - hw.efficiency.pp_overlap) * n_xfer * net.time("send_recv", nbytes, 2, L.tp * L.cp * L.dp)
