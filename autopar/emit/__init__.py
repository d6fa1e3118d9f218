"""Launcher-ready settings from a Layout: Megatron-LM arguments, torchtitan TOML, or shell environment.

``emit(kind, layout, model, training, gpus)`` validates and resolves the layout
(:func:`autopar.specs.resolve_layout`) and returns text for ``kind``: ``megatron`` (shell-ready argument
lines), ``torchtitan`` (TOML sections) or ``env`` (``export AUTOPAR_*=...`` lines).
"""

from __future__ import annotations

from autopar.emit.env import env_vars, format_env
from autopar.emit.megatron import format_megatron, megatron_args
from autopar.emit.torchtitan import torchtitan_config
from autopar.errors import AutoparInputError
from autopar.specs.layout import Layout, resolve_layout
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

__all__ = ["EMIT_KINDS", "emit", "env_vars", "format_env", "format_megatron", "megatron_args", "torchtitan_config"]

EMIT_KINDS = ("megatron", "torchtitan", "env")


def emit(kind: str, layout: Layout, model: ModelSpec, training: TrainingSpec, gpus: int) -> str:
    """Text for one launcher. Raises AutoparInputError for an unknown kind or an invalid layout."""
    if kind not in EMIT_KINDS:
        raise AutoparInputError(f"unknown emit kind '{kind}' (choose {', '.join(EMIT_KINDS)})")
    resolved = resolve_layout(layout, model, training, gpus)
    if kind == "megatron":
        return format_megatron(megatron_args(resolved, model, training))
    if kind == "torchtitan":
        return torchtitan_config(resolved, model, training)
    return format_env(env_vars(resolved, training, gpus))
