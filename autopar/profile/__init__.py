"""Real training runs of one layout: ``autopar profile run``.

Light on purpose: importing this package does not import torch (planning code imports autopar without it).
The runner is per technique, one small module each: mesh, tensor_parallel, fsdp, pipeline,
context_parallel, expert_parallel, recompute; ``model`` builds the transformer, ``worker`` is the per-rank
entry point and ``launch`` spawns torchrun and collects a :class:`~autopar.profile.launch.RunResult`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from autopar.profile.launch import RunResult, run_layout
    from autopar.profile.model import scale_model

__all__ = ["RunResult", "run_layout", "scale_model"]


def __getattr__(name: str) -> Any:
    """Import on first use, so ``import autopar.profile`` stays torch-free."""
    if name in ("RunResult", "run_layout"):
        from autopar.profile import launch
        return getattr(launch, name)
    if name == "scale_model":
        from autopar.profile._scale import scale_model
        return scale_model
    raise AttributeError(name)
