"""HardwareSpec: one GPU type and the network around it.

Datasheet numbers (peak TFLOP/s, HBM, link bandwidths) live in ``hardware/*.yaml`` and nowhere else. The
``efficiency`` section holds the achievable fractions that calibration (``autopar validate --fit`` and
``autopar profile compare``) fits to measurements; ``measured_busbw_gbps`` holds collective bus-bandwidth
tables measured by ``autopar profile hardware`` (as the example report's ``AR={2: 23.1, 4: 46.3, 8: 80.1}``).
"""

from __future__ import annotations

from typing import Annotated, Any, Callable, Literal, NamedTuple

from pydantic import Field, field_validator, model_validator

from autopar.specs._base import Spec
from autopar.specs.bounds import RATE_FLOOR, limit

Precision = Literal["bf16", "fp16", "fp8", "fp8_block", "mxfp8", "nvfp4"]
PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp8", "fp8_block", "mxfp8", "nvfp4")
CollectiveOp = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]


# Which fits move a calibrated constant: "runs" = ``autopar validate --fit`` (the published runs),
# "layouts" = ``autopar profile compare`` (layouts run on the machine at hand).
RUNS, LAYOUTS, RUNS_AND_LAYOUTS = ("runs",), ("layouts",), ("runs", "layouts")


class FitBound(NamedTuple):
    """A calibrated constant's declaration, on its hardware-file field next to the field's valid range: the bounds
    a fit may move it within (inside that range), why those bounds, and which fits move it (``fitted_by``; empty:
    only set by hand, e.g. ``with_constants``). Fits take their constants in field order. Read by
    :func:`fit_bounds` (for ``autopar.measure.calibrate``); unpacks as ``lo, hi, why, fitted_by``."""

    lo: float
    hi: float
    why: str
    fitted_by: tuple[str, ...] = ()


GroupSize = Annotated[int, Field(gt=0, le=limit("gpus"))]
BusGbps = Annotated[float, Field(gt=0)]


class MeasuredCollectives(Spec):
    """Measured bus bandwidth (GB/s, nccl-tests convention) by group size, per collective.

    Keys are group sizes; a group of that size placed the way autopar places it (TP innermost) is assumed.
    Sizes between measured points are interpolated in log2(group size); beyond, the nearest point is used."""

    all_reduce: dict[GroupSize, BusGbps] = Field(default_factory=dict, description="All-reduce bus GB/s by group size.")
    all_gather: dict[GroupSize, BusGbps] = Field(default_factory=dict, description="All-gather bus GB/s by group size.")
    reduce_scatter: dict[GroupSize, BusGbps] = Field(default_factory=dict, description="Reduce-scatter bus GB/s.")
    all_to_all: dict[GroupSize, BusGbps] = Field(default_factory=dict, description="All-to-all bus GB/s by group size.")
    send_recv: dict[GroupSize, BusGbps] = Field(default_factory=dict, description="Point-to-point GB/s (key 2).")
    message_mib: float = Field(default=64.0, gt=0, description="Message size the table was measured at (MiB).")


MemoryBoundKernel = Literal["copy", "rmsnorm", "swiglu", "cross_entropy"]
HostCopy = Literal["h2d", "d2h"]


class KernelTables(Spec):
    """Measured throughput of each kernel class (``autopar profile hardware``; schema in docs/measurement.md).

    Every rate is achieved on the device named in ``provenance``; the cost model reads them instead of a
    datasheet peak times a fitted efficiency. Rows are lists so the YAML stays one line per measurement."""

    provenance: str = Field(min_length=1, description="Device, driver, CUDA, torch, ISO date and host of the "
                                                      "measurement, or a citation (paper/table, repo/file).")
    gemm: dict[Precision, list[tuple[int, int, int, float]]] = Field(
        default_factory=dict, description="Dense GEMM by shape, per precision: [M, N, K, achieved TFLOP/s] "
                                          "(FLOPs 2*M*N*K).")
    grouped_gemm: dict[Precision, list[tuple[int, int, int, int, float]]] = Field(
        default_factory=dict, description="Grouped (per-expert) GEMM: [tokens_per_expert, N, K, num_experts, "
                                          "achieved TFLOP/s] (FLOPs 2*tokens*N*K per expert).")
    attention: dict[Precision, list[tuple[int, int, int, float, float]]] = Field(
        default_factory=dict, description="Flash attention: [seq, head_dim, causal 0|1, fwd TFLOP/s, bwd TFLOP/s]; "
                                          "forward FLOPs 4*s*s*d per head (causal: half), backward 2.5x forward.")
    memory_bound_gbps: dict[MemoryBoundKernel, float] = Field(
        default_factory=dict, description="Achieved GB/s (1e9 B/s) of memory-bound kernels, bytes counted as "
                                          "each tensor read once plus each output written once.")
    host_copy_gbps: dict[HostCopy, float] = Field(
        default_factory=dict, description="Pinned host<->device copy GB/s per direction.")

    @field_validator("gemm", "grouped_gemm")
    @classmethod
    def _positive_rows(cls, table: dict) -> dict:
        for prec, rows in table.items():
            for row in rows:
                if any(v <= 0 for v in row):
                    raise ValueError(f"{prec}: every entry of {list(row)} must be positive")
        return table

    @field_validator("attention")
    @classmethod
    def _attention_rows(cls, table: dict) -> dict:
        for prec, rows in table.items():
            for seq, d, causal, fwd, bwd in rows:
                if causal not in (0, 1):
                    raise ValueError(f"{prec}: causal must be 0 or 1 (got {causal} in {[seq, d, causal, fwd, bwd]})")
                if min(seq, d, fwd, bwd) <= 0:
                    raise ValueError(f"{prec}: seq, head_dim and TFLOP/s must be positive (got "
                                     f"{[seq, d, causal, fwd, bwd]})")
        return table

    @field_validator("memory_bound_gbps", "host_copy_gbps")
    @classmethod
    def _positive_rates(cls, table: dict) -> dict:
        bad = {k: v for k, v in table.items() if v <= 0}
        if bad:
            raise ValueError(f"rates must be positive GB/s (got {bad})")
        return table


