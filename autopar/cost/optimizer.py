"""Optimizer step: Adam is memory-bound (a few FLOPs per byte), so its time is the bytes it touches over the
achievable HBM bandwidth (as the example analysis report models AdamW).

Per local parameter the update reads the gradient (grad_dtype), the master weight and both moments
(optimizer_bytes) and writes the master weight, both moments and the model weight (weight_dtype):
    bytes = P_local · (g + 2·o + w),   T = bytes / (hbm_tbps · 1e12 · kernel_model.hbm)
P_local is the parameters this GPU updates: its stage share divided by the ZeRO group when z >= 1.
"""

from __future__ import annotations

from autopar.specs.hardware import HardwareSpec
from autopar.specs.training import TrainingSpec


def optimizer_time(p_local: float, tr: TrainingSpec, hw: HardwareSpec) -> float:
    nbytes = p_local * (tr.grad_bytes + 2 * tr.optimizer_bytes + tr.weight_bytes)
    return nbytes / (hw.hbm_tbps * 1e12 * hw.kernel_model.hbm)
