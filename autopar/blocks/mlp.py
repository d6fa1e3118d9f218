"""The dense MLP: gated (SwiGLU/GeGLU, 3 matrices; Shazeer 2020, arXiv 2002.05202) or plain (2 matrices, GELU).

Parameters: gated 3·h·f (gate, up, down), plain 2·h·f; with biases + n_in·f + h (n_in = 2 gated, 1 plain).
GEMMs: h -> n_in·f column-parallel (Megatron-Core ``linear_fc1`` with ``gated_linear_unit``: gate and up in one
GEMM), f -> h row-parallel, recompute module ``mlp``; a stack with separate projections (``TrainingSpec.projections``;
torchtitan's ``w1``, ``w3``, ``w2``) launches gate and up as two h -> f GEMMs. Memory-bound kernels (elements
per token, forward and backward, one HBM pass each): the sub-block's norm 2h / 3h and residual add 3h / 3h (see
:mod:`autopar.blocks.attention`); the activation of a gated MLP (Megatron's fused bias-swiglu) reads 2f, writes f
forward, reads 2f and df, writes 2f backward -> (3f, 5f); plain GELU (2f, 3f). Stored: the MLP's internals,
n_in·f + f (gated 3f, plain 2f).

Unfused activation (a recipe's ``bias_activation_fusion: false``, or an eager stack): the activation runs as the
PyTorch ops the model's code calls, one HBM pass each; :meth:`MLP.act_unfused_elems` counts what that adds to the
fused kernel, per unit of FFN width (:data:`ACT_UNFUSED_EXTRA`), priced by :func:`autopar.cost.compute.layer_parts`
only where the training spec says the activation is unfused.

Symbols: h hidden, f FFN width.
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.blocks._base import Block, Linear, Rule, norm_residual


# Elements per unit of FFN width the unfused activation moves beyond the fused kernel, (forward, backward), op by op
# (one kernel per op, each reading its inputs and writing its output once):
#  - swiglu / geglu: Megatron-Core MLP.forward without bias_activation_fusion, glu(x) = act(x[0]) * x[1]
#    (NVIDIA/Megatron-LM@core_r0.8.0 (baf94af3) megatron/core/transformer/mlp.py; torch.chunk is a view):
#    act read f write f, mul read 2f write f = 5 against the fused 3; backward mul reads dy, a, b and writes da, db
#    (5), the activation's backward reads x, da and writes dx (3) = 8 against 5 -> (2, 3);
#  - gelu: F.gelu is one kernel (read f, write f) and gelu_backward one (read x, dy, write dx): as fused -> (0, 0);
#  - relu: F.relu and threshold_backward likewise one kernel each -> (0, 0);
#  - squared_relu: torch.pow(F.relu(x), 2) (NVIDIA/NeMo@r2.0.0rc1 (579983fb) nemo/collections/nlp/modules/common/
#    megatron/utils.py squared_relu, NeMo 24.07's function, not compiled): relu 2 + pow 2 = 4 against 2; backward
#    pow_backward(grad, self, 2) = grad * (2 * self.pow(1)) (PyTorch tools/autograd/FunctionsManual.cpp: pow(1) a
#    copy, read f write f; the scalar multiply read f write f; grad * that read 2f write f = 7), then relu's
#    threshold_backward reads dy and its output and writes dx (3) = 10 against 3 -> (2, 7). Megatron-LM's own
#    --squared-relu (megatron/training/activations.py @ core_r0.8.0) wraps the same expression in jit_fuser =
#    torch.compile: one fused kernel, what the switch on prices; NeMo 24.07 runs its uncompiled copy above.
# With linear biases the unfused path adds the fc1 bias in its own kernel first (``intermediate + bias``, the same
# Megatron-Core mlp.py): read and write the n_in·f wide output, 2·n_in forward; its gradient is the same reduction
# as under the fused kernel (autograd's sum over tokens either way), so nothing backward.
ACT_UNFUSED_EXTRA = {"swiglu": (2.0, 3.0), "geglu": (2.0, 3.0), "gelu": (0.0, 0.0), "relu": (0.0, 0.0),
                     "squared_relu": (2.0, 7.0)}


def activation_of(activation: str | None, gated: bool) -> str:
    """An MLP's activation: the stated one, else SwiGLU for a gated MLP and GELU for a plain one."""
    return activation or ("swiglu" if gated else "gelu")


