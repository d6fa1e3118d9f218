"""Kernel-class microbenchmarks for the hardware file's ``kernels:`` section (schema: :class:`KernelTables`,
docs/measurement.md). Each class the cost model prices separately is timed on this device:

* **GEMM by shape** ``[M, N, K, TFLOP/s]``: (M x K) @ (K x N), 2·M·N·K FLOPs. The model's layer GEMMs at
  ``tokens`` rows, a square sweep, and small-M and small-N sweeps at the model's hidden size (small token counts
  per micro-batch, tensor-parallel shards). In bf16, and on CUDA devices with FP8 tensor cores also in fp8
  (``torch._scaled_mm``, e4m3 operands, per-tensor scales, bf16 output).
* **Grouped GEMM** ``[tokens_per_expert, N, K, num_experts, TFLOP/s]``: ``num_experts`` GEMMs of
  (t x K) @ (K x N) in one call (``torch._grouped_mm`` on CUDA when it runs, else ``torch.bmm`` over equal
  groups: balanced routing), 2·t·N·K FLOPs per expert; the model's expert up/down shapes over a sweep of t.
* **Flash attention** ``[seq, head_dim, causal, fwd TFLOP/s, bwd TFLOP/s]``:
  ``torch.nn.functional.scaled_dot_product_attention`` (flash backend on CUDA). FLOPs as FlashAttention counts
  them (Dao 2023, FlashAttention-2, §4.1; ``benchmarks/benchmark_flash_attention.py``): forward
  4·s·s·d per head and sequence, half of it when causal; backward 2.5x the forward. Shapes as the
  FlashAttention-3 paper's benchmarks (Shah et al. 2024, §4.1): 16K tokens per batch (batch = 16384 / s, at
  least 1), hidden 2048 (heads = 2048 / d).
* **Memory-bound kernels**, achieved GB/s (1e9 B/s) with bytes counted as each input read once and each output
  written once (an ideal fused kernel's traffic): ``copy`` (2 tensors), ``rmsnorm`` (x in, y out),
  ``swiglu`` (gate, up in; out), ``cross_entropy`` (tokens x vocab logits read once; the per-token loss is
  negligible). torch eager runs SwiGLU as two kernels and cross-entropy as log-softmax + NLL, so their rates
  are those of an unfused implementation, below what a fused kernel reaches on the same bytes.
* **Host copies**: pinned host -> device and device -> host GB/s (CUDA only).

Each figure is the fastest repetition (a peak, not a typical time: on a shared machine the median also counts
other people's work). On CPU (no accelerator) the shapes are tiny, so the tables run in seconds; they describe
the CPU only as a stand-in for tests and the CPU runner, whose math is ``cpu_math`` (fp32 by default) and is
filed under ``bf16``, the way ``peak_tflops_bf16`` holds that rate.

torch is imported inside functions only.
"""

from __future__ import annotations

import platform
import socket
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from autopar.measure.kernels import gemm_shapes
from autopar.specs.hardware import HardwareSpec, KernelModel, KernelTables
from autopar.specs.model import ModelSpec

# FlashAttention-3 paper's benchmark setting (Shah et al. 2024, §4.1): 16K tokens per batch, hidden 2048.
ATTN_TOKENS = 16384
ATTN_HIDDEN = 2048
BWD_OVER_FWD_FLOPS = 2.5   # FlashAttention-2 benchmark convention: backward = 2.5 x forward FLOPs


@dataclass(frozen=True)
class KernelPlan:
    """The shapes to time."""

    gemm: list[tuple[int, int, int]]                  # (M, N, K)
    grouped: list[tuple[int, int, int, int]]          # (tokens_per_expert, N, K, num_experts)
    attention: list[tuple[int, int, int, int, int]]   # (batch, heads, seq, head_dim, causal)
    memory_elems: tuple[int, int]                     # (rows, hidden) of the memory-bound tensors
    ce_shape: tuple[int, int]                         # (tokens, vocab) of the cross-entropy logits
    host_copy_bytes: int
    min_time_s: float
    max_reps: int


