"""Activation offloading: the exposed time of moving stored activations to host memory and back.

With offloading (see :mod:`autopar.cost.memory`), each micro-batch's stored activations of the stage,

    A_mb = f · b·s · e · kept  (bytes; f the offloaded fraction, b micro-batch, s sequence, e activation bytes,
                                kept the per-token stored elements of the stage's layers from
                                ``activation_elems_per_token``)

cross the GPU-host link twice: device-to-host during the forward pass and host-to-device during the backward
pass, on a copy stream beside the compute stream (Megatron-Core's CPU activation offloading; PyTorch
``save_on_cpu`` with pinned buffers). One transfer takes

    t_copy = A_mb / (B_host · η_host)

with B_host = ``hardware.host_link_gbps`` (PCIe or NVLink-C2C, per GPU per direction) and
η_host = ``kernel_model.host_link``. Each copy hides behind the pass it runs beside, so per micro-batch

    exposed = max(0, t_copy − t_fwd) + max(0, t_copy − t_bwd),    t_bwd = t_mb − t_fwd (recompute included).

An approximation: the copies of the first and last layer of a pass cannot overlap and are not counted.
"""

from __future__ import annotations

from autopar.cost.memory import activation_elems_per_token, linear_input_scale
from autopar.cost.layer_sums import ModelProfile
from autopar.cost.stage import Stage
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import Layout
from autopar.specs.training import TrainingSpec


def offload_time_per_microbatch(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, hw: HardwareSpec,
                                t_fwd: float, t_total: float) -> float:
    """Exposed seconds of the offload copies of one micro-batch on stage ``st`` (0 without offloading)."""
    if not L.offload_activations or hw.host_link_gbps is None:
        return 0.0
    kept, _ = activation_elems_per_token(prof, st, L, linear_input_scale(tr))
    t_copy = (L.offload_activations * L.micro_batch * tr.seq_len * tr.activation_bytes * kept
              / (hw.host_link_gbps * 1e9 * hw.kernel_model.host_link))
    return max(0.0, t_copy - t_fwd) + max(0.0, t_copy - (t_total - t_fwd))