def input_gemms(k: int, f: int, n_in: int, split: str, module: str, separate: bool) -> list[Linear]:
    """The input GEMMs of an MLP of width ``f`` on a ``k``-wide input with ``n_in`` input matrices (gate and up, or up
    alone): one k -> n_in·f GEMM (fused), or with ``separate`` one k -> f GEMM each, the later ones sharing the first's
    input (:attr:`Linear.shares_input`)."""
    if not separate:
        return [Linear(k, n_in * f, split, module)]
    return [Linear(k, f, split, module, shares_input=j > 0) for j in range(n_in)]


@dataclass(frozen=True)
class MLP(Block):
    kind = "dense"
    title = "dense MLP (gated or plain)"
    source = "SwiGLU arXiv 2002.05202; Megatron-Core MLP"

    hidden: int
    ffn: int
    gated: bool = True
    bias: bool = False
    activation: str | None = None   # ModelSpec.activation; None = swiglu (gated) or gelu (plain)

    @classmethod
    def from_spec(cls, model) -> "MLP":
        return cls(hidden=model.hidden_size, ffn=model.ffn_hidden_size, gated=model.gated_mlp,
                   bias=model.linear_bias, activation=model.mlp_activation)

    @property
    def n_in(self) -> int:
        """Input matrices: gate and up (gated), or up alone."""
        return 2 if self.gated else 1

    def params(self) -> int:
        h, f = self.hidden, self.ffn
        p = (self.n_in + 1) * h * f
        if self.bias:
            p += self.n_in * f + h
        return p

    def gemm_params(self) -> int:
        return self.params()

    def forward_flops(self) -> float:
        return 2.0 * self.params()

    tp_reduces = True     # its output is a TP partial sum

    def act_elems(self) -> tuple[float, float]:
        """Activation function's memory-bound elements per unit of FFN width, (forward, backward)."""
        return (3.0, 5.0) if self.gated else (2.0, 3.0)

    def act_unfused_elems(self) -> tuple[float, float]:
        """What the activation adds per unit of FFN width when it runs unfused (:data:`ACT_UNFUSED_EXTRA`, plus the
        separate bias add of a biased MLP), (forward, backward)."""
        fwd, bwd = ACT_UNFUSED_EXTRA[activation_of(self.activation, self.gated)]
        return (fwd + (2.0 * self.n_in if self.bias else 0.0), bwd)

    def gemms(self) -> tuple[Linear, ...]:
        h, f = self.hidden, self.ffn
        return (*input_gemms(h, f, self.n_in, "col", "mlp", separate=False), Linear(f, h, "row", "mlp"))

    def separate_gemms(self) -> tuple[Linear, ...]:
        """Gate and up as two GEMMs on one input (torchtitan@9dec370 torchtitan/models/llama/model.py FeedForward:
        w2(silu(w1 x) * w3 x), each an ``nn.Linear``), then down; a plain MLP has one input GEMM either way."""
        h, f = self.hidden, self.ffn
        return (*input_gemms(h, f, self.n_in, "col", "mlp", separate=True), Linear(f, h, "row", "mlp"))

    def membound(self) -> dict[str, tuple[float, float]]:
        h, f = self.hidden, self.ffn
        fwd, bwd = self.act_elems()
        ufwd, ubwd = self.act_unfused_elems()
        return {**norm_residual(h, self.bias), "mlp_act": (fwd * f, bwd * f), "mlp_act_unfused": (ufwd * f, ubwd * f)}

    def fp8_cast_width(self) -> int:
        h, f = self.hidden, self.ffn
        return h + self.n_in * f + f + h

    def stored(self) -> dict[str, float]:
        return {"mlp": self.ffn * (self.n_in + 1)}

    def rules(self) -> tuple[Rule, ...]:
        return (Rule("tp", "ffn_hidden_size", self.ffn),)