def plan_for(model: ModelSpec | None, tokens: int, *, tiny: bool) -> KernelPlan:
    """What to time: at the model's shapes and the sweeps of the module docstring; ``tiny`` (CPU, tests):
    the same kinds of shapes, each a few milliseconds at most."""
    h = model.hidden_size if model else (128 if tiny else 4096)
    if tiny:
        layer = [(min(g.m, 128), min(g.n, 128), min(g.k, 128)) for g in gemm_shapes(model, min(tokens, 128))] \
            if model else []
        gemm = layer + [(s, s, s) for s in (32, 64, 128)] + [(m, 64, 64) for m in (8, 16)]
        grouped = [(t, 64, 32, 4) for t in (8, 32)]
        attention = [(1, 2, s, d, c) for s in (64, 128) for d in (16, 32) for c in (0, 1)]
        return KernelPlan(gemm=list(dict.fromkeys(gemm)), grouped=grouped, attention=attention,
                          memory_elems=(64, 256), ce_shape=(32, 512), host_copy_bytes=1 << 16,
                          min_time_s=0.002, max_reps=3)
    layer = [(g.m, g.n, g.k) for g in gemm_shapes(model, tokens)] if model else []
    squares = [(s, s, s) for s in (256, 512, 1024, 2048, 4096, 8192)]
    small_m = [(m, h, h) for m in (64, 128, 256, 512, 1024, 2048)]
    small_n = [(tokens, n, h) for n in (128, 256, 512, 1024, 2048)]
    gemm = list(dict.fromkeys(layer + squares + small_m + small_n))
    if model is not None and model.moe:
        ef, experts = model.moe.expert_ffn_hidden_size, model.moe.num_experts
    else:
        ef, experts = 1536, 64
    gate = 2 if (model is None or model.gated_mlp) else 1
    local = min(experts, 8)    # experts on one GPU in an EP layout: 8 is a typical EP shard
    grouped = [(t, n, k, local) for t in (16, 64, 256, 1024, 4096) for n, k in ((gate * ef, h), (h, ef))]
    head_dims = sorted({64, 128, 192} | ({model.dim_per_head} if model else set()))
    attention = [(max(1, ATTN_TOKENS // s), max(1, ATTN_HIDDEN // d), s, d, c)
                 for s in (1024, 2048, 4096, 8192, 16384, 32768) for d in head_dims for c in (0, 1)]
    vocab = model.vocab_size if model else 128256
    return KernelPlan(gemm=gemm, grouped=grouped, attention=attention, memory_elems=(tokens, max(h, 4096)),
                      ce_shape=(tokens, vocab), host_copy_bytes=256 << 20, min_time_s=0.05, max_reps=20)


def _sig(x: float) -> float:
    """Four significant digits (a measured rate carries no more)."""
    return float(f"{x:.4g}")


def attention_flops(batch: int, heads: int, seq: int, head_dim: int, causal: int) -> tuple[float, float]:
    """(forward, backward) FLOPs of flash attention, FlashAttention's convention (see the module docstring)."""
    fwd = 4.0 * batch * heads * seq * seq * head_dim * (0.5 if causal else 1.0)
    return fwd, BWD_OVER_FWD_FLOPS * fwd


@dataclass
class _Timer:
    device: str
    min_time_s: float
    max_reps: int

    def best(self, fn: Callable[[], Any]) -> float:
        """Seconds of the fastest of up to ``max_reps`` calls (at least 2), after one warm-up call."""
        import torch
        sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)
        fn()
        sync()
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < 2 or (time.perf_counter() - start < self.min_time_s and len(times) < self.max_reps):
            t = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t)
        return min(times)


def _oom_types() -> tuple[type[BaseException], ...]:
    import torch
    return (torch.cuda.OutOfMemoryError, MemoryError) if hasattr(torch.cuda, "OutOfMemoryError") else (MemoryError,)


def _matmul(m: int, n: int, k: int, precision: str, dtype: Any, device: str) -> Callable[[], Any]:
    """(M x K) @ (K x N) in ``precision``: a plain matmul, or for fp8 ``torch._scaled_mm`` on e4m3 operands
    with per-tensor scales and a bf16 output (how Transformer Engine's per-tensor FP8 recipe runs a GEMM)."""
    import torch
    if precision == "fp8":
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()      # column-major, as cuBLASLt wants
        one = torch.ones((), device=device, dtype=torch.float32)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)
    return lambda: a @ b


