"""Token mixers other than the model's standard attention: what a layer of a hybrid model uses to mix tokens.

A :class:`MixerSpec` is named in ``ModelSpec.mixers`` and placed by ``ModelSpec.layer_pattern``. It holds the
typed fields; what a layer of each kind *is* (parameters, FLOPs, kernels, stored activations, state, TP/CP
rules, and which fields a kind takes) lives in its block file under :mod:`autopar.blocks` (the kinds and their
sources: :mod:`autopar.blocks.catalogue`, docs/architectures.md). Kinds:

``attention``       softmax attention with the model's heads (GQA/MQA/MHA or MLA, from the ModelSpec fields), with
                    this layer's own options: a sliding ``window``, a ``chunk`` (Llama 4), ``sinks`` (GPT-OSS) and
                    an ``output_gate`` (Qwen3-Next) — :mod:`autopar.blocks.attention`, :mod:`autopar.blocks.mla`.
``gla``, ``lightning``             :mod:`autopar.blocks.gla`
``gated_deltanet``, ``kda``        :mod:`autopar.blocks.deltanet`
``mamba2``, ``mamba1``             :mod:`autopar.blocks.mamba`
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from autopar.blocks.catalogue import MIXER_KINDS, MIXERS
from autopar.specs._base import Spec

MixerKind = Literal[MIXER_KINDS]


class MixerSpec(Spec):
    """One token-mixer kind, placed on layers by ``ModelSpec.layer_pattern``. Fields not used by a kind must
    stay unset (checked)."""

    kind: MixerKind = Field(description="attention | gla | gated_deltanet | kda | lightning | mamba2 | mamba1.")
    # softmax attention options (heads and dims are the model's)
    window: int | None = Field(default=None, gt=0, description="attention: sliding window in tokens.")
    chunk: int | None = Field(default=None, gt=0, description="attention: chunked attention, tokens per chunk.")
    sinks: bool = Field(default=False, description="attention: one learned sink logit per head (GPT-OSS).")
    output_gate: bool = Field(default=False, description="Sigmoid/SiLU output gate of width heads·value dim "
                                                         "projected from the hidden state (Qwen3-Next, GLA, GDN).")
    # linear attention / SSM shape
    num_heads: int | None = Field(default=None, gt=0, description="Heads (GDN: query/key heads H_k; Mamba-2: H).")
    num_value_heads: int | None = Field(default=None, gt=0, description="GDN: value heads H_v; None = num_heads.")
    head_dim: int | None = Field(default=None, gt=0, description="Key head dim d_k (Mamba-2: head dim P).")
    value_head_dim: int | None = Field(default=None, gt=0, description="Value head dim d_v; None = head_dim.")
    gate_low_rank: int | None = Field(default=None, gt=0, description="GLA: rank r of the forget-gate projection.")
    conv_kernel: int = Field(default=0, ge=0, description="Short causal convolution width K (0 = none).")
    state_size: int | None = Field(default=None, gt=0, description="Mamba-1 / Mamba-2: state size N.")
    inner_size: int | None = Field(default=None, gt=0, description="Mamba-1: inner width d (expand·h; channels of "
                                                                   "the scan).")
    dt_rank: int | None = Field(default=None, gt=0, description="Mamba-1: rank R of the Δ projection "
                                                                "(x_proj -> R -> dt_proj).")
    bc_norms: bool = Field(default=False, description="Mamba-1: RMSNorms on Δ (R), B and C (N each) before the "
                                                      "scan (Jamba's dt/b/c_layernorm).")
    n_groups: int = Field(default=1, gt=0, description="Mamba-2: groups G sharing B and C.")
    chunk_size: int = Field(default=64, gt=0, description="Chunk length C of the chunked scan (FLA, SSD: 64).")

    @model_validator(mode="after")
    def _check(self) -> "MixerSpec":
        why = MIXERS[self.kind].field_problem(self)     # each kind checks its own fields (autopar.blocks)
        if why:
            raise ValueError(why)
        return self

    @property
    def is_linear(self) -> bool:
        """Linear attention or SSM: a fixed-size recurrent state instead of a KV cache."""
        return MIXERS[self.kind].has_state

    @property
    def is_softmax(self) -> bool:
        """Softmax attention: a KV cache, K and V exchanged around the CP ring."""
        return MIXERS[self.kind].keeps_kv

    @property
    def v_heads(self) -> int:
        return self.num_value_heads or self.num_heads or 0

    @property
    def dk(self) -> int:
        return self.head_dim or 0

    @property
    def dv(self) -> int:
        return self.value_head_dim or self.head_dim or 0

    @property
    def d_inner(self) -> int:
        """Mamba-2: H·P; Mamba-1: inner_size (only Mamba-1 sets it)."""
        return self.inner_size or (self.num_heads or 0) * (self.head_dim or 0)
