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


# Two measurements closer than this (relative) are not ordered: published throughputs are read at one iteration or
# averaged over a few, and run-to-run spread of 1% is common (torchtitan's benchmarks read one iteration).
MEASURED_TIE = 0.01


@dataclass(frozen=True)
class PairOrder:
    """Within-group pairs of records ordered as measured: ``right`` of ``pairs``; ``ties`` of the wrong ones are
    pairs the prediction cannot tell apart (equal predictions: a knob the model does not see, or one it prices at
    nothing); ``skipped`` pairs whose measurements differ by less than :data:`MEASURED_TIE`."""

    right: int
    pairs: int
    ties: int
    skipped: int

    @property
    def share(self) -> float:
        return self.right / self.pairs if self.pairs else math.nan


def pair_order(records: Sequence[Comparison], group: Sequence[str]) -> PairOrder:
    """The share of within-group pairs of records whose predictions are ordered as their measurements. A pair
    counts as right only when the prediction puts the faster run (larger ``measured`` for tokens/s, smaller for
    step times: the sign of predicted − predicted equals that of measured − measured either way) strictly ahead;
    an exact predicted tie counts as wrong. Pairs whose measurements differ by less than :data:`MEASURED_TIE` are
    left out."""
    if len(records) != len(group):
        raise ValueError("pair_order needs one group per record")
    right = pairs = ties = skipped = 0
    for i in range(len(records)):
        for j in range(i + 1, len(records)):
            a, b = records[i], records[j]
            if group[i] != group[j] or None in (a.predicted, a.measured, b.predicted, b.measured):
                continue
            if abs(a.measured - b.measured) < MEASURED_TIE * max(a.measured, b.measured):
                skipped += 1
                continue
            pairs += 1
            dp = a.predicted - b.predicted
            if dp == 0.0 or abs(dp) < 1e-9 * max(abs(a.predicted), abs(b.predicted)):
                ties += 1
            elif (dp > 0) == (a.measured > b.measured):
                right += 1
    return PairOrder(right, pairs, ties, skipped)
