"""Mixed precision and the optimizer: Megatron-LM's memory scheme, and the learning-rate warm-up.

The scheme (Micikevicius et al. 2018, "Mixed Precision Training"; Megatron-LM's distributed optimizer,
``--use-distributed-optimizer``; the tutorial's 2 + 2 + 12 bytes per parameter, Rajbhandari et al. 2020 sec. 3.1):

- model weights in ``TrainingSpec.weight_dtype`` (bf16 by default): forward and backward run in that dtype,
  no autocast;
- an fp32 main copy of every low-precision weight and the two fp32 Adam moments live in the optimizer
  (:class:`MainParamOptimizer`), 12 B per parameter;
- gradients in the weights' dtype, accumulated over micro-batches in place.

How ZeRO shards it here (fsdp.py maps the stages onto FSDP2): with ZeRO >= 1 and dp·cp > 1 the dense weights
are FSDP2 parameters kept as fp32 SHARDS (the fp32 main weights, 4 B / (dp·cp) per parameter), gathered in
the weights' dtype for forward and backward (``MixedPrecisionPolicy(param_dtype=weight dtype,
reduce_dtype=grad_dtype)``), their gradients reduce-scattered in ``grad_dtype`` and kept as fp32 shards, and
the Adam moments sharded with them. So under FSDP there is no separate bf16 copy at rest and the gradient
shards are fp32: 4 + 4 + 8 B per parameter over dp·cp ranks, plus the gathered bf16 weights during the step,
against Megatron's 2 B (all ranks) + 2 B grads + 12 B / dp of ZeRO-1. Routed experts are never FSDP
parameters: they follow the unsharded scheme (weights and grads in the weights' dtype, fp32 main + moments
unsharded over the expert-data-parallel group).

On the CPU (gloo) the weights are fp32 by default: bf16 matrix multiplication runs far slower than fp32 on
most CPU backends and the CPU runs check the layout, not the numerics. Then the weights are their own main
copy (no second fp32 copy: 4 + 4 + 8 B per parameter). ``dtype: bf16`` in the run spec runs the GPU scheme on
the CPU (tests).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn as nn

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def weight_dtype(requested: str, training_weight_dtype: str, cuda: bool) -> torch.dtype:
    """The model weights' dtype: ``requested`` ("auto", "fp32", "bf16", "fp16"); "auto" is the training spec's
    weight dtype on CUDA and fp32 on the CPU."""
    if requested == "auto":
        return TORCH_DTYPES[training_weight_dtype] if cuda else torch.float32
    if requested not in TORCH_DTYPES:
        raise ValueError(f"dtype must be auto, fp32, bf16 or fp16 (got {requested!r})")
    return TORCH_DTYPES[requested]


def dtype_name(d: torch.dtype) -> str:
    return {v: k for k, v in TORCH_DTYPES.items()}[d]


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank stores (a DTensor's local shard, a plain tensor itself)."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def _local_grad(p: nn.Parameter) -> torch.Tensor | None:
    if p.grad is None:
        return None
    g = p.grad
    if hasattr(g, "placements") and g.placements != p.placements:
        g = p.grad = g.redistribute(p.device_mesh, p.placements)
    return local(g)


class MainParamOptimizer:
    """AdamW (or SGD, tests) over fp32 main weights. A parameter stored in fp32 is its own main weight; a
    low-precision one (bf16/fp16, possibly a DTensor shard) gets an fp32 copy of its local tensor here, its
    gradient is cast to fp32 just before its update and the updated main weight is cast back into it.

    One torch optimizer per parameter, stepped one after the other (both optimizers are elementwise, so this
    is the same update): only one parameter's fp32 gradient copy exists at a time, as in Megatron's optimizer,
    where the fp32 gradient of a shard is a view of the main-gradient buffer rather than a second full copy."""

    def __init__(self, params: Iterable[nn.Parameter], *, kind: str = "adamw", lr: float = 3e-4,
                 betas: tuple[float, float] = (0.9, 0.95), weight_decay: float = 0.1):
        self.pairs: list[tuple[nn.Parameter, nn.Parameter | None]] = []
        self.opts: list[torch.optim.Optimizer] = []
        for p in params:
            m = None if p.dtype == torch.float32 else nn.Parameter(local(p).detach().float().clone())
            self.pairs.append((p, m))
            target = [p if m is None else m]
            if kind == "sgd":
                self.opts.append(torch.optim.SGD(target, lr=lr, foreach=False))
            else:
                self.opts.append(torch.optim.AdamW(target, lr=lr, betas=betas, weight_decay=weight_decay,
                                                   foreach=False))

    def set_lr(self, lr: float) -> None:
        for opt in self.opts:
            for group in opt.param_groups:
                group["lr"] = lr

    @torch.no_grad()
    def step(self) -> None:
        for (p, m), opt in zip(self.pairs, self.opts):
            if m is None:
                opt.step()
                continue
            g = _local_grad(p)
            if g is None:
                continue
            m.grad = g.float()
            opt.step()
            m.grad = None
            local(p).copy_(m)

    def zero_grad(self) -> None:
        for p, m in self.pairs:
            p.grad = None
            if m is not None:
                m.grad = None

    # ---- memory, term by term (bytes this rank stores, read from the tensors) ----------------------------
    def weight_bytes(self) -> int:
        return sum(_nbytes(local(p)) for p, _ in self.pairs)

    def grad_bytes(self) -> int:
        return sum(_nbytes(local(p.grad)) for p, _ in self.pairs if p.grad is not None)

    def optimizer_bytes(self) -> int:
        """fp32 main copies (of low-precision weights) + every optimizer state tensor (Adam's two moments)."""
        mains = sum(_nbytes(m) for _, m in self.pairs if m is not None)
        state = sum(_nbytes(local(v)) for opt in self.opts for s in opt.state.values() for v in s.values()
                    if torch.is_tensor(v) and v.dim() > 0)
        return mains + state


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def warmup_lr(step: int, peak: float, warmup_steps: int) -> float:
    """Linear warm-up to ``peak`` over ``warmup_steps`` steps, then constant (Goyal et al. 2017, "Accurate,
    Large Minibatch SGD", sec. 2.2; Megatron-LM's ``--lr-warmup-iters``). ``step`` counts from 0, and step 0
    already trains at peak / warmup_steps."""
    if warmup_steps <= 0:
        return peak
    return peak * min(1.0, (step + 1) / warmup_steps)


def describe(wdtype: torch.dtype, grad_dtype: str, fsdp_wrapped: bool, zero_stage: int, cuda: bool,
             moe: bool = False) -> str:
    """One line stating the memory scheme this rank ran."""
    w = dtype_name(wdtype)
    where = "" if cuda or wdtype != torch.float32 else " (CPU: fp32, bf16 matmul is slow on CPU backends)"
    if wdtype == torch.float32:
        mains = "fp32 weights are their own main copy"
    else:
        mains = "fp32 main weights in the optimizer"
    if fsdp_wrapped:
        red = dtype_name(TORCH_DTYPES[grad_dtype]) if wdtype != torch.float32 else "fp32"
        return (f"weights {w}{where}; dense weights as fp32 FSDP2 shards gathered in {w} (ZeRO-{zero_stage} "
                f"over dp·cp), grads reduce-scattered in {red} and kept as fp32 shards, Adam moments fp32 sharded"
                + (f"; routed experts: {w} weights and grads, {mains}, Adam moments fp32 unsharded" if moe else ""))
    g = f"grads {w}"
    if wdtype != torch.float32 and grad_dtype != w:
        g += f" (grad_dtype {grad_dtype} is applied only to FSDP-reduced grads)"
    return (f"weights {w}{where}, {g}, {mains}, Adam moments fp32; nothing sharded "
            f"(ZeRO-{zero_stage}, or dp·cp = 1)")