def _gemm_precisions(device: str) -> list[str]:
    """bf16 everywhere; fp8 too on CUDA devices with FP8 tensor cores (compute capability 8.9 and up)."""
    import torch
    if device == "cuda" and torch.cuda.get_device_capability() >= (8, 9) and hasattr(torch, "_scaled_mm"):
        return ["bf16", "fp8"]
    return ["bf16"]


def _gemm(plan: KernelPlan, timer: _Timer, dtype: Any, say: Callable[[str], None]) -> dict[str, list[list[float]]]:
    out: dict[str, list[list[float]]] = {}
    for prec in _gemm_precisions(timer.device):
        rows = []
        for m, n, k in plan.gemm:
            try:
                t = timer.best(_matmul(m, n, k, prec, dtype, timer.device))
            except _oom_types():
                say(f"gemm {prec} {m}x{n}x{k}: out of memory, skipped")
                continue
            except RuntimeError as err:   # e.g. an fp8 shape cuBLASLt does not take (dims must be multiples of 16)
                say(f"gemm {prec} {m}x{n}x{k}: not run ({str(err).splitlines()[0][:80]})")
                continue
            tf = 2.0 * m * n * k / t / 1e12
            rows.append([m, n, k, _sig(tf)])
            say(f"gemm {prec} M={m} N={n} K={k}: {tf:,.3g} TFLOP/s")
        if rows:
            out[prec] = rows
    return out


def _grouped_call(x: Any, w: Any, t: int, e: int, device: str) -> tuple[Callable[[], Any], str]:
    """A grouped GEMM of e groups of t rows: torch._grouped_mm on CUDA when it accepts the operands, else bmm."""
    import torch
    if device == "cuda" and hasattr(torch, "_grouped_mm"):
        offs = torch.arange(t, t * e + 1, t, device=device, dtype=torch.int32)
        flat = x.reshape(e * t, -1)
        try:
            torch._grouped_mm(flat, w, offs=offs)
            return (lambda: torch._grouped_mm(flat, w, offs=offs)), "torch._grouped_mm"
        except (RuntimeError, TypeError):
            pass
    return (lambda: torch.bmm(x, w)), "torch.bmm over equal groups"


def _grouped(plan: KernelPlan, timer: _Timer, dtype: Any, say: Callable[[str], None]) -> tuple[list[list[float]], str]:
    import torch
    rows, how = [], ""
    for t, n, k, e in plan.grouped:
        try:
            x = torch.randn(e, t, k, device=timer.device).to(dtype)
            w = torch.randn(e, k, n, device=timer.device).to(dtype)
            fn, how = _grouped_call(x, w, t, e, timer.device)
            sec = timer.best(fn)
        except _oom_types():
            say(f"grouped gemm t={t} N={n} K={k} E={e}: out of memory, skipped")
            continue
        tf = 2.0 * e * t * n * k / sec / 1e12
        rows.append([t, n, k, e, _sig(tf)])
        say(f"grouped gemm tokens/expert={t} N={n} K={k} experts={e}: {tf:,.3g} TFLOP/s ({how})")
    return rows, how


def _attention(plan: KernelPlan, timer: _Timer, dtype: Any, say: Callable[[str], None]) -> list[list[float]]:
    import torch
    import torch.nn.functional as F
    rows = []
    for b, nh, s, d, causal in plan.attention:
        try:
            q, k, v = (torch.randn(b, nh, s, d, device=timer.device).to(dtype).requires_grad_() for _ in range(3))
            out = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
            g = torch.randn_like(out)
            fwd_s = timer.best(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)))
            bwd_s = timer.best(lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True))
        except _oom_types():
            say(f"attention seq={s} d={d} causal={causal}: out of memory, skipped")
            continue
        except RuntimeError as err:   # e.g. no kernel for this head dim on this device
            say(f"attention seq={s} d={d} causal={causal}: not run ({str(err).splitlines()[0][:80]})")
            continue
        f_fwd, f_bwd = attention_flops(b, nh, s, d, causal)
        fwd, bwd = f_fwd / fwd_s / 1e12, f_bwd / bwd_s / 1e12
        rows.append([s, d, causal, _sig(fwd), _sig(bwd)])
        say(f"attention seq={s} head_dim={d} causal={causal}: fwd {fwd:,.3g}, bwd {bwd:,.3g} TFLOP/s")
        del q, k, v, out, g
    return rows


