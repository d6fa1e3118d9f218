"""What the runner implements, as a TrainingSpec (torch-free, so planning code can ask).

The runner's context parallelism of linear-attention / SSM layers passes recurrent states between CP ranks
(autopar/run/context_parallel.py), not Megatron-Core's all-to-all head split: estimates set side by side with its
measurements, and the layouts it is asked to run, use ``linear_cp = 'state_pass'``.
"""

from __future__ import annotations

from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

RUNNER_LINEAR_CP = "state_pass"


def runner_training(training: TrainingSpec, model: ModelSpec) -> TrainingSpec:
    """``training`` as the runner executes ``model`` (unchanged for a model without linear / SSM mixers)."""
    if training.linear_cp == RUNNER_LINEAR_CP or not any(mx.is_linear for mx in model.mixers.values()):
        return training
    return training.model_copy(update={"linear_cp": RUNNER_LINEAR_CP})
