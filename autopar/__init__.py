"""autopar: pick the parallel layout for training a transformer on a GPU cluster.

Public API (planning never imports torch):
    autopar.estimate(model, hardware, training, layout, gpus) -> Estimate
    autopar.solve(model, hardware, training, gpus, options) -> SolveResult (ranked Plans)
    spec types: ModelSpec, HardwareSpec, TrainingSpec, Layout; loaders load_model, load_hardware
"""

from autopar.cost import Estimate, Estimator, estimate
from autopar.errors import AutoparInputError, LayoutError
from autopar.search import Plan, SearchOptions, SolveResult, solve
from autopar.specs import HardwareSpec, Layout, ModelSpec, TrainingSpec
from autopar.specs.loaders import load_hardware, load_model

__version__ = "0.1.0"
__all__ = ["AutoparInputError", "Estimate", "Estimator", "HardwareSpec", "Layout", "LayoutError", "ModelSpec",
           "Plan", "SearchOptions", "SolveResult", "TrainingSpec", "estimate", "load_hardware", "load_model", "solve"]