class AttentionFigures(Spec):
    """One flash-attention implementation's measured figures on a chip, with the meaning of KernelModel's
    ``attention_fwd``, ``attention_bwd`` and ``attention_half_seq`` (short-run, before ``sustained_attention``)."""

    fwd: float = Field(gt=0, le=1, description="Causal forward achieved/BF16 peak, long span, d=128.")
    bwd: float = Field(gt=0, le=1, description="Causal backward achieved/BF16 peak (2.5x forward FLOPs).")
    half_seq: float = Field(gt=0, le=1_048_576, description="Key span at which the efficiency halves.")
    half_seq_bwd: float | None = Field(default=None, gt=0, le=1_048_576,
                                       description="Key span at which the backward's efficiency halves, where it "
                                                   "saturates more slowly than the forward (None: half_seq).")
    full_ratio: float = Field(default=1.0, ge=1.0, le=2.0,
                              description="Rate of full (non-causal) blocks over the causal rate at long spans "
                                          "(1.0: not measured).")
    source: str = Field(min_length=1, description="Benchmark, machine and date, or citation.")


AttentionKernelName = Annotated[str, Field(pattern=r"^[a-z0-9_]{1,32}$")]


class GroupedWaves(Spec):
    """A grouped GEMM run as one dense GEMM per local expert, ``streams`` of them at a time (Transformer Engine's
    GroupedLinear, which Megatron-Core's ``--moe-grouped-gemm`` runs: one cuBLASLt GEMM per expert, round-robin
    over TE's compute streams). Each GEMM runs at the dense curve of its own shape, but a small per-expert GEMM has
    too few output tiles to fill the chip: with T = ceil(M/tile_m)·ceil(N/tile_n) tiles per GEMM and
    c = min(streams, local experts)·T tiles in flight, the SMs are busy

        occupancy = c / (ceil(c / sms) · sms)

    of the time (the last wave's idle SMs; Volkov-style wave quantisation). An approximation: CTAs of concurrent
    streams are taken to pack the idle SMs perfectly, and one tile shape stands for cuBLAS's heuristic choice."""

    kernel: AttentionKernelName = Field(description="The grouped-GEMM implementation this models (the name in "
                                                    "grouped_gemm_kernel / grouped_gemm_kernels).")
    streams: int = Field(ge=1, le=64, description="GEMMs in flight at once (CUDA streams the kernel cycles over).")
    tile_m: int = Field(ge=16, le=1024, description="Output tile rows (tokens) of one CTA.")
    tile_n: int = Field(ge=16, le=1024, description="Output tile columns of one CTA.")
    sms: int = Field(ge=1, le=1024, description="Streaming multiprocessors on the chip (datasheet).")
    source: str = Field(min_length=1, description="Where streams, tile and SM count come from.")

    def occupancy(self, m: float, n: float, experts: float) -> float:
        """Share of the chip's SMs busy over the grouped GEMM of ``experts`` local experts, each an (m x n) output
        (m tokens, n columns)."""
        import math
        if m <= 0 or n <= 0:
            return 1.0
        c = min(self.streams, max(1, round(experts))) * math.ceil(m / self.tile_m - 1e-9) * math.ceil(
            n / self.tile_n - 1e-9)
        return c / (math.ceil(c / self.sms) * self.sms)


