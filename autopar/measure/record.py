"""The one predicted-vs-measured record, shared by ``autopar validate`` (published runs), ``autopar profile
compare`` (real runs of layouts) and ``autopar tune`` (its trials), and the figures computed over them.

The error is always relative and signed, ``predicted / measured - 1``: +10% means the cost model predicted a
figure 10% above the measurement (for a step time: too slow; for tokens/s: too fast). Rank agreement is
Kendall's tau-b (Kendall 1945, "The treatment of ties in ranking problems"), computed by
``scipy.stats.kendalltau``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    """``predicted / measured - 1``; None when either is missing or the measurement is not positive."""
    if predicted is None or measured is None or not measured > 0:
        return None
    return predicted / measured - 1.0


@dataclass(kw_only=True)
class Comparison:
    """One prediction next to its measurement.

    ``quantity`` names what ``predicted`` and ``measured`` hold: ``"step_s"`` (seconds per step) or
    ``"tokens_per_s_per_gpu"``. ``fits``: whether the cost model predicts the layout fits in memory (None when
    not asked). Memory, when both sides have it, is per GPU in GiB (the fullest rank for a measurement)."""

    label: str
    predicted: float | None = None
    measured: float | None = None
    quantity: str = "step_s"
    fits: bool | None = None
    predicted_mem_gib: float | None = None
    measured_mem_gib: float | None = None

    @property
    def error(self) -> float | None:
        """Signed relative error of the prediction, ``predicted / measured - 1``."""
        return relative_error(self.predicted, self.measured)

    @property
    def mem_error(self) -> float | None:
        """Signed relative error of the predicted memory."""
        return relative_error(self.predicted_mem_gib, self.measured_mem_gib)


def _errors(records: Iterable[Comparison]) -> list[float]:
    return [abs(e) for e in (r.error for r in records) if e is not None and math.isfinite(e)]


def mean_abs_error(records: Iterable[Comparison]) -> float:
    """Mean |relative error| over the records that have one; NaN when none has."""
    errs = _errors(records)
    return sum(errs) / len(errs) if errs else math.nan


def max_abs_error(records: Iterable[Comparison]) -> float:
    """Largest |relative error|; NaN when no record has one."""
    return max(_errors(records), default=math.nan)


def rank_agreement(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Kendall's tau-b of two equally long sequences: 1 for the same order, -1 for the reverse, NaN when
    either is constant or shorter than 2 (``scipy.stats.kendalltau``, ties counted as in tau-b)."""
    if len(predicted) != len(measured):
        raise ValueError(f"rank_agreement needs two sequences of the same length (got {len(predicted)}, "
                         f"{len(measured)})")
    if len(predicted) < 2:
        return math.nan
    from scipy.stats import kendalltau
    return float(kendalltau(predicted, measured).statistic)
