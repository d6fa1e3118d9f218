"""Activation recomputation with ``torch.utils.checkpoint`` (Chen et al. 2016; Korthikanti et al. 2022).

Policies, as Layout.recompute names them:
- ``full``: each transformer block is recomputed in backward (only its input is kept);
- ``selective``: core attention only (scores, softmax, AV), the part whose activations grow with s²;
- a module list (Megatron-LM ``--recompute-modules``): ``core_attn``, ``layernorm`` (both norms), ``mlp``
  (dense MLP), ``moe`` (whole MoE block), ``moe_act`` (expert activation), ``shared_experts``.
  ``mla_up_proj`` has nothing to recompute here, because MLA is approximated by standard attention.

Applied after tensor/context/expert parallelism (so their plans see the original module names) and before
FSDP, as in torchtitan.
"""

from __future__ import annotations

import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from autopar.run.model import Transformer
from autopar.specs.layout import Layout


class Checkpointed(nn.Module):
    """Runs ``inner`` under non-reentrant checkpointing: its activations are recomputed in backward."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        return checkpoint(self.inner, *args, use_reentrant=False)


def _wrap(parent: nn.Module, name: str) -> None:
    child = getattr(parent, name, None)
    if child is not None:
        setattr(parent, name, Checkpointed(child))


def apply_recompute(model: Transformer, layout: Layout) -> list[str]:
    """Wrap the modules the policy names; returns what was wrapped, e.g. ['block'] or ['core_attn', 'mlp']."""
    if layout.recompute == "none":
        return []
    if layout.recompute == "full":
        for key in list(model.layers.keys()):
            model.layers[key] = Checkpointed(model.layers[key])
        return ["block"]
    mods = layout.recompute_modules
    for block in model.layers.values():
        if "core_attn" in mods:
            for mixer in [block.attention, *(block.parallel or ())]:
                _wrap(mixer, "core")
        if "layernorm" in mods:
            _wrap(block, "attention_norm")
            _wrap(block, "ffn_norm")
        if "mlp" in mods and hasattr(block, "feed_forward"):
            _wrap(block, "feed_forward")
        if hasattr(block, "moe"):
            if "moe_act" in mods:
                _wrap(block.moe.experts, "act")
            if "shared_experts" in mods:
                _wrap(block.moe, "shared")
            if "moe" in mods:
                _wrap(block, "moe")
    return sorted(mods - {"mla_up_proj"})
