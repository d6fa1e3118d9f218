"""autopar: pick the parallel layout for training a transformer on a GPU cluster.

Public API (planning never imports torch):
    autopar.estimate(model, hardware, training, layout, gpus) -> Estimate
    autopar.solve(model, hardware, training, gpus, options) -> SolveResult (ranked Plans)
    autopar.tune(...)  -> measured-best plan (Optuna over short real runs; needs the `profile` extra)
    spec types: ModelSpec, HardwareSpec, TrainingSpec, Layout; loaders load_model, load_hardware
Every name loads on first use (PEP 562), so importing ``autopar.cli`` or ``autopar.errors`` loads neither numpy nor
pydantic: the CLI sets up its process first (autopar.cli.main), `autopar estimate` never loads OR-Tools, and the
tuner (Optuna, torch) loads only for `tune`.
"""

import importlib

__version__ = "0.1.0"
_LAZY = {"Estimate": "autopar.cost", "Estimator": "autopar.cost", "estimate": "autopar.cost",
         "AutoparInputError": "autopar.errors", "LayoutError": "autopar.errors",
         "HardwareSpec": "autopar.specs", "Layout": "autopar.specs", "ModelSpec": "autopar.specs",
         "TrainingSpec": "autopar.specs", "load_hardware": "autopar.specs.loaders", "load_model": "autopar.specs.loaders",
         "Plan": "autopar.search", "SearchOptions": "autopar.search", "SolveResult": "autopar.search",
         "solve": "autopar.search", "tune": "autopar.tune"}
__all__ = ["AutoparInputError", "Estimate", "Estimator", "HardwareSpec", "Layout", "LayoutError", "ModelSpec",
           "Plan", "SearchOptions", "SolveResult", "TrainingSpec", "estimate", "load_hardware", "load_model", "solve",
           "tune"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'autopar' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
