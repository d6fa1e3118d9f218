"""The anatomy of one layer, per block kind, on the ground floor: imports nothing else of autopar.

One small file per kind, each answering everything about one sub-layer per token from plain numbers:
parameters (dense, expert, replicated KV), forward FLOPs (GEMM and core), its GEMMs with their TP split and
recompute module, memory-bound bytes, stored activations by role, recurrent state, all-to-all widths, and its
TP/CP/EP divisibility rules as data (:class:`Rule`). :mod:`autopar.blocks.catalogue` maps kind names to classes.

    attention.py  softmax attention (window, chunk, sinks, output gate)     mla.py   multi-head latent attention
    mlp.py        dense MLP                                                 moe.py   router, routed + shared experts
    gla.py        GLA, Lightning                                            deltanet.py  Gated DeltaNet, KDA
    mamba.py      Mamba-2, Mamba-1
"""

from autopar.blocks._base import SPLITS, Block, Linear, Rule
from autopar.blocks.attention import Attention
from autopar.blocks.catalogue import (CHANNELS, LINEAR_KINDS, MIXER_KINDS, MIXERS, attention_block, channel_block,
                                      mixer_block, mixer_class)
from autopar.blocks.deltanet import KDA, GatedDeltaNet
from autopar.blocks.gla import GLA, Lightning
from autopar.blocks.mamba import Mamba1, Mamba2
from autopar.blocks.mla import MLA
from autopar.blocks.mlp import MLP
from autopar.blocks.moe import MoE

__all__ = ["SPLITS", "Block", "Linear", "Rule", "Attention", "MLA", "MLP", "MoE", "GLA", "Lightning",
           "GatedDeltaNet", "KDA", "Mamba2", "Mamba1", "MIXERS", "CHANNELS", "MIXER_KINDS", "LINEAR_KINDS",
           "mixer_class", "mixer_block", "attention_block", "channel_block"]