def _swap_measured(what: str, name: str, measured: dict, own_name: str, own: Callable[[], object]):
    """For KernelModel.with_*_kernel: implementation ``name``'s entry of ``measured`` (figures of named
    implementations) and the table after the swap (that entry out, the model's own figures ``own()`` in under
    ``own_name``; built only once ``name`` is found). A name with no entry is an input error listing the
    measured names, the model's own included."""
    fig = measured.get(name)
    if fig is None:
        from autopar.errors import AutoparInputError
        known = ", ".join(sorted({own_name, *measured}))
        raise AutoparInputError(f"kernel_model has no measured {what} '{name}' (measured on this hardware: {known})")
    return fig, {**{k: v for k, v in measured.items() if k != name}, own_name: own()}


class OverlapSlowdown(Spec):
    """How much slower compute runs while a collective runs beside it (autopar.cost.overlap), by the engine that
    moves the collective's bytes: (overlapped compute time / the same compute alone) − 1."""

    sm: float = Field(ge=0, le=1, description="Collectives run by SM kernels (NCCL, RCCL, Transformer Engine "
                                               "userbuffers' pipeline and bulk methods).")
    copy_engine: float = Field(ge=0, le=1, description="Peer copies on the copy engines (cudaMemcpyAsync: Transformer "
                                                        "Engine ring_exchange, PyTorch async TP).")

    def __getitem__(self, engine: str) -> float:
        return getattr(self, engine)


