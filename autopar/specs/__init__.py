"""Typed inputs of autopar: the model, the hardware, the training run and the layout."""

from autopar.specs.hardware import PRECISIONS, Efficiency, HardwareSpec, MeasuredCollectives
from autopar.specs.layout import Layout, check_layout, resolve_layout
from autopar.specs.model import MLASpec, ModelSpec, MoESpec
from autopar.specs.training import TrainingSpec

__all__ = ["PRECISIONS", "Efficiency", "HardwareSpec", "Layout", "MLASpec", "MeasuredCollectives", "ModelSpec",
           "MoESpec", "TrainingSpec", "check_layout", "resolve_layout"]
