"""HardwareSpec: one GPU type and the network around it.

Datasheet numbers (peak TFLOP/s, HBM, link bandwidths) live in ``hardware/*.yaml`` and nowhere else. The
``efficiency`` section holds the achievable fractions that calibration (``autopar validate --fit`` and
``autopar profile compare``) fits to measurements; ``measured_busbw_gbps`` holds collective bus-bandwidth
tables measured by ``autopar profile hardware`` (as the example report's ``AR={2: 23.1, 4: 46.3, 8: 80.1}``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from autopar.specs._base import Spec
from autopar.specs.bounds import limit

Precision = Literal["bf16", "fp16", "fp8", "fp8_block", "mxfp8", "nvfp4"]
PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp8", "fp8_block", "mxfp8", "nvfp4")
CollectiveOp = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]


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


class Efficiency(Spec):
    """Achievable fractions of datasheet peaks. Defaults are starting points; calibration overwrites them."""

    gemm: dict[str, Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=lambda: {"bf16": 0.6, "fp16": 0.6, "fp8": 0.45, "fp8_block": 0.4, "mxfp8": 0.45,
                                 "nvfp4": 0.35},
        description="Achieved/peak dense TFLOP/s of a whole training step's math, per precision.")
    nvlink: float = Field(default=0.75, gt=0, le=1, description="Achieved/peak bandwidth of collectives on NVLink.")
    scaleout: float = Field(default=0.75, gt=0, le=1, description="Achieved/peak bandwidth on the scale-out network.")
    hbm: float = Field(default=0.8, gt=0, le=1, description="Achieved/peak HBM bandwidth (optimizer step).")
    host_link: float = Field(default=0.8, gt=0, le=1,
                             description="Achieved/peak GPU<->host copy bandwidth (pinned memory, activation offload).")
    dp_overlap: float = Field(default=0.8, ge=0, le=1,
                              description="Fraction of DP/FSDP communication hidden behind compute.")
    tp_overlap: float = Field(default=0.0, ge=0, le=1,
                              description="Fraction of TP/SP communication hidden (TP comm-overlap).")
    ep_overlap: float = Field(default=0.0, ge=0, le=1, description="Fraction of EP all-to-all hidden.")
    cp_overlap: float = Field(default=0.5, ge=0, le=1,
                              description="Fraction of ring-attention KV exchange hidden behind attention.")
    pp_overlap: float = Field(default=0.0, ge=0, le=1, description="Fraction of pipeline send/recv hidden.")
    moe_dropless_imbalance: float = Field(
        default=1.3, ge=1.0, le=4.0,
        description="Tokens on the busiest expert rank / the mean, under dropless routing (calibrated); the routed "
                    "expert math and the all-to-all wait for that rank.")
    elementwise_passes: float = Field(
        default=40.0, ge=0, le=400,
        description="Hidden-size-wide activation tensors read or written per layer and token by the non-GEMM "
                    "kernels (norms, residual adds, rotary, activation functions, casts) over forward + backward; "
                    "their HBM traffic is time the GEMM roofline does not see (calibrated).")

    def gemm_for(self, precision: str) -> float:
        if precision in self.gemm:
            return self.gemm[precision]
        raise KeyError(precision)


class HardwareSpec(Spec):
    """One accelerator type and its interconnect. Bandwidths are per GPU, one direction, in GB/s (1e9 B/s)."""

    name: str = Field(description="Short identifier, e.g. 'h100_sxm'.")
    source: str = Field(default="", description="Datasheet or paper the numbers come from.")
    peak_tflops_bf16: float = Field(gt=0, description="Dense BF16 tensor-core peak, TFLOP/s (no sparsity).")
    peak_tflops_fp16: float = Field(gt=0, description="Dense FP16 tensor-core peak, TFLOP/s.")
    peak_tflops_fp8: float | None = Field(default=None, gt=0, description="Dense FP8 peak, TFLOP/s; None = none.")
    peak_tflops_mxfp8: float | None = Field(default=None, gt=0, description="Dense MXFP8 peak; None = none.")
    peak_tflops_nvfp4: float | None = Field(default=None, gt=0, description="Dense NVFP4 peak; None = none.")
    hbm_gib: float = Field(gt=0, description="HBM capacity per GPU, GiB.")
    hbm_tbps: float = Field(gt=0, description="HBM bandwidth per GPU, TB/s.")
    gpus_per_node: int = Field(gt=0, le=limit("gpus_per_node"), description="GPUs per server (scale-out NICs are counted per GPU).")
    nvlink_domain_size: int = Field(gt=0, le=limit("nvlink_domain"), description="GPUs in one NVLink/xGMI domain (8 on HGX, 72 on NVL72).")
    nvlink_gbps: float = Field(gt=0, description="NVLink bandwidth per GPU per direction, GB/s.")
    scaleout_gbps: float = Field(gt=0, description="Scale-out (InfiniBand/RoCE) bandwidth per GPU per direction, GB/s.")
    host_link_gbps: float | None = Field(
        default=None, gt=0, description="GPU<->host-memory bandwidth per GPU per direction, GB/s (PCIe or "
                                        "NVLink-C2C); None = unknown, activation offloading is then unavailable.")
    host_memory_gib: float | None = Field(
        default=None, gt=0, description="Host DRAM per GPU on the reference server (total / GPUs per node), GiB; "
                                        "room for offloaded activations.")
    nvlink_latency_us: float = Field(default=3.0, ge=0, description="Per-step latency (alpha) inside the domain, us.")
    scaleout_latency_us: float = Field(default=8.0, ge=0, description="Per-step latency across the network, us.")
    reserve_gib: float = Field(default=3.0, ge=0,
                               description="HBM the framework keeps (CUDA context, allocator fragmentation), GiB.")
    fragmentation: float = Field(default=0.02, ge=0, le=1,
                                 description="Extra HBM lost to caching-allocator fragmentation, as a fraction of "
                                             "the modelled memory. Default 2%: PyTorch's allocator with "
                                             "expandable_segments (as Megatron/NeMo launchers run it) leaves little "
                                             "fragmentation; raise it for the default allocator.")
    efficiency: Efficiency = Field(default_factory=Efficiency, description="Achievable fractions (calibrated).")
    measured_busbw_gbps: MeasuredCollectives | None = Field(
        default=None, description="Measured collective bus bandwidths; used instead of the alpha-beta model.")

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