class KernelModel(Spec):
    """Achieved fractions of the datasheet peaks, by kernel class, from microbenchmarks (measured with
    ``autopar profile hardware``, or published: ``source`` names them). Nothing here is fitted to training runs.

    Dense GEMM of shape (M, N, K) (M tokens, K x N weight) runs at

        eff_gemm(M, N, K) = gemm[precision] · M/(M + gemm_half_m) · N/(N + gemm_half_m) · K/(K + gemm_half_nk)

    of the precision's peak (:meth:`gemm_shape`; grouped GEMMs keep N on ``gemm_half_nk``, the reference their
    measured ratios were taken against): large GEMMs reach ``gemm``; a small dimension leaves tiles and
    SMs idle (a saturating curve per dimension). The two output dimensions M and N share one curve: C = A·B and
    C^T = B^T·A^T are the same work, tiled over the same M x N output, and cuBLAS picks its tiles for either
    orientation, so a GEMM 128 wide in N runs as one 128 wide in M (measured: ``gemm_half_m``, vLLM's H100 BF16
    torch.mm at M = 128 against N = 12288, K = 5376). The reduction dimension K saturates later (its tiles are
    deeper, and a short K leaves each tile's pipeline a short loop to fill: DeepGEMM's K series,
    ``gemm_half_nk``; the field keeps its old name, N no longer uses it). A grouped GEMM (routed experts) runs at ``grouped_gemm[precision]`` times a dense GEMM of
    one expert's shape (the quantisation kernels of FP8/MXFP8 recipes are priced apart, as memory-bound casts),
    and, where the selected kernel runs one GEMM per expert (``grouped_gemm_waves``), times the share of SMs its
    per-expert GEMMs keep busy (:class:`GroupedWaves`). The flash-attention core runs at

        eff_attn(s, d) = attention_{fwd|bwd} · s / (s + attention_half_seq) · attention_head_dim[d]

    of the BF16 peak (the backward's span factor uses ``attention_half_seq_bwd`` where the file measures it
    apart: FlashAttention-2's backward saturates more slowly than its forward; attention runs in BF16 under FP8
    linear-layer recipes unless the training spec asks for
    FP8 attention; then at ``attention_fp8`` of the FP8 peak), with s the keys one query block spans (the
    sequence, the window, or the CP block s/cp) and the head-dim factor interpolated in log2(d) between the
    measured head dims (1.0 at d = 128). Memory-bound kernels stream at ``hbm`` of the HBM peak.

    **Sustained rates.** The figures above are short microbenchmarks: best-of-N iterations, or clocks locked
    (FlashAttention-3's tables at 1830 MHz). A training run keeps every SM busy for hours under the chip's power
    limit, and the SM clock settles lower (B200: 1965 -> ~1580 MHz after a few tens of milliseconds of
    back-to-back kernels, flashinfer-ai/flashinfer PR #2899). Compute-bound kernels scale with that clock, so

        GEMM and grouped GEMM:  gemm · sustained_gemm · shape factors
        flash attention:        attention_{fwd|bwd} · sustained_attention · span and head-dim factors

    ``sustained_*`` = throughput measured after a long warm-up at the power limit / the short-run figure above
    (each hardware file cites the pair). Memory-bound kernels and links are not scaled: the power limit lowers
    the SM clock, not the memory clock, which sets the rate of the memory-bound kernels ``hbm`` was measured on."""

    source: str = Field(default="defaults: the H100 SXM figures of hardware/h100_sxm.yaml, NOT measured for this "
                                "hardware (run 'autopar profile hardware')",
                        description="Where these figures come from (benchmark, machine, date, or citation).")
    gemm: Annotated[dict[str, Annotated[float, Field(gt=0, le=1)]], FitBound(
        0.15, 1.0, "achieved / datasheet dense peak: 1.0 is the datasheet; cuBLAS-class large GEMMs reach 0.7-0.8 "
        "(0.76-0.81 for Llama-3-8B GEMMs on one H100); below 0.15 a term is missing", LAYOUTS)] = Field(
        default_factory=lambda: {"bf16": 0.803, "fp16": 0.803, "fp8": 0.709, "fp8_block": 0.709, "mxfp8": 0.709,
                                 "nvfp4": 0.709},
        description="Large-GEMM achieved/peak TFLOP/s per precision (cuBLAS-class).")
    gemm_half_m: float = Field(default=170.0, gt=0, le=65536,
                               description="Output dimension M (tokens) or N (weight columns) at which its "
                                           "factor is 1/2.")
    gemm_half_nk: float = Field(default=490.0, gt=0, le=65536,
                                description="Reduction dimension K at which its factor is 1/2 (named before N "
                                            "moved to gemm_half_m).")
    grouped_gemm: Annotated[float, Field(gt=0, le=1)] | dict[str, Annotated[float, Field(gt=0, le=1)]] = Field(
        default=0.52,
        description="Grouped-GEMM throughput / dense GEMM of the same shape: one figure for every precision, or "
                    "one per precision (a precision not named takes the 'bf16' entry).")
    attention_fwd: float = Field(default=0.646, gt=0, le=1,
                                 description="Flash-attention causal forward achieved/BF16 peak, long s, d=128.")
    attention_bwd: float = Field(default=0.559, gt=0, le=1,
                                 description="Flash-attention causal backward achieved/BF16 peak (FLOPs counted as "
                                             "2.5x forward), long s, d=128.")
    attention_half_seq: float = Field(default=610.0, gt=0, le=1_048_576,
                                      description="Key span at which attention efficiency halves.")
    attention_half_seq_bwd: float | None = Field(
        default=None, gt=0, le=1_048_576,
        description="Key span at which the backward's attention efficiency halves, where measured apart from the "
                    "forward's (None: attention_half_seq for both).")
    attention_head_dim: dict[Annotated[int, Field(gt=0, le=limit("head_dim"))],
                             Annotated[float, Field(gt=0, le=4.0)]] = Field(
        default_factory=lambda: {64: 0.768, 128: 1.0, 256: 1.042}, min_length=1,
        description="Attention throughput at head dim d relative to d = 128 (measured points, at least one; factors "
                    "in (0, 4], the bounds autopar.measure.kernel_tables fits them within).")
    attention_head_dim_bwd: dict[Annotated[int, Field(gt=0, le=limit("head_dim"))],
                                 Annotated[float, Field(gt=0, le=4.0)]] | None = Field(
        default=None, min_length=1,
        description="The BF16 attention backward's throughput at head dim d relative to d = 128, where measured apart "
                    "from the forward's (None: attention_head_dim for both; at least one point, factors in (0, 4]). "
                    "FP8 attention keeps attention_head_dim.")
    attention_full_ratio: float = Field(
        default=1.0, ge=1.0, le=2.0,
        description="Flash-attention rate on full (non-causal) blocks over the causal rate, at long spans: the "
                    "off-diagonal steps of a context-parallel ring run full blocks (1.0: not measured, no change).")
    attention_fp8: float | None = Field(default=None, gt=0, le=1,
                                        description="FP8 attention forward achieved/FP8 peak; None = not available.")
    attention_fp8_bwd: float | None = Field(
        default=None, gt=0, le=1,
        description="FP8 attention backward achieved/FP8 peak (FLOPs 2.5x forward), where measured apart from the "
                    "forward (None: attention_bwd scaled by attention_fp8/attention_fwd).")
    attention_window: dict[Precision, list[tuple[int, int, int, float, float]]] = Field(
        default_factory=dict,
        description="Measured sliding-window attention, short-run, by the precision the attention core runs in "
                    "('bf16', or the FP8 recipe under FP8 attention): [window, head_dim, seq, fwd TFLOP/s, bwd "
                    "TFLOP/s], FLOPs counted over the keys inside the window (forward 4*s*w*d per head, backward "
                    "2.5x). A windowed layer whose (window, head_dim) is listed is priced from these rows "
                    "(interpolated in log2(seq)); any other by the span curve at span = window.")
    grouped_gemm_kernel: AttentionKernelName = Field(
        default="mixed",
        description="The grouped-GEMM implementation 'grouped_gemm' was measured with (cutlass_sm90, "
                    "torch_grouped_mm, cublas_loop, ...; 'mixed' when it averages several).")
    grouped_gemm_kernels: dict[AttentionKernelName, Annotated[float, Field(gt=0, le=1)]
                               | dict[str, Annotated[float, Field(gt=0, le=1)]]] = Field(
        default_factory=dict,
        description="Measured grouped-GEMM figures of named implementations on this chip (same meaning as "
                    "grouped_gemm); a software stack selects one with with_grouped_gemm_kernel().")
    grouped_gemm_waves: GroupedWaves | None = Field(
        default=None,
        description="Where the grouped-GEMM kernel runs one GEMM per expert: its wave model (streams, tile, SMs), "
                    "applied on top of grouped_gemm while that kernel is the selected one (None: no such model).")
    attention_kernel: AttentionKernelName = Field(
        default="fa3",
        description="The attention implementation (fa2, fa3, fa4, cudnn, ...) that attention_fwd, attention_bwd and "
                    "attention_half_seq were measured with.")
    attention_kernels: dict[AttentionKernelName, AttentionFigures] = Field(
        default_factory=dict,
        description="Measured figures of other attention implementations on this chip, by name; a software stack "
                    "that runs one of them selects it with with_attention_kernel().")
    sustained_gemm: float = Field(
        default=0.982, gt=0, le=1,
        description="Dense and grouped GEMM throughput sustained under the power limit in a long run / the "
                    "short-run 'gemm' figure (H100 default: cuBLASLt FP8 after 10,000 warm-up iterations, 1377.3 "
                    "TFLOP/s, over the best-of-N 1402.6).")
    sustained_attention: float = Field(
        default=0.982, gt=0, le=1,
        description="Flash-attention throughput sustained under the power limit / the short-run attention "
                    "figures (H100 default: the GEMM ratio, assumed).")
    fp8_rowwise_gemm: float = Field(
        default=1.0, gt=0, le=1,
        description="Rowwise-scaled FP8 GEMM throughput (PyTorch's CUTLASS rowwise _scaled_mm, torchao's rowwise "
                    "recipe) / tensorwise FP8 (cuBLAS) at the same shape, for fp8_recipe: rowwise; a measured "
                    "kernel figure (cited in the hardware file), 1.0 where none is known.")
    nvlink: Annotated[float, FitBound(0.3, 1.0, "achieved / link bandwidth of NVLink collectives (nccl-tests "
                                                "busbw reaches 0.7-0.9 of the link rate at large messages)",
                                      LAYOUTS)] = Field(
        default=0.8, gt=0, le=1,
        description="Collectives' achieved/peak bus bandwidth inside the NVLink domain (nccl-tests "
                                      "busbw / nvlink_gbps), used without a measured collective table.")
    nvlink_a2a: float | None = Field(
        default=None, gt=0, le=1,
        description="MoE token dispatch/combine inside one NVLink domain (DeepEP-style kernels on a few SMs): bytes "
                    "each GPU receives, its own share included, per second / nvlink_gbps, as DeepEP's benchmarks "
                    "count them (recv_x bytes / time); a measured figure, cited in the hardware file. None: the "
                    "plain all-to-all at 'nvlink' (autopar.cost.collectives.Network.moe_dispatch_time).")
    scaleout: Annotated[float, FitBound(0.3, 1.0, "achieved / NIC bandwidth of scale-out collectives",
                                        LAYOUTS)] = Field(
        default=0.8, gt=0, le=1, description="Collectives' achieved/peak bandwidth per GPU on the scale-out network.")
    hbm: Annotated[float, FitBound(0.3, 1.0, "achieved / datasheet HBM bandwidth (STREAM-like copies reach "
                                             "0.8-0.9)", LAYOUTS)] = Field(
        default=0.80, gt=0, le=1, description="Memory-bound kernels' achieved/peak HBM bandwidth.")
    host_link: Annotated[float, FitBound(0.3, 1.0, "achieved / PCIe or C2C bandwidth of pinned host copies")] = Field(
        default=0.8, gt=0, le=1,
        description="Pinned GPU<->host copies' achieved/peak bandwidth (activation offload).")
    overlap_slowdown: OverlapSlowdown = Field(
        default_factory=lambda: OverlapSlowdown(sm=0.189, copy_engine=0.0),
        description="Slowdown of compute while a collective runs hidden under it, by the engine that moves the "
                    "bytes (autopar.cost.overlap). H100 default: sm 0.189, the mean of Lee et al. 2025 (arXiv "
                    "2507.03114) over A100/H100/MI250/MI210; copy_engine 0.0, not measured (no SM is taken; the HBM "
                    "and power share is not counted).")

    @field_validator("attention_window")
    @classmethod
    def _window_rows(cls, table: dict) -> dict:
        for prec, rows in table.items():
            for row in rows:
                if min(row) <= 0:
                    raise ValueError(f"attention_window {prec}: window, head_dim, seq and TFLOP/s must be positive "
                                     f"(got {list(row)})")
        return table

    def window_rates(self, precision: str, window: int, head_dim: int, seq: float) -> tuple[float, float] | None:
        """Measured (forward, backward) TFLOP/s of ``window``-token sliding-window attention at head dim
        ``head_dim`` over a sequence of ``seq`` tokens (``attention_window`` rows of ``precision``, linear in
        log2(seq) between the measured sequences, the nearest beyond them); None when no row has this window and
        head dim."""
        import math
        pts = sorted((s, f, b) for w, d, s, f, b in self.attention_window.get(precision, ())
                     if w == window and d == head_dim)
        if not pts:
            return None
        if seq <= pts[0][0]:
            return pts[0][1], pts[0][2]
        if seq >= pts[-1][0]:
            return pts[-1][1], pts[-1][2]
        for (s0, f0, b0), (s1, f1, b1) in zip(pts, pts[1:]):
            if s0 <= seq <= s1:
                t = (math.log2(seq) - math.log2(s0)) / (math.log2(s1) - math.log2(s0))
                return f0 + t * (f1 - f0), b0 + t * (b1 - b0)
        return None  # unreachable: seq lies within the measured range

    @staticmethod
    def gemm_shape(m: Any, n: Any, k: Any, half_m: Any, half_k: Any, half_n: Any = None) -> Any:
        """The shape factor of eff_gemm (class docstring): M/(M + half_m) · N/(N + half_n) · K/(K + half_k), with
        half_n = half_m (the output dimensions on one curve) unless given (floats or numpy arrays). The grouped
        figures (``grouped_gemm``, ``grouped_gemm_kernels``) are ratios measured against the curve with N on K's
        half-point (half_n = half_k), and are priced against that same reference until they are re-derived."""
        return m / (m + half_m) * n / (n + (half_m if half_n is None else half_n)) * k / (k + half_k)

    def gemm_max(self, precision: str) -> float:
        from autopar.errors import AutoparInputError
        if precision not in self.gemm:
            raise AutoparInputError(f"kernel_model.gemm has no efficiency for precision '{precision}'")
        return self.gemm[precision]

    def grouped_max(self, precision: str) -> float:
        """``grouped_gemm`` for a precision: the scalar, the precision's entry, or else the BF16 entry."""
        g = self.grouped_gemm
        if isinstance(g, dict):
            if precision in g:
                return g[precision]
            if "bf16" in g:
                return g["bf16"]
            from autopar.errors import AutoparInputError
            raise AutoparInputError(f"kernel_model.grouped_gemm has no entry for '{precision}' and no 'bf16' entry")
        return g

    def with_grouped_gemm_kernel(self, name: str) -> "KernelModel":
        """This model with the grouped-GEMM figure of implementation ``name`` (itself when ``grouped_gemm`` is
        that implementation's; its own figure is kept in ``grouped_gemm_kernels``). A name with no measured figure
        is an input error listing the measured ones."""
        if name == self.grouped_gemm_kernel:
            return self
        fig, table = _swap_measured("figure for grouped-GEMM kernel", name, self.grouped_gemm_kernels,
                                    self.grouped_gemm_kernel, lambda: self.grouped_gemm)
        return self.model_copy(update={"grouped_gemm": fig, "grouped_gemm_kernel": name,
                                       "grouped_gemm_kernels": table})

    def with_attention_kernel(self, name: str) -> "KernelModel":
        """This model with the attention figures of implementation ``name``: itself when its own figures are that
        implementation's, else a copy taking the entry of ``attention_kernels`` (and keeping its own figures there
        under their name). A name with no measured figures is an input error listing the measured ones."""
        if name == self.attention_kernel:
            return self
        fig, table = _swap_measured("figures for attention kernel", name, self.attention_kernels,
                                    self.attention_kernel, lambda: AttentionFigures(
                                        fwd=self.attention_fwd, bwd=self.attention_bwd,
                                        half_seq=self.attention_half_seq,
                                        half_seq_bwd=self.attention_half_seq_bwd,
                                        full_ratio=self.attention_full_ratio, source=self.source))
        return self.model_copy(update={"attention_fwd": fig.fwd, "attention_bwd": fig.bwd,
                                       "attention_half_seq": fig.half_seq,
                                       "attention_half_seq_bwd": fig.half_seq_bwd,
                                       "attention_full_ratio": fig.full_ratio, "attention_kernel": name,
                                       "attention_kernels": table})

    def head_dim_factor(self, d: float, backward: bool = False) -> float:
        """attention_head_dim (``backward``: attention_head_dim_bwd where given) interpolated in log2(d); the nearest
        point beyond the measured range."""
        import math
        table = self.attention_head_dim_bwd if backward and self.attention_head_dim_bwd else self.attention_head_dim
        pts = sorted(table.items())
        if d <= pts[0][0]:
            return pts[0][1]
        if d >= pts[-1][0]:
            return pts[-1][1]
        for (d0, f0), (d1, f1) in zip(pts, pts[1:]):
            if d0 <= d <= d1:
                t = (math.log2(d) - math.log2(d0)) / (math.log2(d1) - math.log2(d0))
                return f0 + t * (f1 - f0)
        return 1.0  # unreachable: d lies within the measured range


