"""Seconds per kernel class on one GPU, from the hardware file's measured kernel efficiencies.

Every kernel is priced by what the hardware does with it, not by one "efficiency" for a whole step:

* **Dense GEMM** (M tokens, K x N weight): roofline (Williams, Waterman & Patterson 2009)
      t = max(2·M·N·K / (P · eff_gemm(M, N, K)),  weight bytes / B_hbm)
  with P the dense tensor-core peak of the precision (datasheet) and eff_gemm the shape curve of
  :class:`autopar.specs.hardware.KernelModel`; the backward pass is two GEMMs of the same size (input gradient
  M x K x N, weight gradient K x N x M; Narayanan et al. 2021, arXiv 2104.04473 sec. 5.1: backward = 2x
  forward), whose shape factors are the same product.
* **Grouped GEMM** (routed experts): the same, per local expert of M_e tokens, times ``grouped_gemm`` of the
  precision; where the kernel runs one GEMM per expert (``kernel_model.grouped_gemm_waves``: Transformer Engine's
  multi-stream cuBLAS GroupedLinear), times the share of SMs those GEMMs keep busy, per GEMM of the pass: forward
  output M_e x N, input gradient M_e x K, weight gradient K x N (:class:`autopar.specs.hardware.GroupedWaves`).
* **Attention core** (QK^T, softmax, AV in one flash kernel; Dao 2023, arXiv 2307.08691): forward F at
  eff_attn(span, d) of the attention peak, backward 2.5·F (FlashAttention-2 sec. 4: the backward runs 5 GEMMs
  to the forward's 2) at the backward efficiency.
* **Memory-bound kernels**: bytes / (HBM peak · ``hbm``).

GEMMs and attention run at the clock a long run sustains under the power limit: their short-run figures times
``kernel_model.sustained_gemm`` / ``sustained_attention`` (measured pairs cited in each hardware file).

B_hbm = hbm_tbps · 1e12 · kernel_model.hbm (B/s). P in FLOP/s.
"""

from __future__ import annotations

from autopar.specs.hardware import HardwareSpec
from autopar.specs.training import TrainingSpec

FP8_FAMILY = ("fp8", "fp8_block", "mxfp8", "nvfp4")
ATTN_BWD_FLOP_RATIO = 2.5   # FlashAttention-2 (arXiv 2307.08691) sec. 4.1: backward FLOPs = 2.5 x forward


