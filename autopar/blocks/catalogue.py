"""The catalogue: block kind names (as ``MixerSpec.kind`` and ``ModelSpec.mlp_pattern`` spell them) to classes.

The specs build blocks through it (:func:`mixer_block`, :func:`channel_block`), and the readers of kind names
(the HF config reader, the emitters' refusals, ``autopar zoo``) list what it holds. Adding a token-mixer kind is
one file in ``autopar/blocks/`` and one line here (docs/architectures.md, "Adding a mixer kind").
"""

from __future__ import annotations

from autopar.blocks._base import Block
from autopar.blocks.attention import Attention
from autopar.blocks.deltanet import KDA, GatedDeltaNet
from autopar.blocks.gla import GLA, Lightning
from autopar.blocks.mamba import Mamba1, Mamba2
from autopar.blocks.mla import MLA
from autopar.blocks.mlp import MLP
from autopar.blocks.moe import MoE

# Token mixers by MixerSpec.kind. 'attention' is the model's own softmax attention (GQA/MQA/MHA, or MLA when the
# model sets mla) with the mixer's options.
MIXERS: dict[str, type[Block]] = {"attention": Attention, "gla": GLA, "gated_deltanet": GatedDeltaNet,
                                  "kda": KDA, "lightning": Lightning, "mamba2": Mamba2, "mamba1": Mamba1}
# Channel mixers by mlp_pattern entry ('none': no channel mixer).
CHANNELS: dict[str, type[Block]] = {"dense": MLP, "moe": MoE}

MIXER_KINDS = tuple(MIXERS)
LINEAR_KINDS = tuple(k for k, cls in MIXERS.items() if cls.has_state)


def mixer_class(kind: str, mla: bool = False) -> type[Block]:
    """The class of a token-mixer kind; ``mla``: the model's attention is multi-head latent attention."""
    return MLA if mla and kind == "attention" else MIXERS[kind]


def mixer_block(model, mixer) -> Block:
    """The block of ``mixer`` (a MixerSpec) in ``model`` (a ModelSpec, for the hidden size and attention fields)."""
    return mixer_class(mixer.kind, model.mla is not None).from_spec(model, mixer)


def attention_block(model) -> Attention:
    """The model's own attention, without per-layer options."""
    return mixer_class("attention", model.mla is not None).from_spec(model)


def channel_block(model, kind: str) -> Block | None:
    """The channel mixer of kind ``kind`` ('dense', 'moe') of ``model``; None for 'none'."""
    cls = CHANNELS.get(kind)
    return cls.from_spec(model) if cls else None
