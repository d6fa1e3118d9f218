"""Typed result of one estimate: per-GPU memory and step time, each a sum of named terms."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from autopar.specs.layout import Layout

GIB = 2 ** 30


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Per-GPU memory of the fullest pipeline stage, GiB. ``total`` is the sum of the six terms."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    buffers: float
    reserve: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.buffers + self.reserve

    def to_dict(self) -> dict[str, float]:
        d = asdict(self)
        d["total"] = self.total
        return d


@dataclass(frozen=True, slots=True)
class TimeBreakdown:
    """Seconds per optimizer step on the critical path. ``total`` is the step time.

    compute: GEMMs and attention of all micro-batches of the slowest stage, recomputation included;
    tp/cp/ep: exposed (not overlapped) tensor/context/expert-parallel communication; dp: exposed data-parallel
    gradient reduction and FSDP parameter gathers; pp_bubble: pipeline fill and drain; pp_p2p: exposed
    stage-to-stage sends; optimizer: the memory-bound Adam update; offload: exposed activation-offload copies
    (0 unless the layout offloads activations)."""

    compute: float
    tp: float
    cp: float
    ep: float
    dp: float
    pp_bubble: float
    pp_p2p: float
    optimizer: float
    offload: float = 0.0

    @property
    def total(self) -> float:
        return (self.compute + self.tp + self.cp + self.ep + self.dp + self.pp_bubble + self.pp_p2p
                + self.optimizer + self.offload)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    def largest(self) -> str:
        """Name of the largest term (the bottleneck)."""
        return max(_TIME_TERMS, key=lambda n: getattr(self, n))


_TIME_TERMS = tuple(f.name for f in fields(TimeBreakdown))   # in declaration order (ties go to the first)


@dataclass(frozen=True, slots=True)
class Estimate:
    """Prediction for one layout. Everything per GPU unless the name says otherwise."""

    layout: Layout
    gpus: int
    fits: bool
    hbm_gib: float
    memory_gib: MemoryBreakdown
    time_s: TimeBreakdown
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float
    bottleneck: str
    worst_stage: int
    notes: tuple[str, ...] = ()
    host_offload_gib: float = 0.0   # offloaded activations in host memory per GPU (fullest stage)

    @property
    def step_time_s(self) -> float:
        return self.time_s.total

    def to_dict(self) -> dict:
        """The JSON contract of ``autopar estimate --json`` (see README)."""
        lay = self.layout.model_dump(mode="json")
        lay["edp"] = self.layout.edp
        lay["sequence_parallel"] = self.layout.sp
        return {
            "fits": self.fits,
            "hbm_gib": self.hbm_gib,
            "memory_gib": self.memory_gib.to_dict(),
            "step_time_s": self.step_time_s,
            "time_s": self.time_s.to_dict(),
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu,
            "bottleneck": self.bottleneck,
            "worst_stage": self.worst_stage,
            "gpus": self.gpus,
            "layout": lay,
            "host_offload_gib": self.host_offload_gib,
            "notes": list(self.notes),
        }