def _memory_bound(plan: KernelPlan, timer: _Timer, dtype: Any, say: Callable[[str], None]) -> dict[str, float]:
    import torch
    import torch.nn.functional as F
    dev = timer.device
    rows, h = plan.memory_elems
    x = torch.randn(rows, h, device=dev).to(dtype)
    y = torch.empty_like(x)
    gate, up = torch.randn(rows, h, device=dev).to(dtype), torch.randn(rows, h, device=dev).to(dtype)
    weight = torch.ones(h, device=dev, dtype=dtype)
    t_tok, vocab = plan.ce_shape
    logits = torch.randn(t_tok, vocab, device=dev).to(dtype)
    target = torch.randint(0, vocab, (t_tok,), device=dev)
    e = x.element_size()
    n = rows * h
    cases = {"copy": (lambda: y.copy_(x), 2 * n * e),
             "rmsnorm": (lambda: F.rms_norm(x, (h,), weight, 1e-6), 2 * n * e + h * e),
             "swiglu": (lambda: F.silu(gate) * up, 3 * n * e),
             "cross_entropy": (lambda: F.cross_entropy(logits, target), t_tok * vocab * e)}
    out = {}
    for name, (fn, nbytes) in cases.items():
        gbps = nbytes / timer.best(fn) / 1e9
        out[name] = _sig(gbps)
        say(f"{name}: {gbps:,.4g} GB/s")
    return out


def _host_copy(plan: KernelPlan, timer: _Timer, say: Callable[[str], None]) -> dict[str, float]:
    import torch
    if timer.device != "cuda":
        return {}
    n = plan.host_copy_bytes
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    out = {"h2d": n / timer.best(lambda: dev.copy_(host, non_blocking=True)) / 1e9,
           "d2h": n / timer.best(lambda: host.copy_(dev, non_blocking=True)) / 1e9}
    say(f"host copies (pinned, {n >> 20} MiB): h2d {out['h2d']:.1f}, d2h {out['d2h']:.1f} GB/s")
    return {k: _sig(v) for k, v in out.items()}


def _driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def provenance(device: str, cpu_name: str = "") -> str:
    """'<device>, driver <x>, CUDA <y>, torch <z>, measured <ISO date> on <hostname>'."""
    import torch
    when = datetime.now(timezone.utc).date().isoformat()
    host = socket.gethostname()
    if device == "cuda":
        return (f"{torch.cuda.get_device_name()}, driver {_driver()}, CUDA {torch.version.cuda}, "
                f"torch {torch.__version__}, measured {when} on {host}")
    return (f"{cpu_name or platform.processor() or platform.machine()} (CPU, {torch.get_num_threads()} threads, "
            f"no accelerator), torch {torch.__version__}, measured {when} on {host}")


