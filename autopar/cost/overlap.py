"""What overlapping communication with compute costs the compute: one home for every overlapped collective.

Hiding a collective under compute is not free. While it runs, the compute beside it is slowed: an NCCL (or
Transformer Engine userbuffers pipeline/bulk) kernel occupies SMs the GEMMs would use, both stream through the
same HBM, and the extra power of the links and memory lowers the SM clock under the power limit (deepseek-ai/
DeepGEMM issue #120: H800 SM clocks fell from 1980 to 1575 MHz when GEMMs overlapped communication). Lee et
al. 2025, "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning: Performance
and Power Implications" (arXiv 2507.03114, abstract; 4 x A100, H100, MI250, MI210, GPT and Llama training
layers) measured compute overlapped with collectives at 18.9% slower on average (40.0% at most) than the same
compute alone. The hardware file states the slowdown per communication engine
(``kernel_model.overlap_slowdown``):

* ``sm``: collectives run by SM kernels (NCCL, RCCL, Transformer Engine's pipelined reduce-scatter and bulk
  overlaps, which reserve 16 SMs: TransformerEngine ``initialize_ub`` defaults ``num_sm: 16``,
  ``set_sm_margin: True`` for the ``pipeline`` and ``bulk`` methods);
* ``copy_engine``: point-to-point copies issued as ``cudaMemcpyAsync`` on the copy engines, which take no SM
  (Transformer Engine's ``ring_exchange`` all-gathers, ``use_ce: True``, ``num_sm: 1``; PyTorch's async-TP
  symmetric-memory copies, ``torch.distributed._symmetric_memory._pipelined_multi_all_gather_and_consume``).

The slowdowns were measured with collectives inside one NVLink domain. A collective that crosses the scale-out
network moves its bytes (through HBM, through the SMs of its kernel) at the NIC's rate, a fraction
r = B_net / B_nvl of that (B as in :mod:`autopar.cost.collectives`: link rate times its achieved fraction), for as
long; the slowdown is taken in proportion to the bytes per second, s·r. A slowdown s (the overlapped compute takes
1 + s times as long) costs, for h seconds of collective hidden under compute, the work the compute does not do in
that time:

    cost = h · s_r / (1 + s_r),   s_r = s · r,   r = 1 (NVLink) or B_net / B_nvl (network)
    h: hidden (not exposed) communication seconds

An approximation: the slowdown is a mean over the measured layers (the paper's range is 0-40%), the same for
every kernel class the collective hides under, linear in the collective's byte rate; the exposed part of a
collective (nothing to hide under) is not slowed by it.
"""

from __future__ import annotations

from typing import Literal

from autopar.specs.hardware import HardwareSpec

Engine = Literal["sm", "copy_engine"]
Link = Literal["nvlink", "network"]


def overlap_cost(hidden_s, hw: HardwareSpec, engine: Engine = "sm", link: Link = "nvlink"):
    """Seconds the compute loses to ``hidden_s`` seconds of communication hidden under it, on ``hw``'s
    ``kernel_model.overlap_slowdown[engine]``, for a collective on ``link`` (module docstring). ``hidden_s`` may be
    a numpy array (the search's tables); the result is then elementwise. Zero when nothing is hidden."""
    s = hw.kernel_model.overlap_slowdown[engine] * link_rate(hw, link)
    return hidden_s * (s / (1.0 + s))


def link_rate(hw: HardwareSpec, link: Link) -> float:
    """r: the byte rate of a collective on ``link`` over an NVLink collective's (1 for NVLink)."""
    if link == "nvlink":
        return 1.0
    km = hw.kernel_model
    return min(1.0, hw.scaleout_gbps * km.scaleout / (hw.nvlink_gbps * km.nvlink))
