"""Real training runs of one layout: ``autopar profile run`` and the trials of ``autopar tune``.

Light on purpose: importing this package does not import torch (planning code imports autopar without it).
The runner is per technique, one small module each: mesh, tensor_parallel, fsdp, pipeline,
context_parallel, expert_parallel, recompute; ``model`` builds the transformer, ``worker`` is the per-rank
entry point (``torchrun -m autopar.run.worker --spec spec.json``) and ``launch`` spawns torchrun and collects
a :class:`~autopar.run.launch.RunResult`. See docs/runner.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from autopar.run._scale import scale_model
    from autopar.run.launch import RunResult, run_layout

__all__ = ["RunResult", "run_layout", "scale_model"]


def __getattr__(name: str) -> Any:
    """Import on first use, so ``import autopar.run`` stays torch-free."""
    if name in ("RunResult", "run_layout"):
        from autopar.run import launch
        return getattr(launch, name)
    if name == "scale_model":
        from autopar.run._scale import scale_model
        return scale_model
    raise AttributeError(name)
