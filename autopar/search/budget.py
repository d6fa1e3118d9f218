"""What a plan means for a whole training run: days and GPU-hours to train on N tokens, the cost at a GPU-hour price,
the GPU count to use within a range, and whether the global batch suits the GPU count.

Time to train (seconds) = tokens / (tokens_per_s_per_gpu · gpus), with tokens_per_s_per_gpu from the plan's estimate
(autopar/cost/, analytical and approximate); GPU-hours = gpus · seconds / 3600; cost = GPU-hours · price. Restarts,
failures, evaluation and checkpointing are not counted: these are lower bounds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from autopar.cost import Estimator
from autopar.cost.result import Estimate
from autopar.errors import AutoparInputError, LayoutError
from autopar.specs.hardware import HardwareSpec
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

__all__ = ["BatchAdvice", "TrainingBudget", "batch_advice", "gpu_counts", "parse_gpu_range", "parse_tokens",
           "training_budget"]

_SUFFIX = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_tokens(text: str) -> float:
    """'15T', '300B', '2.5e12' -> tokens. Raises AutoparInputError naming --tokens."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMBGT]?)\s*", text.upper())
    if not m or float(m.group(1)) <= 0:
        raise AutoparInputError(f"--tokens: expected a positive count such as 15T, 300B or 2.5e12, got '{text}'")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def parse_gpu_range(text: str) -> tuple[int, int]:
    """'256' -> (256, 256); '256-2048' -> (256, 2048). Raises AutoparInputError naming --gpus."""
    from autopar.specs.bounds import bound_note, limit
    m = re.fullmatch(r"\s*(\d{1,12})\s*(?:-\s*(\d{1,12}))?\s*", text)
    if not m:
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise AutoparInputError(f"--gpus: expected a GPU count or a range A-B (e.g. 256-2048), got '{shown}'")
    lo = int(m.group(1))
    hi = int(m.group(2)) if m.group(2) else lo
    if not m.group(2) and lo <= 0:
        raise AutoparInputError(f"--gpus: must be between 1 and {limit('gpus'):,}, got {lo}")
    if lo <= 0 or hi < lo:
        raise AutoparInputError(f"--gpus: need 0 < A <= B, got {lo}-{hi}")
    if hi > limit("gpus"):
        raise AutoparInputError(f"--gpus: {hi:,} GPUs is beyond the bound {bound_note('gpus')}")
    return lo, hi


def gpu_counts(lo: int, hi: int) -> list[int]:
    """The GPU counts a range is searched at: lo, 2·lo, 4·lo, ... up to hi, and hi itself."""
    out, n = [], lo
    while n < hi:
        out.append(n)
        n *= 2
    return out + [hi]


@dataclass
class TrainingBudget:
    """A plan over a whole run: ``tokens`` trained at the plan's predicted throughput."""

    tokens: float
    gpus: int
    seconds: float
    gpu_hours: float
    cost: float | None          # gpu_hours · price, None without a price

    @property
    def days(self) -> float:
        return self.seconds / 86400

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "gpus": self.gpus, "days": self.days, "gpu_hours": self.gpu_hours,
                "cost": self.cost}


def training_budget(estimate: Estimate, tokens: float, gpu_hour_price: float | None = None) -> TrainingBudget:
    """Days, GPU-hours and cost of training ``tokens`` with one plan (see the module docstring)."""
    seconds = tokens / (estimate.tokens_per_s_per_gpu * estimate.gpus)
    gpu_hours = estimate.gpus * seconds / 3600
    return TrainingBudget(tokens, estimate.gpus, seconds, gpu_hours,
                          None if gpu_hour_price is None else gpu_hours * gpu_hour_price)


@dataclass
class BatchAdvice:
    """The global batch leaves the GPUs mostly waiting: the numbers, and a batch that would not."""

    global_batch: int
    tokens_per_gpu: float       # tokens per GPU per step
    compute_share: float        # compute / step time of the plan
    mfu: float
    suggested_batch: int | None
    suggested_mfu: float | None
    suggested_compute_share: float | None

    def message(self, seq_len: int, gpus: int) -> str:
        text = (f"the global batch of {self.global_batch} sequences ({self.global_batch * seq_len / 1e6:.1f}M tokens) "
                f"is {self.tokens_per_gpu:,.0f} tokens per GPU per step on {gpus} GPUs: compute is only "
                f"{self.compute_share:.0%} of the step and MFU {self.mfu:.1%}")
        if self.suggested_batch is None:
            return text + "; no global batch up to 64x larger fixes that with this layout: use fewer GPUs"
        return (text + f". A global batch of {self.suggested_batch} ({self.suggested_batch * seq_len / 1e6:.1f}M "
                f"tokens, --global-batch {self.suggested_batch}) would give MFU {self.suggested_mfu:.1%} (compute "
                f"{self.suggested_compute_share:.0%} of the step) with the same layout; check that convergence "
                "allows that batch, or use fewer GPUs")


def batch_advice(model: ModelSpec, hardware: HardwareSpec, training: TrainingSpec, gpus: int, best: Estimate,
                 min_compute_share: float = 0.5, target_compute_share: float = 0.8,
                 max_factor: int = 64) -> BatchAdvice | None:
    """None when compute is at least ``min_compute_share`` of the best plan's step. Otherwise the same layout is
    re-estimated at 2x, 4x, ... ``max_factor``x the global batch (more gradient-accumulation steps, the same memory)
    and the smallest batch whose compute share reaches ``target_compute_share`` is suggested, or else the batch with
    the highest MFU if it at least reaches ``min_compute_share``."""
    step = best.step_time_s
    share = best.time_s.compute / step
    if share >= min_compute_share:
        return None
    advice = BatchAdvice(training.global_batch, training.tokens_per_step / gpus, share, best.mfu, None, None, None)
    layout = best.layout.model_copy(update={"grad_accum": None})
    found = []
    k = 2
    while k <= max_factor:
        tr = training.model_copy(update={"global_batch": training.global_batch * k})
        try:
            e = Estimator(model, hardware, tr, gpus).estimate(layout)
        except (LayoutError, AutoparInputError):
            break
        found.append((tr.global_batch, e.mfu, e.time_s.compute / e.step_time_s))
        if found[-1][2] >= target_compute_share:
            break
        k *= 2
    pick = next((f for f in found if f[2] >= target_compute_share), None)
    if pick is None and found and max(found, key=lambda f: f[1])[2] >= min_compute_share:
        pick = max(found, key=lambda f: f[1])
    if pick:
        advice.suggested_batch, advice.suggested_mfu, advice.suggested_compute_share = pick
    return advice
