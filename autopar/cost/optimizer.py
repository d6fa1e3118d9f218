"""Optimizer step: Adam is memory-bound (a few FLOPs per byte), so its time is the bytes it touches over the
achievable HBM bandwidth (as the example analysis report models AdamW).

P_local is the parameters this GPU updates: its stage share divided by the ZeRO group when z >= 1. Bytes per
parameter, with g the reduced gradient (``TrainingSpec.grad_bytes``, fp32 under fsdp2), o the optimizer state (master weight and
both moments, ``optimizer_bytes``), s one moment, m the master weight (the parameter itself when there is none) and
w the model weight:

* fused (``optimizer_impl`` fused: Megatron-Core / Transformer Engine FusedAdam, torch ``fused=True``): one kernel
  reads the gradient, the master weight and both moments and writes the master weight, both moments and the model
  weight:
      bytes = g + 2·o + w
* foreach (torch.optim.AdamW's default multi-tensor path, ``foreach=True``, as torchtitan@9dec370
  torchtitan/optimizer.py builds it unless --optimizer.fused): one pass per elementwise op
  (torch/optim/adam.py ``_multi_tensor_adam``, decoupled weight decay, not capturable): mul_(p) 2m;
  lerp_(m1, g) 2s + g; mul_(m2) 2s; addcmul_(m2, g, g) 2s + g; t = sqrt(m2) 2s; div_(t) 2s; add_(t, eps) 2s;
  addcdiv_(p, m1, t) 2m + 2s (t in the moment dtype):
      bytes = 4·m + 14·s + 2·g
  and torch.nn.utils.clip_grad_norm_ before it (torchtitan@9dec370 train.py, --training.max_norm 1.0 by
  default): a norm pass reading every gradient and a rescale that reads and writes it (torch multiplies by
  min(1, max_norm / norm) unconditionally): + 3·g. (Megatron's own clipping, a norm read and a rescale only when
  the norm exceeds the limit, is not counted on the fused path: an approximation of g bytes per parameter.)

    T = P_local · bytes / (hbm_tbps · 1e12 · kernel_model.hbm)
"""

from __future__ import annotations

from autopar.specs.hardware import HardwareSpec
from autopar.specs.training import DTYPE_BYTES, TrainingSpec


def optimizer_bytes_per_param(tr: TrainingSpec) -> float:
    """HBM bytes the optimizer step (and torch's gradient clipping on the foreach path) moves per local parameter
    (module docstring)."""
    g = tr.grad_bytes
    if tr.optimizer_impl == "foreach":
        s = DTYPE_BYTES[tr.optimizer_state_dtype]
        m = DTYPE_BYTES["fp32"] if tr.master_weights_dtype == "fp32" else tr.weight_bytes
        return 4 * m + 14 * s + 2 * g + 3 * g
    return g + 2 * tr.optimizer_bytes + tr.weight_bytes


def optimizer_time(p_local: float, tr: TrainingSpec, hw: HardwareSpec) -> float:
    return p_local * optimizer_bytes_per_param(tr) / (hw.hbm_tbps * 1e12 * hw.kernel_model.hbm)