def measure_kernel_tables(model: ModelSpec | None, tokens: int = 4096, *, device: str | None = None,
                          cpu_math: str = "fp32", tiny: bool | None = None, threads: int | None = None,
                          progress: Callable[[str], None] | None = None, cpu_name: str = "") -> KernelTables:
    """Time every kernel class of :func:`plan_for` on this device; the ``kernels:`` section of a hardware file.

    ``tiny`` defaults to True on CPU. On CUDA the tables are in bf16; on CPU in ``cpu_math`` filed under bf16
    (see the module docstring). ``threads``: CPU threads to use (default: torch's setting)."""
    import torch
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    say = progress or (lambda _m: None)
    if threads is not None and dev == "cpu":
        saved = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return measure_kernel_tables(model, tokens, device=dev, cpu_math=cpu_math, tiny=tiny,
                                         progress=progress, cpu_name=cpu_name)
        finally:
            torch.set_num_threads(saved)
    plan = plan_for(model, tokens, tiny=dev == "cpu" if tiny is None else tiny)
    timer = _Timer(dev, plan.min_time_s, plan.max_reps)
    dtype = torch.bfloat16 if dev == "cuda" else {"fp32": torch.float32, "bf16": torch.bfloat16,
                                                  "fp16": torch.float16}[cpu_math]
    gemm = _gemm(plan, timer, dtype, say)
    grouped, how = _grouped(plan, timer, dtype, say)
    attention = _attention(plan, timer, dtype, say)
    memory = _memory_bound(plan, timer, dtype, say)
    host = _host_copy(plan, timer, say)
    prov = provenance(dev, cpu_name) + (f"; grouped GEMM by {how}" if how else "")
    if dev == "cpu":
        prov += f"; {cpu_math} math filed under bf16 (the CPU runner's math), tiny shapes"
    return KernelTables(provenance=prov, gemm=gemm,
                        grouped_gemm={"bf16": grouped} if grouped else {},
                        attention={"bf16": attention} if attention else {},
                        memory_bound_gbps=memory, host_copy_gbps=host)


