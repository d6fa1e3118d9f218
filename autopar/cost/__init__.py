"""Analytical cost model: per-GPU memory and step time of a layout as sums of named terms.

One module per term family — memory, compute, tp, cp, ep, dp, pipeline, optimizer — assembled by
:class:`Estimator`. :func:`estimate` is the one-call form; the search builds an Estimator once.
"""

from __future__ import annotations

from pathlib import Path

from autopar.cost.estimator import Estimator
from autopar.cost.result import Estimate, MemoryBreakdown, TimeBreakdown
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import Layout
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec


def estimate(model: ModelSpec | str | Path, hardware: HardwareSpec | str | Path, training: TrainingSpec,
             layout: Layout, gpus: int) -> Estimate:
    """Predict per-GPU memory and step time of ``layout`` on ``gpus`` GPUs. Raises AutoparInputError
    (LayoutError) listing every broken rule when the layout is invalid."""
    from autopar.specs.loaders import load_hardware, load_model
    return Estimator(load_model(model), load_hardware(hardware), training, gpus).estimate(layout)


__all__ = ["Estimate", "Estimator", "MemoryBreakdown", "TimeBreakdown", "estimate"]
