"""Kernel microbenchmarks on one device: GEMM throughput and memory bandwidth.

What is measured
  * GEMM TFLOP/s per precision, at the model's QKV / attention-output / MLP shapes for ``tokens`` rows
    (micro-batch x sequence length) when a model is given, else at a standard square set. The per-precision
    figure is total FLOPs / total time over the shapes (a FLOP-weighted harmonic mean, the way a step's math
    mixes them). FLOPs of (M x K) @ (K x N): 2·M·N·K.
  * Memory copy bandwidth (``hbm_tbps`` of a CPU description): bytes read + written per second of a large copy.

The per-kernel-class tables of the hardware file's ``kernels:`` section are in :mod:`autopar.measure.kernel_tables`.
torch is imported inside functions only: planning code that imports this module never loads it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from autopar.specs.model import ModelSpec

MIB = 2 ** 20

# ---- GEMM -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GemmShape:
    """One GEMM (M x K) @ (K x N): M rows (tokens), K the reduction dim, N the output columns."""

    label: str
    m: int
    k: int
    n: int

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n


def gemm_shapes(model: ModelSpec | None, tokens: int, *, square: tuple[int, ...] = (512, 1024, 2048)) -> list[GemmShape]:
    """The forward GEMMs of one transformer layer for ``tokens`` rows, or a square set without a model.

    QKV: h -> (a + 2g)·d (MLA: the Q projection plus the joint KV down-projection); attention output: a·d_v -> h;
    MLP: h -> f (x2 when gated: gate and up fused) and f -> h. An MoE model adds one routed expert's GEMMs at
    the average rows an expert sees, tokens·top_k / num_experts."""
    if model is None:
        return [GemmShape(f"square{s}", s, s, s) for s in square]
    h, a = model.hidden_size, model.num_attention_heads
    if model.mla:
        qkv_n = a * model.qk_head_dim + model.mla.kv_lora_rank + model.mla.qk_rope_head_dim
    else:
        qkv_n = (a + 2 * model.kv_heads) * model.dim_per_head
    gate = 2 if model.gated_mlp else 1
    f = model.ffn_hidden_size
    shapes = [GemmShape("qkv", tokens, h, qkv_n), GemmShape("attn_out", tokens, a * model.v_head_dim, h),
              GemmShape("mlp_up", tokens, h, gate * f), GemmShape("mlp_down", tokens, f, h)]
    if model.moe:
        rows = max(1, tokens * model.moe.top_k // model.moe.num_experts)
        ef = model.moe.expert_ffn_hidden_size
        shapes += [GemmShape("expert_up", rows, h, gate * ef), GemmShape("expert_down", rows, ef, h)]
    return shapes


def _fit_to_budget(shape: GemmShape, max_flops: float, max_weight_elems: float) -> GemmShape:
    """Shrink a shape for a slow device: fewer rows (down to 64) to stay under ``max_flops``, then fewer output
    columns (as a tensor-parallel shard would have) to keep the weight under ``max_weight_elems``."""
    m, k, n = shape.m, shape.k, shape.n
    if k * n > max_weight_elems:
        n = max(64, int(max_weight_elems // k))
    if 2.0 * m * k * n > max_flops:
        m = max(64, int(max_flops // (2.0 * k * n)))
    if (m, n) == (shape.m, shape.n):
        return shape
    return GemmShape(f"{shape.label}*", m, k, n)


def _device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def _precisions_for(device: str) -> list[str]:
    if device == "cuda":
        import torch
        return ["bf16", "fp16"] + (["fp32"] if torch.cuda.get_device_capability() < (8, 0) else [])
    return ["fp32", "bf16", "fp16"]


def measure_gemm(shapes: list[GemmShape], precisions: list[str] | None = None, *, device: str | None = None,
                 min_time_s: float = 0.15, threads: int | None = None,
                 progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Time each shape in each precision on one device; returns per-shape and per-precision TFLOP/s.

    Each precision is first probed with a 256^3 GEMM; one running under 5% of the fastest probe (fp16 on most
    CPUs, which emulate it) is reported at the probe only. On CPU the shapes are cut to a FLOP budget (see
    ``_fit_to_budget``); cut shapes carry a '*' in their label. ``threads``: CPU threads to use (default:
    torch's current setting)."""
    import torch
    dev = device or _device()
    if threads is not None and dev == "cpu":
        saved = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            out = measure_gemm(shapes, precisions, device=dev, min_time_s=min_time_s, progress=progress)
        finally:
            torch.set_num_threads(saved)
        out["threads"] = threads
        return out
    say = progress or (lambda _m: None)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    precisions = precisions or _precisions_for(dev)

    def sync() -> None:
        if dev == "cuda":
            torch.cuda.synchronize()

    def time_one(m: int, k: int, n: int, dtype: Any) -> float:
        """Seconds of the fastest repetition: a peak, not a typical time (on a shared machine the median
        would also count other people's work)."""
        a = torch.randn(m, k, device=dev).to(dtype)
        b = torch.randn(k, n, device=dev).to(dtype)
        a @ b  # warm-up (kernel selection, page faults)
        sync()
        times: list[float] = []
        start = time.perf_counter()
        while True:
            t = time.perf_counter()
            a @ b
            sync()
            times.append(time.perf_counter() - t)
            if time.perf_counter() - start >= min_time_s or len(times) >= 50:
                return min(times)

    if dev == "cpu":
        max_flops, max_weight = 4e10, 64e6
    else:
        max_flops, max_weight = 1e15, 4e9
    out: dict[str, Any] = {"device": dev, "shapes": [], "tflops": {}, "probe_only": []}
    probes: dict[str, float] = {}
    for prec in precisions:
        try:
            probes[prec] = 2.0 * 256 ** 3 / time_one(256, 256, 256, dtypes[prec]) / 1e12
        except RuntimeError as err:  # dtype not supported by this device's matmul
            say(f"gemm {prec}: not supported ({str(err).splitlines()[0][:80]})")
    best = max(probes.values(), default=0.0)
    for prec, probe in probes.items():
        dtype = dtypes[prec]
        if probe < 0.05 * best:  # emulated (fp16 on most CPUs): full shapes would take minutes
            out["tflops"][prec] = probe
            out["probe_only"].append(prec)
            out["shapes"].append({"precision": prec, "label": "probe256", "m": 256, "k": 256, "n": 256,
                                  "seconds": 2.0 * 256 ** 3 / probe / 1e12, "tflops": probe})
            say(f"gemm {prec}: {probe * 1e3:.2f} GFLOP/s at 256^3 (under 5% of the fastest precision: probe only)")
            continue
        total_flops = total_time = 0.0
        for shape in shapes:
            s = _fit_to_budget(shape, max_flops, max_weight)
            t = time_one(s.m, s.k, s.n, dtype)
            tf = s.flops / t / 1e12
            total_flops += s.flops
            total_time += t
            out["shapes"].append({"precision": prec, "label": s.label, "m": s.m, "k": s.k, "n": s.n,
                                  "seconds": t, "tflops": tf})
            say(f"gemm {prec} {s.label:<10} {s.m}x{s.k}x{s.n}: {tf * 1e3:,.1f} GFLOP/s")
        out["tflops"][prec] = total_flops / total_time / 1e12
    return out


def measure_copy_bandwidth(*, device: str | None = None, mib: int = 256, threads: int | None = None) -> float:
    """Best-of-5 bandwidth of copying a ``mib`` MiB buffer, TB/s, counting bytes read plus written."""
    import torch
    dev = device or _device()
    if threads is not None and dev == "cpu":
        saved = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return measure_copy_bandwidth(device=dev, mib=mib)
        finally:
            torch.set_num_threads(saved)
    if dev == "cuda":
        mib = 4 * mib
    n = mib * MIB // 4
    src = torch.ones(n, device=dev)
    dst = torch.empty_like(src)
    best = math.inf
    for _ in range(6):
        if dev == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src)
        if dev == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return 2.0 * n * 4 / best / 1e12