class Efficiency(Spec):
    """Constants no microbenchmark of a single kernel can see: what a framework spends between kernels (per-layer
    overhead), how unevenly dropless routing loads the experts, how much of the pipeline's sends hide. These are
    fitted to training runs (``autopar validate --fit``, ``autopar profile compare``); each field's
    :class:`FitBound` says within what bounds, why, and which fits move it. How much TP, DP, EP and CP
    communication hides is not a constant: the cost model prices it from the compute window of the schedule
    (autopar.cost.tp, dp, ep, cp), where ``TrainingSpec.*_comm_overlap`` says the framework overlaps at all."""

    pp_overlap: Annotated[float, FitBound(0.0, 1.0, "a share of the pipeline send/recv", LAYOUTS)] = Field(
        default=0.0, ge=0, le=1, description="Fraction of pipeline send/recv hidden.")
    layer_overhead_us: Annotated[float, FitBound(0.0, 3000.0, "per layer and micro-batch; 3 ms is ~100 kernel "
                                                              "launches' worth of host time at 30 us each, far beyond "
                                                              "a CUDA-graph-free layer's launches",
                                                 RUNS_AND_LAYOUTS)] = Field(
        default=0.0, ge=0, le=10_000,
        description="Time per transformer layer and micro-batch (forward + backward) that no kernel accounts for: "
                    "launch gaps, host-side framework work, synchronisation (calibrated), microseconds.")
    moe_layer_overhead_us: Annotated[float, FitBound(0.0, 3000.0, "per MoE layer and micro-batch on top of "
                                                                  "layer_overhead_us; the same ceiling", RUNS)] = Field(
        default=0.0, ge=0, le=10_000,
        description="Time per MoE layer and micro-batch (forward + backward) on top of layer_overhead_us: the "
                    "router's, permutation's and dispatcher's extra launches and the dispatcher's host "
                    "synchronisation on the tokens per expert (calibrated), microseconds. The routed experts' "
                    "launches after that sync are priced apart (host_us_per_expert_fwd, "
                    "autopar.cost.compute.moe_host_time).")
    # Fitted, not measured: no published router-load statistic (busiest EP rank / mean) was found for the rows that
    # see it. One value is physics enough for them: Megatron-MoE model zoo Qwen3-235B on 256 H100, dropless / forced
    # balance 1.245, 1.21, 1.15, 1.09 at 16K-128K, all at 4,096 tokens per GPU per micro-batch (CP grows with the
    # sequence), so the busiest rank's excess is the same and only its share of the step falls as attention grows.
    moe_dropless_imbalance: Annotated[float, FitBound(1.0, 2.5, "busiest/mean expert rank; 2.5 is beyond what "
                                                                "load-balancing losses leave in published traces",
                                                      RUNS)] = Field(
        default=1.3, ge=1.0, le=4.0,
        description="Tokens on the busiest expert rank / the mean, under dropless routing (calibrated); the routed "
                    "expert math and the all-to-all wait for that rank.")


