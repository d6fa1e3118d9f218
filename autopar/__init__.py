"""autopar: pick the parallel layout for training a transformer on a GPU cluster.

Public API (planning never imports torch):
    autopar.estimate(model, hardware, training, layout, gpus) -> Estimate
    autopar.solve(model, hardware, training, gpus, options) -> SolveResult (ranked Plans)
    autopar.tune(...)  -> measured-best plan (Optuna over short real runs; needs the `profile` extra)
    spec types: ModelSpec, HardwareSpec, TrainingSpec, Layout; loaders load_model, load_hardware
The search (OR-Tools) and the tuner (Optuna, torch) load on first use, so `autopar estimate` starts fast.
"""

from autopar.cost import Estimate, Estimator, estimate
from autopar.errors import AutoparInputError, LayoutError
from autopar.specs import HardwareSpec, Layout, ModelSpec, TrainingSpec
from autopar.specs.loaders import load_hardware, load_model

__version__ = "0.1.0"
_LAZY = {"Plan": "autopar.search", "SearchOptions": "autopar.search", "SolveResult": "autopar.search",
         "solve": "autopar.search", "tune": "autopar.tune"}
__all__ = ["AutoparInputError", "Estimate", "Estimator", "HardwareSpec", "Layout", "LayoutError", "ModelSpec",
           "Plan", "SearchOptions", "SolveResult", "TrainingSpec", "estimate", "load_hardware", "load_model", "solve",
           "tune"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'autopar' has no attribute '{name}'")
