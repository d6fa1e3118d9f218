"""Launcher-ready settings from a Layout: Megatron-LM arguments, a torchtitan config, or shell environment.

``emit(kind, layout, model, training, gpus, hardware)`` validates and resolves the layout
(:func:`autopar.specs.resolve_layout`) and returns text for ``kind``: ``megatron`` (a bash fragment: version,
environment, ``AUTOPAR_MEGATRON_ARGS=(...)``), ``bridge`` (Megatron-Bridge recipe overrides, the same
settings), ``torchtitan`` (a Python module defining
``autopar_config() -> Trainer.Config`` for torchtitan 0.3.0; TOML sections with ``torchtitan_version="0.2.2"``) or ``env``
(``export AUTOPAR_*=...`` lines). ``hardware`` tells the Megatron emitter which overlaps the prediction counts.
"""

from __future__ import annotations

from autopar.emit.bridge import bridge_overrides, format_bridge
from autopar.emit.env import env_vars, format_env
from autopar.emit import megatron_hybrid, torchtitan
from autopar.emit.megatron import format_megatron, format_megatron_launch, megatron_args, megatron_launch
from autopar.emit.torchtitan import TORCHTITAN_VERSION, TORCHTITAN_VERSIONS, torchtitan_config
from autopar.errors import AutoparInputError
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import Layout, resolve_layout
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

__all__ = ["EMIT_KINDS", "emit_refusal", "bridge_overrides", "format_bridge", "TORCHTITAN_VERSION", "TORCHTITAN_VERSIONS", "emit", "env_vars", "format_env", "format_megatron", "format_megatron_launch", "megatron_args", "megatron_launch", "torchtitan_config"]

EMIT_KINDS = ("megatron", "bridge", "torchtitan", "env")


def emit_refusal(kind: str, model: ModelSpec) -> str | None:
    """Why launcher ``kind`` cannot train ``model`` at all, whatever the layout (None: it can): hybrid layers that
    Megatron-Core's HybridModel (megatron, bridge) or torchtitan (no Mamba / linear-attention model) lacks.
    :func:`emit` raises AutoparInputError with this reason; ``solve`` prints it as a note instead of the settings."""
    if kind in ("megatron", "bridge") and model.is_hybrid:
        why = megatron_hybrid.hybrid_refusal(model)
        return f"Megatron-LM cannot train {model.name}: {why}" if why else None
    if kind == "torchtitan":
        why = torchtitan.hybrid_refusal(model)
        return f"torchtitan cannot train this model: {why}" if why else None
    return None


def emit(kind: str, layout: Layout, model: ModelSpec, training: TrainingSpec, gpus: int,
         hardware: HardwareSpec | None = None, torchtitan_version: str = TORCHTITAN_VERSION) -> str:
    """Text for one launcher. Raises AutoparInputError for an unknown kind or an invalid layout."""
    if kind not in EMIT_KINDS:
        raise AutoparInputError(f"unknown emit kind '{kind}' (choose {', '.join(EMIT_KINDS)})")
    resolved = resolve_layout(layout, model, training, gpus)
    if kind == "megatron":
        return format_megatron_launch(megatron_launch(resolved, model, training, hardware),
                                      f"autopar layout {resolved.short()} on {gpus} GPUs ({model.name})")
    if kind == "bridge":
        overrides, launch = bridge_overrides(resolved, model, training, hardware)
        return format_bridge(overrides, launch, f"autopar layout {resolved.short()} on {gpus} GPUs ({model.name})")
    if kind == "torchtitan":
        return torchtitan_config(resolved, model, training, hardware, version=torchtitan_version)
    return format_env(env_vars(resolved, training, gpus))
