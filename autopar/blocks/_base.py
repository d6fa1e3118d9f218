"""What every block answers, and the two small records it answers with (a GEMM, a divisibility rule).

A *block* is one sub-layer of a decoder layer, per token, from plain numbers: a token mixer (softmax attention,
MLA, linear attention, an SSM) or a channel mixer (a dense MLP, an MoE block). The base classes give every answer
a zero default, so a block file states only what its kind has. Nothing here imports the rest of autopar: the
specs build blocks from their fields (:mod:`autopar.blocks.catalogue`), the cost model sums their answers.

Conventions (Kaplan et al. 2020; Narayanan et al. 2021, arXiv 2104.04473 eq. 3): a matmul (m x k)·(k x n) costs
2·m·k·n FLOPs; every GEMM weight costs 2 FLOPs per token forward. Counts are elements (not bytes) per token
unless a name says otherwise; state is per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

# How tensor parallelism splits a linear layer (Megatron: column-parallel splits N, row-parallel splits K);
# routed experts are split by expert-tensor parallelism (ETP) instead of TP; "replicated": every TP rank
# computes it whole (the MoE router, MLA's down-projections).
SPLITS = ("col", "row", "replicated", "expert_col", "expert_row")


def norm_residual(h: int, bias: bool = False) -> dict[str, tuple[float, float]]:
    """A sub-block's pre-norm (fused into the linear after it, Transformer Engine LayerNormLinear: read h, write h;
    backward read x, dy, write dx) and its residual add (read 2h, write h each way): memory-bound elements per token,
    (forward, backward), as every token-mixer and channel sub-block counts them. ``bda`` (and ``bda_bias`` for a
    sub-block whose output projection has a bias) counts the h elements of the sub-block's output that enter
    Megatron-Core's bias-dropout-add, priced only for the kernels the recipe adds to that add (dropout, an
    unfused bias add: :data:`autopar.cost.compute.BDA_BYTES`, bytes per element)."""
    out = {"norm": (2.0 * h, 3.0 * h), "residual": (3.0 * h, 3.0 * h), "bda": (float(h), float(h))}
    if bias:
        out["bda_bias"] = (float(h), float(h))
    return out


@dataclass(frozen=True)
class Linear:
    """One linear layer: y[T, N] = x[T, K] · W[K, N] per token row; 2·K·N FLOPs per token forward. ``module``
    names the Megatron-Core recompute module that redoes it (``--recompute-modules``): ``core_attn``,
    ``mla_up_proj``, ``mlp``, ``moe``, ``shared_experts``; ``attn``, ``router`` and ``ssm_scan`` (a linear mixer's
    chunked scan, priced in BF16) belong to none.
    ``shares_input``: this GEMM reads the same input tensor as the GEMM listed just before it (a stack that runs
    separate projections: torchtitan's wk and wv after wq, w3 after w1), so a quantisation of that input is done
    once for both (:func:`autopar.cost.compute.torchao_cast_bytes`)."""

    k: int
    n: int
    split: str
    module: str
    shares_input: bool = False

    @property
    def params(self) -> int:
        return self.k * self.n


@dataclass(frozen=True)
class Rule:
    """One divisibility rule of a block, as data the layout check reads (``specs.layout.check_layout``).

    ``axis``: the degree ``size`` must split by: ``tp``, ``ep``, ``etp``, or (all-to-all context parallelism of
    linear mixers, Megatron-Core ``MambaContextParallel``) ``tp·cp`` or ``cp``. ``mutual``: ``size`` and the
    degree must divide one another (one may be the smaller: KV heads replicated over TP ranks). ``per_tp``: the
    rule is on ``size // tp`` (Mamba-2's groups per TP rank). ``field`` names the field in the message, ``note``
    ends it."""

    axis: str
    field: str
    size: int
    mutual: bool = False
    per_tp: bool = False
    note: str = ""

    def problem(self, tp: int, cp: int = 1, ep: int = 1, etp: int = 1) -> str | None:
        """The broken rule as one message with its numbers (None = it holds). Called for every mesh the search
        checks: the message is built only when the rule is broken."""
        axis = self.axis
        degree = (tp if axis == "tp" else tp * cp if axis == "tp·cp" else cp if axis == "cp"
                  else ep if axis == "ep" else etp)
        value = self.size // tp if self.per_tp else self.size
        if not (value % degree and degree % value if self.mutual else value % degree):
            return None
        where = f"tp·cp = {tp}·{cp}" if axis == "tp·cp" else f"{axis} ({degree})"
        field = f"{self.field}/tp" if self.per_tp else self.field
        if self.mutual:
            return f"{field} ({value}) and {where} must divide one another{self.note}"
        return f"{field} ({value}) not divisible by {where}{self.note}"


class Block:
    """One sub-layer, per token. Defaults are zeros: a block overrides what its kind has."""

    kind: ClassVar[str]
    title: ClassVar[str]                   # what it is, in words ("gated linear attention (GLA)")
    source: ClassVar[str]                  # where its formulas come from, in short (the file's docstring has more)
    keeps_kv: ClassVar[bool] = False       # softmax attention: a KV cache, K and V exchanged around the CP ring
    has_state: ClassVar[bool] = False      # linear attention / SSM: a fixed-size recurrent state instead
    routed: ClassVar[bool] = False         # MoE: tokens dispatched to experts
    tp_reduces: ClassVar[bool] = False     # channel mixers: the output is a TP partial sum (one all-reduce, or
    #                                        reduce-scatter with SP, per pass); token mixers always are

    # ---- parameters ----
    def params(self) -> int:
        """Weights sharded by TP (norm excluded): everything but routed experts."""
        return 0

    def gemm_params(self) -> int:
        """The part of :meth:`params` that is GEMM weights (2 FLOPs per weight per token)."""
        return 0

    def expert_params(self) -> int:
        """Routed-expert weights (sharded by EP·ETP)."""
        return 0

    def kv_params(self) -> float:
        """K and V projection weights (replicated when KV heads < tp)."""
        return 0.0

    # ---- FLOPs (forward, per token) ----
    def attention_core_flops(self, seq_len: int) -> float:
        """Softmax attention's QK^T and AV."""
        return 0.0

    def scan_flops(self) -> float:
        """A linear mixer's chunked scan and short convolution (not its projections)."""
        return 0.0

    def forward_flops(self) -> float:
        """A channel mixer's forward FLOPs (token mixers: 2·gemm_params plus their core, summed by the layer)."""
        return 0.0

    def routed_flops(self) -> float:
        """The routed experts' part of :meth:`forward_flops` (grouped GEMMs)."""
        return 0.0

    # ---- kernels ----
    def gemms(self) -> tuple[Linear, ...]:
        """The GEMMs as Megatron-Core launches them (fused projections: one QKV GEMM, one gate-up GEMM)."""
        return ()

    def separate_gemms(self) -> tuple[Linear, ...]:
        """The GEMMs as a stack with one ``nn.Linear`` per projection launches them (``TrainingSpec.projections``
        ``separate``): the same FLOPs and weights as :meth:`gemms`, in smaller GEMMs. A block whose projections no
        stack splits apart answers :meth:`gemms`."""
        return self.gemms()

    def launched_gemms(self, projections: str = "fused") -> tuple[Linear, ...]:
        """The GEMMs a stack launches for this block: :meth:`gemms` (``fused``) or :meth:`separate_gemms`."""
        return self.separate_gemms() if projections == "separate" else self.gemms()

    def membound(self) -> dict[str, tuple[float, float]]:
        """Memory-bound elements per token, (forward, backward), by entry of ``cost.shapes.TP_SPLIT``."""
        return {}

    def fp8_cast_width(self) -> int:
        """Sum of the input and output widths of the block's non-expert GEMMs (FP8 cast-transpose)."""
        return 0

    def fp8_cast_width_expert(self) -> int:
        """The same for one routed copy through the expert GEMMs."""
        return 0

    # ---- memory ----
    def stored(self) -> dict[str, float]:
        """Activations kept for the backward pass, elements per token by role (``qkv``, ``attn_out``, ``mla_up``,
        ``mlp``, ``shared``, ``moe_io``, ``moe_latent``, ``moe_inner``, ``moe_act``)."""
        return {}

    def state_elems(self) -> int:
        """Recurrent state of one sequence (what a CP rank hands to the next)."""
        return 0

    def a2a_elems(self) -> int:
        """Per token, what all-to-all context parallelism swaps between a sequence and a head split."""
        return 0

    # ---- layout ----
    def rules(self) -> tuple[Rule, ...]:
        """TP, CP (all-to-all) and EP/ETP divisibility rules."""
        return ()
