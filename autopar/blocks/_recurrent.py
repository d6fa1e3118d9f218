"""What linear-attention and SSM mixers share: a fixed-size recurrent state, input projections to everything the
scan reads, a chunked scan, an output projection, and a split by heads (Mamba-1: by channels).

Kernels: the input projections are one column-parallel GEMM h -> in_width, the output projection a row-parallel
GEMM out_width -> h; the chunked scan (:meth:`Recurrent.scan_flops`) is priced as one more column-parallel GEMM of
the same FLOPs with K = its key head dim (Mamba-1: its state size), in part ``ssm_scan`` (:data:`SCAN_MODULE`): its
tensor-core work, in BF16 under every FP8 recipe (the scans are Triton kernels, mamba_ssm's and
flash-linear-attention's; Transformer Engine's fp8_autocast quantises only its own Linear / GroupedLinear modules),
re-run by full recompute only (:data:`SCAN_MODULE`). A kind that inventories its scan kernels' HBM
traffic (Mamba-2: :meth:`autopar.blocks.mamba.Mamba2.scan_bytes`) adds it to the same part as memory-bound bytes,
and the part costs the larger of the two per pass (a roofline; autopar.cost.compute.BF16_PARTS). The sub-block's
pre-norm and residual add are counted as every sub-block counts its own (:func:`autopar.blocks._base.norm_residual`).

Under all-to-all context parallelism (Megatron-Core ``MambaContextParallel``, ``GatedDeltaNet``) the input
projections' output and the scan's output are swapped between a sequence and a head split: in_width + out_width
elements per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autopar.blocks._base import Block, Linear, Rule, norm_residual

_HEADS_NOTE = " (all-to-all context parallel splits heads)"
# The part (and kernel class) of a linear mixer's chunked scan. No selective recompute module re-runs it, only full
# recompute: Megatron-Core's MambaLayer is norm, mixer, bias-dropout-add with no checkpointed sub-module
# (NVIDIA/Megatron-LM@03453aee megatron/core/ssm/mamba_layer.py; the ``core_attn`` checkpoint lives in the softmax
# Attention module), and its mixer's stored activations stay (:meth:`Recurrent.stored`).
SCAN_MODULE = "ssm_scan"
# MixerSpec fields that belong to one kind only, and the message when another kind sets them.
_OWNED = {"state_size": "state_size is a mamba2 field, not {k}'s",
          "gate_low_rank": "gate_low_rank is a gla / kda field, not {k}'s",
          "num_value_heads": "num_value_heads is a gated_deltanet field, not {k}'s"}


@dataclass(frozen=True)
class Recurrent(Block):
    """A linear mixer: subclasses give the projections, the scan, the state and what they store."""

    has_state = True

    hidden: int
    conv_kernel: int = 0

    @classmethod
    def field_problem(cls, spec) -> str | None:
        """Why a MixerSpec of this kind is malformed (None = it is not)."""
        if spec.window or spec.chunk or spec.sinks:
            return f"window, chunk and sinks are softmax-attention options, not {cls.kind}'s"
        return cls._own_field_problem(spec)

    @classmethod
    def _own_field_problem(cls, spec) -> str | None:
        return None

    # ---- what subclasses give ----
    def other_params(self) -> int:
        """Non-GEMM weights: convolutions, gate biases, decay parameters, norms."""
        return 0

    def conv_channels(self) -> int:
        """Channels of the short causal convolution."""
        return 0

    def out_width(self) -> int:
        """Width of the scan's output, the output projection's input."""
        return 0

    def stored_io(self) -> tuple[float, float]:
        """(projected inputs of the scan, scan output) elements per token kept for the backward pass."""
        return 0.0, 0.0

    def core_gemm_k(self) -> int:
        """K of the GEMM the scan is priced as."""
        return 1

    # ---- derived ----
    def params(self) -> int:
        return self.gemm_params() + self.other_params()

    def in_width(self) -> int:
        """Width of the input projections' output (everything the scan and its gates read per token)."""
        h = self.hidden
        return (self.gemm_params() - self.out_width() * h) // h

    def a2a_elems(self) -> int:
        return self.in_width() + self.out_width()

    def conv_flops(self) -> float:
        """Short causal convolution (FLA ``ShortConvolution``, Mamba's conv1d): 2·K FLOPs per channel per token."""
        return 2.0 * self.conv_kernel * self.conv_channels()

    def conv_tail(self) -> int:
        """The last K − 1 convolution inputs, part of the state handed on."""
        return max(self.conv_kernel - 1, 0) * self.conv_channels()

    def gemms(self) -> tuple[Linear, ...]:
        h, kdim = self.hidden, self.core_gemm_k()
        return (Linear(h, self.in_width(), "col", "attn"), Linear(self.out_width(), h, "row", "attn"),
                Linear(kdim, int(round(self.scan_flops() / (2.0 * kdim))), "col", SCAN_MODULE))

    def scan_bytes(self) -> tuple[float, float]:
        """(forward, backward) HBM traffic of the scan's own kernels per token, in 2-byte units (an fp32 tensor counts
        2 per element); 0 where a kind has no kernel inventory yet (its scan is priced by its FLOPs alone)."""
        return 0.0, 0.0

    def membound(self) -> dict[str, tuple[float, float]]:
        out = norm_residual(self.hidden)
        fwd, bwd = self.scan_bytes()
        if fwd or bwd:
            out[SCAN_MODULE] = (fwd, bwd)
        return out

    def fp8_cast_width(self) -> int:
        h = self.hidden
        return h + self.in_width() + self.out_width() + h

    def stored(self) -> dict[str, float]:
        """The scan's inputs and its output, all in role ``qkv``: no selective recompute module drops them
        (:data:`SCAN_MODULE`)."""
        stored_in, stored_out = self.stored_io()
        return {"qkv": stored_in + stored_out}