def kernel_model_from_tables(tables: KernelTables, hardware: HardwareSpec) -> KernelModel:
    """The cost model's kernel curves (:class:`KernelModel`) fitted to measured ``kernels:`` tables, against
    ``hardware``'s datasheet peaks (so ``hardware`` must be the datasheet description of the measured device).

    * GEMM, bf16 rows: eff = TFLOP/s / peak fitted to gemm · M/(M + half_m) · N/(N + half_m) · K/(K + half_nk)
      (:meth:`KernelModel.gemm_shape`)
      (least squares on log eff, ``scipy.optimize.least_squares``); fp8 rows: their own ``gemm[fp8]`` with the
      bf16 half-points. fp16 takes bf16's value when not measured (the same tensor cores at the same rate).
    * Attention, causal rows: fwd and bwd eff = attention_{fwd|bwd} · s/(s + attention_half_seq) · f(d), with
      f(128) = 1 (needs d = 128 among the rows, else the file's attention curve is kept).
    * grouped_gemm: geometric mean of measured / (dense curve at the same shape).
    * hbm: copy GB/s / datasheet HBM GB/s. nvlink, scaleout, host_link: kept (measured by the collectives).
    * sustained_gemm, sustained_attention: kept. The tables are short microbenchmarks (best of a few timed
      iterations), like the published figures the base file scales by its sustained-clock ratios.
    Figures not measured keep ``hardware.kernel_model``'s values."""
    import numpy as np
    from scipy.optimize import least_squares

    km = hardware.kernel_model
    upd: dict[str, Any] = {}
    notes = []
    rows = tables.gemm.get("bf16", [])
    half_m, half_nk = km.gemm_half_m, km.gemm_half_nk
    gemm = dict(km.gemm)
    if len(rows) >= 3:
        m, n, k, tf = (np.array(c, dtype=float) for c in zip(*rows))
        eff = tf / hardware.peak_tflops("bf16")

        def res(p: np.ndarray) -> np.ndarray:
            g, hm, hn = p
            return np.log(g * KernelModel.gemm_shape(m, n, k, hm, hn)) - np.log(eff)

        fit = least_squares(res, [min(0.99, float(eff.max())), 100.0, 300.0],
                            bounds=([1e-3, 1e-3, 1e-3], [1.0, 65536.0, 65536.0]))
        gemm["bf16"], half_m, half_nk = (float(f"{v:.4g}") for v in fit.x)
        upd.update(gemm_half_m=half_m, gemm_half_nk=half_nk)
        if "fp16" not in tables.gemm:
            gemm["fp16"] = gemm["bf16"]
        notes.append(f"GEMM curve rms log error {float(np.sqrt(np.mean(fit.fun ** 2))):.1%} over {len(rows)} shapes")

    def shape(m: Any, n: Any, k: Any) -> Any:
        return KernelModel.gemm_shape(m, n, k, half_m, half_nk)

    for prec, prows in tables.gemm.items():
        if prec != "bf16" and prows:
            m, n, k, tf = (np.array(c, dtype=float) for c in zip(*prows))
            gemm[prec] = float(f"{float(np.exp(np.mean(np.log(tf / hardware.peak_tflops(prec) / shape(m, n, k))))):.4g}")
            if prec == "fp8" and "fp8_block" not in tables.gemm:
                gemm["fp8_block"] = gemm["fp8"]
    upd["gemm"] = {p: min(1.0, v) for p, v in gemm.items()}
    grouped = tables.grouped_gemm.get("bf16", [])
    if grouped:
        t, n, k, _, tf = (np.array(c, dtype=float) for c in zip(*grouped))
        # against the grouped reference curve (N on half_nk: KernelModel.gemm_shape), as autopar.cost.kernels prices it
        dense = gemm["bf16"] * KernelModel.gemm_shape(t, n, k, half_m, half_nk, half_nk)
        bf16 = float(f"{min(1.0, float(np.exp(np.mean(np.log(tf / hardware.peak_tflops('bf16') / dense))))):.4g}")
        cur = hardware.kernel_model.grouped_gemm    # per-precision entries the benchmark did not measure are kept
        upd["grouped_gemm"] = {**cur, "bf16": bf16} if isinstance(cur, dict) else bf16
    causal = [r for r in tables.attention.get("bf16", []) if r[2] == 1]
    dims = sorted({int(r[1]) for r in causal})
    if 128 in dims and len(causal) >= 4:
        s, d, _, fwd, bwd = (np.array(c, dtype=float) for c in zip(*causal))
        others = [x for x in dims if x != 128]
        peak = hardware.peak_tflops("bf16")

        n = len(others)

        def factors(vals: Any) -> np.ndarray:
            f = np.ones_like(d)
            for x, v in zip(others, vals):
                f[d == x] = v
            return f

        def res_a(p: np.ndarray) -> np.ndarray:
            # one span curve, and the head-dim factors of the forward and of the backward apart (KernelModel
            # attention_head_dim / attention_head_dim_bwd: MLA's backward measures ~10% below its forward's ratio)
            a_f, a_b, hs = p[:3]
            span = s / (s + hs)
            return np.concatenate([np.log(a_f * span * factors(p[3:3 + n])) - np.log(fwd / peak),
                                   np.log(a_b * span * factors(p[3 + n:])) - np.log(bwd / peak)])

        fit = least_squares(res_a, [0.6, 0.5, 500.0] + [1.0] * 2 * n,
                            bounds=([1e-3, 1e-3, 1e-3] + [0.05] * 2 * n, [1.0, 1.0, 1e6] + [4.0] * 2 * n))
        a_f, a_b, hs, *f = (float(f"{v:.4g}") for v in fit.x)
        fd, fb = f[:n], f[n:]
        upd.update(attention_fwd=a_f, attention_bwd=min(a_b, a_f), attention_half_seq=hs,
                   attention_head_dim={128: 1.0, **dict(zip(others, fd))},
                   # a table of its own only where a backward factor differs from the forward's by more than the
                   # fit's resolution (2%): otherwise the forward table serves both
                   attention_head_dim_bwd=({128: 1.0, **dict(zip(others, fb))}
                                           if any(abs(b / f - 1) > 0.02 for f, b in zip(fd, fb)) else None))
        notes.append(f"attention curve rms log error {float(np.sqrt(np.mean(fit.fun ** 2))):.1%} over "
                     f"{len(causal)} causal shapes")
    copy = tables.memory_bound_gbps.get("copy")
    if copy:
        upd["hbm"] = float(f"{min(1.0, copy / (hardware.hbm_tbps * 1e3)):.4g}")
    upd["source"] = (f"fitted by 'autopar profile hardware' to its kernels: tables ({tables.provenance}) against "
                     f"{hardware.name}'s datasheet peaks" + ("; " + "; ".join(notes) if notes else ""))
    return KernelModel.model_validate({**km.model_dump(), **upd})
