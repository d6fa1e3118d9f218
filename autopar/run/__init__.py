"""Real training runs of one layout: ``autopar profile run`` and the trials of ``autopar tune``.

Light on purpose: importing this package does not import torch (planning code imports autopar without it).
The runner is per technique, one small module each: mesh, tensor_parallel, fsdp, pipeline,
context_parallel, expert_parallel, recompute; ``model`` builds the transformer, ``worker`` is the per-rank
entry point (``torchrun -m autopar.run.worker --spec spec.json``) and ``launch`` spawns torchrun and collects
a :class:`~autopar.run.launch.RunResult`. See docs/runner.md.

The public surface for planning and measuring code (``measure/compare``, ``tune``, the CLI): ``run_layout`` and
``RunResult`` (the launcher), ``scale_model`` (a model small enough for this machine) with ``scale_notes`` (what
it changed beyond the sizes) and ``runner_training`` (the TrainingSpec the runner actually executes),
``local_gpus``, ``runs_on_cpu`` and ``check_cpu_world`` (what this node can run: its GPUs, the CPU world-size
bound). Everything else is the runner's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autopar.run._machine import check_cpu_world, local_gpus, runs_on_cpu  # torch-free
from autopar.run._training import RUNNER_LINEAR_CP, runner_training  # torch-free

if TYPE_CHECKING:  # pragma: no cover
    from autopar.run._scale import scale_model, scale_notes
    from autopar.run.launch import RunResult, run_layout

__all__ = ["RUNNER_LINEAR_CP", "RunResult", "check_cpu_world", "local_gpus", "run_layout", "runner_training",
           "runs_on_cpu", "scale_model", "scale_notes"]


def __getattr__(name: str) -> Any:
    """Import on first use, so ``import autopar.run`` stays torch-free."""
    if name in ("RunResult", "run_layout"):
        from autopar.run import launch
        return getattr(launch, name)
    if name in ("scale_model", "scale_notes"):
        from autopar.run import _scale
        return getattr(_scale, name)
    raise AttributeError(name)