@dataclass(frozen=True)
class HeadMixer(Recurrent):
    """A linear mixer split by heads (GLA, Lightning, Gated DeltaNet, KDA, Mamba-2)."""

    heads: int = 0
    head_dim: int = 0
    value_head_dim: int = 0
    output_gate: bool = False
    chunk_size: int = 64

    @classmethod
    def from_spec(cls, model, mixer, **kind_fields) -> "HeadMixer":
        """The block of ``mixer`` in ``model``: the head fields every head mixer shares, ``kind_fields`` (a kind's
        own, from its from_spec) and :meth:`_extra` (a mixed-in part's, e.g. LowRankGated's gate)."""
        return cls(hidden=model.hidden_size, conv_kernel=mixer.conv_kernel, heads=mixer.num_heads,
                   head_dim=mixer.head_dim, value_head_dim=mixer.value_head_dim or 0, output_gate=mixer.output_gate,
                   chunk_size=mixer.chunk_size, **kind_fields, **cls._extra(mixer))

    @classmethod
    def _extra(cls, mixer) -> dict:
        return {}

    @classmethod
    def _own_field_problem(cls, spec) -> str | None:
        k = cls.kind
        if spec.inner_size is not None or spec.dt_rank is not None or spec.bc_norms:
            return f"inner_size, dt_rank and bc_norms are mamba1 fields, not {k}'s"
        if spec.num_heads is None or spec.head_dim is None:
            return f"a {k} mixer needs num_heads and head_dim"
        for field, why in _OWNED.items():
            if field not in cls.own_fields and getattr(spec, field) is not None:
                return why.format(k=k)
        return cls._shape_problem(spec)

    # Of the kind-owned MixerSpec fields (state_size, gate_low_rank, num_value_heads), those this kind takes.
    own_fields: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def _shape_problem(cls, spec) -> str | None:
        return None

    @property
    def dk(self) -> int:
        return self.head_dim

    @property
    def dv(self) -> int:
        return self.value_head_dim or self.head_dim

    def core_gemm_k(self) -> int:
        return max(self.dk, 1)

    def rules(self) -> tuple[Rule, ...]:
        """Split by heads over TP, and over tp·cp ranks by the all-to-all context parallel."""
        return (Rule("tp", "num_heads", self.heads), Rule("tp·cp", "num_heads", self.heads, note=_HEADS_NOTE))


@dataclass(frozen=True)
class LowRankGated:
    """The gate of GLA and KDA, projected h -> r -> H·d through a rank-r bottleneck (``MixerSpec.gate_low_rank``; 0:
    a full-rank h x H·d projection). Mixed in before the kind's base class, it owns that field."""

    own_fields: ClassVar[tuple[str, ...]] = ("gate_low_rank",)

    gate_low_rank: int = 0

    @classmethod
    def _extra(cls, mixer) -> dict:
        return {"gate_low_rank": mixer.gate_low_rank or 0}
