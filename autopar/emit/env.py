"""Environment variables describing a resolved layout, for launch scripts that read ``AUTOPAR_*``.

``env_vars`` gives the values as strings; ``format_env`` writes them as ``export K=V`` lines, each value
quoted with :func:`shlex.quote`, ready for ``source <(autopar ...)`` or ``eval``.
"""

from __future__ import annotations

import re
import shlex

from autopar.emit._common import require_resolved
from autopar.errors import AutoparInputError
from autopar.specs.layout import Layout
from autopar.specs.training import TrainingSpec

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def env_vars(layout: Layout, training: TrainingSpec, gpus: int) -> dict[str, str]:
    """AUTOPAR_* variables of a resolved layout. Booleans are "1"/"0"; AUTOPAR_STAGE_LAYERS is a comma list
    (layers per pipeline stage); AUTOPAR_RECOMPUTE is none | selective | full | a comma list of modules.
    AUTOPAR_HSDP_SHARD is added only for HSDP layouts, AUTOPAR_OFFLOAD_ACTIVATIONS (the offloaded share of stored
    activations, 0..1) only for layouts that offload."""
    require_resolved(layout, gpus=gpus)
    L = layout
    env = {
        "AUTOPAR_TP": L.tp, "AUTOPAR_PP": L.pp, "AUTOPAR_VPP": L.vpp, "AUTOPAR_CP": L.cp,
        "AUTOPAR_EP": L.ep, "AUTOPAR_ETP": L.etp, "AUTOPAR_DP": L.dp, "AUTOPAR_EDP": L.edp,
        "AUTOPAR_SP": int(L.sp), "AUTOPAR_ZERO": L.zero_stage, "AUTOPAR_FSDP": int(L.fsdp),
        "AUTOPAR_MBS": L.micro_batch, "AUTOPAR_GA": L.grad_accum, "AUTOPAR_GBS": training.global_batch,
        "AUTOPAR_SEQ_LEN": training.seq_len, "AUTOPAR_RECOMPUTE": L.recompute,
        "AUTOPAR_STAGE_LAYERS": ",".join(map(str, L.stage_layers)), "AUTOPAR_WORLD": gpus,
    }
    if L.hsdp_shard is not None:
        env["AUTOPAR_HSDP_SHARD"] = L.hsdp_shard
    if L.offload_activations:
        env["AUTOPAR_OFFLOAD_ACTIVATIONS"] = L.offload_activations
    return {k: str(v) for k, v in env.items()}


def format_env(variables: dict[str, str]) -> str:
    """``export K=V`` lines (values shell-quoted), one per variable, in the given order."""
    lines = []
    for key, value in variables.items():
        if not _NAME.match(key):
            raise AutoparInputError(f"'{key}' is not a valid shell variable name")
        lines.append(f"export {key}={shlex.quote(str(value))}")
    return "\n".join(lines) + "\n"