class Kernels:
    """Kernel-class prices for one (hardware, training): peaks, efficiency curves, HBM bandwidth."""

    def __init__(self, hw: HardwareSpec, tr: TrainingSpec):
        km = hw.kernel_model
        if tr.attention_impl == "sdpa_fa2":
            # PyTorch SDPA's flash backend is FlashAttention-2: the file's measured 'fa2' figures
            km = km.with_attention_kernel("fa2")
        self.km = km
        self.precision = tr.precision
        self.peak = hw.peak_tflops(tr.precision) * 1e12
        # Large-GEMM fraction at the clock a long run sustains under the power limit (KernelModel docstring).
        self.gemm_max = km.gemm_max(tr.precision) * km.sustained_gemm
        # torchao's rowwise recipe runs only the forward GEMM on the rowwise-scaled CUTLASS kernel (fast accumulation,
        # measured at ``fp8_rowwise_gemm`` of the tensorwise rate); its backward GEMMs, without fast accumulation, run
        # the tensorwise cuBLAS kernel and rescale the output apart (pytorch/ao torchao/float8/float8_ops.py
        # addmm_float8_unwrapped; the rescale's bytes are autopar.cost.compute.ROWWISE_RESCALE_BYTES).
        rowwise = tr.precision == "fp8" and tr.fp8_recipe == "rowwise"
        self.fwd_gemm_rate = km.fp8_rowwise_gemm if rowwise else 1.0
        # The LM head (and anything outside the transformer blocks) stays in BF16 under FP8 recipes
        # (Transformer Engine / Megatron keep the output layer in higher precision).
        hi = "fp16" if tr.precision == "fp16" else "bf16"
        self.peak_hi = hw.peak_tflops(hi) * 1e12
        self.gemm_max_hi = km.gemm_max(hi) * km.sustained_gemm
        if tr.fp8_attention and tr.precision in FP8_FAMILY:
            if km.attention_fp8 is None:
                from autopar.errors import AutoparInputError
                raise AutoparInputError(f"hardware '{hw.name}': fp8_attention needs kernel_model.attention_fp8")
            self.attn_peak = hw.peak_tflops("fp8") * 1e12
            self.attn_scale = km.attention_fp8 / km.attention_fwd
            # the backward's own FP8 figure where the file measures it (cuDNN's MXFP8 backward gains little
            # over BF16, unlike its forward), else the forward's ratio
            self.attn_scale_bwd = (km.attention_fp8_bwd / km.attention_bwd if km.attention_fp8_bwd
                                   else self.attn_scale)
            self.attn_precision = tr.precision
        else:
            self.attn_peak = self.peak_hi
            self.attn_scale = self.attn_scale_bwd = 1.0
            self.attn_precision = "bf16"
        self.hbm_bytes_per_s = hw.hbm_tbps * 1e12 * km.hbm
        self.fp8 = tr.precision in FP8_FAMILY
        self.half_m, self.half_nk = km.gemm_half_m, km.gemm_half_nk
        self.grouped_max = km.grouped_max(tr.precision)
        waves = km.grouped_gemm_waves
        self.waves = waves if waves is not None and waves.kernel == km.grouped_gemm_kernel else None
        self.cache: dict = {}   # compute.layer_parts results, keyed by the layout axes they depend on
        self._attn: dict = {}
        self._gemm: dict = {}   # gemm's arguments -> its (forward, backward): layouts share most shapes

    def gemm_eff(self, m: float, n: float, k: float, hi: bool = False, grouped: bool = False) -> float:
        """eff_gemm(M, N, K) = gemm_max · M/(M + half_m) · N/(N + half_m) · K/(K + half_nk)
        (:meth:`autopar.specs.hardware.KernelModel.gemm_shape`: the output dimensions M and N on one curve), with
        gemm_max the large-GEMM figure at the sustained clock (``gemm · sustained_gemm``). ``grouped``: N on
        half_nk, the reference curve the hardware files' grouped ratios were measured against."""
        top = self.gemm_max_hi if hi else self.gemm_max
        return top * self.km.gemm_shape(m, n, k, self.half_m, self.half_nk, self.half_nk if grouped else None)

    def gemm(self, m: float, n: float, k: float, weight_elems: float, wb: float, gb: float,
             grouped: bool = False, hi: bool = False) -> tuple[float, float]:
        """(forward, backward) seconds of a GEMM (or ``grouped``: all local experts, m = tokens per expert,
        ``weight_elems`` = all local experts' weights). wb, gb: bytes per weight and per weight gradient. Priced once
        per distinct shape (:meth:`_gemm_seconds`; the search asks about the same few hundred shapes tens of
        thousands of times)."""
        key = (m, n, k, weight_elems, wb, gb, grouped, hi)
        hit = self._gemm.get(key)
        if hit is None:
            hit = self._gemm[key] = self._gemm_seconds(m, n, k, weight_elems, wb, gb, grouped, hi)
        return hit

    def _gemm_seconds(self, m: float, n: float, k: float, weight_elems: float, wb: float, gb: float,
                      grouped: bool, hi: bool) -> tuple[float, float]:
        """:meth:`gemm`, priced."""
        if m <= 0:
            return 0.0, 0.0
        eff = self.gemm_eff(m, n, k, hi, grouped) * (self.grouped_max if grouped else 1.0)
        experts = weight_elems / (n * k) if grouped else 1.0     # the local experts a grouped GEMM runs
        flops = 2.0 * m * n * k * experts
        rate = (self.peak_hi if hi else self.peak) * eff
        bw = self.hbm_bytes_per_s
        fwd_occ, bwd_gemms = 1.0, 2.0      # backward: input-gradient and weight-gradient GEMMs, each the forward's
        if grouped and self.waves is not None:
            occ = self.waves.occupancy
            fwd_occ = occ(m, n, experts)
            bwd_gemms = 1.0 / occ(m, k, experts) + 1.0 / occ(k, n, experts)
        return (max(flops / (rate * fwd_occ * (1.0 if hi else self.fwd_gemm_rate)), weight_elems * wb / bw),
                max(bwd_gemms * flops / rate, weight_elems * (wb + gb) / bw))

    def attn_eff(self, span: float, head_dim: float, backward: bool) -> float:
        key = (span, head_dim, backward)
        hit = self._attn.get(key)
        if hit is None:
            km = self.km
            top = (km.attention_bwd if backward else km.attention_fwd) * km.sustained_attention
            half = km.attention_half_seq_bwd if backward and km.attention_half_seq_bwd else km.attention_half_seq
            scale = self.attn_scale_bwd if backward else self.attn_scale
            # the backward's own head-dim table is a BF16 measurement: FP8 attention keeps the forward's
            bwd_table = backward and self.attn_precision == "bf16"
            hit = self._attn[key] = min(1.0, top * scale * span / (span + half) * km.head_dim_factor(head_dim,
                                                                                                  bwd_table))
        return hit

    def attention(self, flops_fwd: float, span: float, head_dim: float,
                  full_share: float = 0.0, window: int = 0, seq: float = 0.0) -> tuple[float, float]:
        """(forward, backward) seconds of the flash-attention core doing ``flops_fwd`` forward FLOPs over key
        spans of ``span`` tokens with head dim ``head_dim``; ``full_share`` of the FLOPs run as full
        (non-causal) blocks, at ``attention_full_ratio`` times the causal rate (a context-parallel ring's
        off-diagonal steps). A sliding-window layer (``window`` > 0 keys, over sequences of ``seq`` tokens)
        whose window and head dim the hardware file measured (``kernel_model.attention_window``, in the
        precision the core runs in) is priced at those measured rates times ``sustained_attention``: a windowed
        kernel's rate is set by how it tiles the band (cuDNN on GB300, window 128, d = 64: 167 TFLOP/s forward
        in BF16, its MXFP8 backward 45), which the span curve does not see."""
        if flops_fwd <= 0:
            return 0.0, 0.0
        if window and not full_share:
            rates = self.km.window_rates(self.attn_precision, window, int(head_dim), seq)
            if rates is not None:
                s = 1e12 * self.km.sustained_attention
                return flops_fwd / (rates[0] * s), ATTN_BWD_FLOP_RATIO * flops_fwd / (rates[1] * s)
        work = flops_fwd * (1.0 - full_share + full_share / self.km.attention_full_ratio)
        fwd = work / (self.attn_peak * self.attn_eff(span, head_dim, False))
        bwd = ATTN_BWD_FLOP_RATIO * work / (self.attn_peak * self.attn_eff(span, head_dim, True))
        return fwd, bwd

    def attention_unfused(self, flops_fwd: float, span: float, head_dim: float, scores: float,
                          dropout: bool = True) -> tuple[float, float]:
        """(forward, backward) seconds of attention without a flash kernel (Megatron-LM before FlashAttention):
        QK^T and AV as batched GEMMs over the full span (M = N = span, K = d; no causal skipping, so
        ``flops_fwd`` counts the whole s x s square) at the BF16/FP16 GEMM rate with the token-dimension factor
        on both s dimensions and none on d (the FlashAttention-3 paper's measured 'standard attention' is
        reproduced so; see the hardware files' ``gemm_half_nk`` note), and a fused scale-mask-softmax
        over ``scores`` score elements, memory-bound: per score, forward writes the scores (2 B), the softmax
        reads them and writes probabilities (4 B), AV reads them (2 B) = 8 B; backward writes dP (2 B), the
        softmax backward reads P and dP and writes dS (6 B), the dQ, dK and dV GEMMs read dS, dS and P (6 B) =
        14 B (2-byte activations). Attention ``dropout`` (Megatron-LM's default 0.1 before FlashAttention) adds
        its mask and output: 3 B forward, 3 B backward (Shoeybi et al. 2019, arXiv 1909.08053; Korthikanti et
        al. 2022, arXiv 2205.05198 sec. 4). The FlashAttention-3 paper's measured 'standard attention'
        (Fig. 5(c), 6(b), no dropout) is reproduced within 15% (tests/cost/test_kernels.py)."""
        if flops_fwd <= 0:
            return 0.0, 0.0
        rate = self.peak_hi * self.gemm_max_hi * (span / (span + self.half_m)) ** 2
        drop = 3.0 if dropout else 0.0
        return (flops_fwd / rate + self.stream((8.0 + drop) * scores),
                2.0 * flops_fwd / rate + self.stream((14.0 + drop) * scores))

    def stream(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` through HBM in memory-bound kernels."""
        return nbytes / self.hbm_bytes_per_s