class HardwareSpec(Spec):
    """One accelerator type and its interconnect. Bandwidths are per GPU, one direction, in GB/s (1e9 B/s)."""

    name: str = Field(description="Short identifier, e.g. 'h100_sxm'.")
    source: str = Field(default="", description="Datasheet or paper the numbers come from.")
    peak_tflops_bf16: float = Field(ge=RATE_FLOOR, le=limit("hardware_rate"),
                                    description="Dense BF16 tensor-core peak, TFLOP/s (no sparsity).")
    peak_tflops_fp16: float = Field(ge=RATE_FLOOR, le=limit("hardware_rate"),
                                    description="Dense FP16 tensor-core peak, TFLOP/s.")
    peak_tflops_fp8: float | None = Field(default=None, ge=RATE_FLOOR, le=limit("hardware_rate"),
                                          description="Dense FP8 peak, TFLOP/s; None = none.")
    peak_tflops_mxfp8: float | None = Field(default=None, ge=RATE_FLOOR, le=limit("hardware_rate"),
                                            description="Dense MXFP8 peak; None = none.")
    peak_tflops_nvfp4: float | None = Field(default=None, ge=RATE_FLOOR, le=limit("hardware_rate"),
                                            description="Dense NVFP4 peak; None = none.")
    hbm_gib: float = Field(gt=0, le=limit("hbm_gib"), description="HBM capacity per GPU, GiB.")
    hbm_tbps: float = Field(ge=RATE_FLOOR, le=limit("hardware_rate"), description="HBM bandwidth per GPU, TB/s.")
    gpus_per_node: int = Field(gt=0, le=limit("gpus_per_node"),
                               description="GPUs per server (scale-out NICs are counted per GPU).")
    nvlink_domain_size: int = Field(gt=0, le=limit("nvlink_domain"),
                                    description="GPUs in one NVLink/xGMI domain (8 on HGX, 72 on NVL72).")
    nvlink_gbps: float = Field(ge=RATE_FLOOR, le=limit("hardware_rate"),
                               description="NVLink bandwidth per GPU per direction, GB/s.")
    scaleout_gbps: float = Field(ge=RATE_FLOOR, le=limit("hardware_rate"),
                                 description="Scale-out (InfiniBand/RoCE) bandwidth per GPU per direction, GB/s.")
    host_link_gbps: float | None = Field(
        default=None, ge=RATE_FLOOR, le=limit("hardware_rate"),
        description="GPU<->host-memory bandwidth per GPU per direction, GB/s (PCIe or "
                    "NVLink-C2C); None = unknown, activation offloading is then unavailable.")
    host_memory_gib: float | None = Field(
        default=None, gt=0, le=limit("hbm_gib"),
        description="Host DRAM per GPU on the reference server (total / GPUs per node), GiB; "
                    "room for offloaded activations.")
    host_us_per_expert_fwd: float | None = Field(
        default=None, ge=0, le=1000,
        description="Host (CPU) time to issue one local expert's forward work in a grouped MLP (PyTorch/TE "
                    "dispatch, allocations, cuBLAS launches), microseconds; measured, cited in the hardware file. "
                    "Prices the MoE layer's host-bound launches after the dispatcher's device-to-host sync "
                    "(autopar.cost.compute.moe_host_time); None = not measured for this host, not priced.")
    nvlink_latency_us: float = Field(default=3.0, ge=0, description="Per-step latency (alpha) inside the domain, us.")
    scaleout_latency_us: float = Field(default=8.0, ge=0, description="Per-step latency across the network, us.")
    reserve_gib: float = Field(default=3.0, ge=0, le=limit("hbm_gib"),
                               description="HBM held outside PyTorch's caching allocator (CUDA context, NCCL's "
                                           "buffers), GiB; the allocator's own excess is 'fragmentation'.")
    fragmentation: float = Field(default=0.02, ge=0, le=1,
                                 description="Extra HBM lost to caching-allocator fragmentation, as a fraction of "
                                             "the modelled memory. Default 2%: PyTorch's allocator with "
                                             "expandable_segments (as Megatron/NeMo launchers run it) leaves little "
                                             "fragmentation; raise it for the default allocator.")
    kernel_model: KernelModel = Field(default_factory=KernelModel,
                                      description="Achieved fractions of peak by kernel class (microbenchmarks).")
    efficiency: Efficiency = Field(default_factory=Efficiency, description="Overlaps and overheads (calibrated).")
    measured_busbw_gbps: MeasuredCollectives | None = Field(
        default=None, description="Measured collective bus bandwidths; used instead of the alpha-beta model.")
    kernels: KernelTables | None = Field(
        default=None, description="Measured per-kernel-class throughput tables (autopar profile hardware).")

    @model_validator(mode="after")
    def _check(self) -> "HardwareSpec":
        if self.nvlink_domain_size % self.gpus_per_node and self.gpus_per_node % self.nvlink_domain_size:
            raise ValueError(f"nvlink_domain_size ({self.nvlink_domain_size}) and gpus_per_node "
                             f"({self.gpus_per_node}) must divide one another")
        return self

    def peak_tflops(self, precision: str) -> float:
        """Dense peak for a training precision. fp8_block runs on the FP8 tensor cores."""
        from autopar.errors import AutoparInputError
        if precision not in PRECISIONS:
            raise AutoparInputError(f"unknown precision '{precision}' (choose {', '.join(PRECISIONS)})")
        value = {"bf16": self.peak_tflops_bf16, "fp16": self.peak_tflops_fp16, "fp8": self.peak_tflops_fp8,
                 "fp8_block": self.peak_tflops_fp8, "mxfp8": self.peak_tflops_mxfp8,
                 "nvfp4": self.peak_tflops_nvfp4}[precision]
        if value is None:
            raise AutoparInputError(f"hardware '{self.name}' has no {precision} tensor cores "
                                    f"(peak_tflops_{precision.replace('_block', '')} is not set)")
        return value


def fit_bounds() -> dict[str, FitBound]:
    """Every calibrated constant (a field of ``kernel_model`` or ``efficiency`` with a :class:`FitBound`), by field
    name, in field order, the kernel_model section's first."""
    return {name: m for section in (KernelModel, Efficiency) for name, f in section.model_fields.items()
            for m in f.metadata if isinstance(m, FitBound)}
