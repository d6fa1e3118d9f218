"""The mixture-of-experts block: a router, routed experts (each an MLP of width f_e) and always-active shared experts.

Parameters: router h·E; shared experts n_s MLPs of width f_s; routed experts E MLPs of width f_e (their own bias
flag: GPT-OSS), sharded by EP·ETP, everything else by TP. Forward FLOPs per token: 2·(router + shared + k
routed experts' weights). GEMMs: the router replicated on every TP rank; shared experts column/row-parallel
(Megatron-Core ``SharedExpertMLP``, recompute module ``shared_experts``); routed experts expert-column/row by ETP
(module ``moe``), gate and up fused in one grouped GEMM (Megatron-Core ``TEGroupedMLP`` linear_fc1) or, in a stack
with separate projections, two (torchtitan). Memory-bound (elements per token, forward and backward): norm and residual as the MLP's; the
experts' activation k·(3f_e, 5f_e) gated or k·(2f_e, 3f_e) plain (module ``moe_act``) and the shared experts' the
same over n_s·f_s; token permutation (Megatron ``permute``/``unpermute``): each routed copy written once and read
once by the weighted sum, each way -> 2·k·h forward, 2·k·h backward; with expert biases (GPT-OSS), Megatron's
eager output-bias add (``expert_bias``, :data:`EXPERT_BIAS_ELEMS`), 14·k·h forward, 18·k·h backward; with a clamped
activation (GPT-OSS), its eager clamps (``moe_act_clamp``, :data:`CLAMP_ELEMS`), 8·k·f_e forward, 15·k·f_e
backward. Stored:
shared internals n_s·f_s·(n_in+1), the k routed copies entering fc1 (k·h; the expert outputs are not kept: the
routing probabilities are applied in the expert activation, :meth:`MoE.stored`), the routed internals
k·f_e·(n_in+1), the activation outputs k·f_e (gated only; dropped by ``moe_act`` recompute). The expert all-to-all
carries k copies
of each token's h.

LatentMoE (NVIDIA Nemotron 3 Super and Ultra; Megatron-Core ``MoELayer`` with ``moe_latent_size``,
Megatron-LM@d98e8a64ddf3 megatron/core/transformer/moe/moe_layer.py:265-303 and 488-490): the router and the shared
experts see the full hidden state h, but the routed tokens are first projected down to a latent width l
(``fc1_latent_proj``, h·l) and the combined expert output back up (``fc2_latent_proj``, l·h); both projections are
``parallel_mode="duplicated"`` (every TP rank holds them whole, like the router). So the routed experts are MLPs of
l -> f_e -> l, the all-to-all and the permutation carry k copies of l instead of h, and the stored routed copies are
l wide, plus the latent input and output (2·l) of the projections (``moe_latent``).

Symbols: h hidden, E routed experts, k top-k, f_e routed expert FFN width, n_s shared experts of width f_s,
l latent width (l = h without LatentMoE).
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.blocks._base import Block, Linear, Rule, norm_residual
from autopar.blocks.mlp import MLP, input_gemms


# The routed experts' output bias in Megatron-Core's unfused expert path (TEGroupedMLP without the Transformer Engine
# op fuser): linear_fc2 is built with skip_bias_add=True and its bias added afterwards, in eager PyTorch, scaled by
# each token's routing probability (NVIDIA/Megatron-LM@3f6a2ed8 megatron/core/transformer/moe/experts.py
# TEGroupedMLP._apply_bias, lines 296-313, called at 788: ``torch.cat([t + b * p for t, b, p in zip(split(out),
# biases, split(probs))]).to(out.dtype)``; the 2026-06 code the 26.06 container ran; a packed repeat_interleave form
# replaced the loop on 2026-08-14, 883533e0, with the same fp32 arithmetic). Elements of one routed copy's width r,
# in 2-byte units (bf16 = 1, fp32 = 2), one HBM pass per PyTorch kernel. The probabilities are fp32 (the flex
# dispatcher's HybridEP and DeepEP managers cast them, same commit token_dispatcher.py lines 1079-1084 and 1237-1242;
# the trailing ``.to(dtype)`` casts the promoted result back; the packed form calls ``.float()`` on both), so:
#  forward: b·p writes fp32 (2), t + b·p reads 1 + 2 and writes 2 (5), torch.cat reads and writes fp32 (4), .to(bf16)
#    reads 2 and writes 1 (3) -> 14;
#  backward (autograd): the cast back to fp32 (1 + 2 = 3), t's gradient cast to bf16 (2 + 1 = 3), b's gradient
#    g·p then a sum over tokens (2 + 2, then 2 = 6), p's gradient g·b then a sum over the width (6) -> 18
#    (torch.cat's backward is views; the per-expert bias and per-token probability reads are negligible).
# The fused paths (the op fuser's GroupedLinear with bias, TrainingSpec.fused_grouped_mlp) add the bias inside the
# grouped kernels: priced 0 there (autopar.cost.compute.layer_parts). Per-expert kernel launches (E_loc small kernels
# each way) are not priced apart (the host rate of autopar.cost.compute.moe_host_time covers the expert segment).
EXPERT_BIAS_ELEMS = (14.0, 18.0)

# The clamped gated activation of GPT-OSS's experts (ModelSpec moe.activation_clamp; openai/gpt-oss
# gpt_oss/torch/model.py swiglu: x_glu.clamp(max=limit), x_linear.clamp(-limit, limit), limit 7.0) in Megatron-Core's
# unfused expert path (TEGroupedMLP with bias_activation_fusion, which the GPT-OSS bridge sets:
# NVIDIA-NeMo/Megatron-Bridge@v0.4.1 src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py, activation_func quick_gelu,
# activation_func_clamp_value 7.0, bias_activation_fusion True). The fused function (torch.compile'd
# weighted_quick_geglu) does not clamp: weighted_bias_quick_geglu_impl clamps first, in eager PyTorch, and concatenates
# the halves again (NVIDIA/Megatron-LM@3f6a2ed8 megatron/core/fusions/fused_bias_geglu.py lines 424-431: ``torch.cat(
# (x_glu.clamp(min=None, max=clamp_value), x_linear.clamp(min=-clamp_value, max=clamp_value)), -1)``; added with
# gpt-oss support, 2e29a5e1 (2025-09-09), unchanged at d98e8a64 (2026-08)). Elements per unit of expert width f_e,
# in 2-byte units (bf16 1, bool 0.5), one HBM pass per PyTorch kernel, beyond the fused activation's (3, 5):
#  forward: two clamps each read f and write f (4), torch.cat reads 2f and writes 2f (4) -> 8;
#  backward (autograd, PyTorch derivatives.yaml clamp -> clamp_backward): the cat's backward is views; the one-sided
#    clamp is where(x <= max, g, 0): the compare reads f and writes a bool mask (1.5), where reads the mask and g and
#    writes f (2.5) = 4; the two-sided clamp adds a second compare and the mask's logical_and (1.5 + 1.5) = 7;
#    torch.chunk's backward concatenates the two halves' gradients, reading and writing 2f (4) -> 15.
# An approximation: the strided half-width views are priced as contiguous passes. The op fuser's grouped MLP
# (TrainingSpec.fused_grouped_mlp: Transformer Engine's ScaledClampedQGeGLU) clamps inside its kernels: priced 0 there
# (autopar.cost.compute.layer_parts), as is the output bias above.
CLAMP_ELEMS = (8.0, 15.0)
# Stored by the eager clamps, per element of f_e and routed copy: autograd's clamp saves its input for the mask
# (PyTorch derivatives.yaml ``clamp``: ``clamp_backward(grad, self, min, max)``), i.e. both halves of the fc1 output
# (2 f_e), while the compiled weighted_quick_geglu saves its own input, the concatenated clamped copy (2 f_e), where
# without the clamps it saves the fc1 output itself: one copy more, 2 f_e (gated). Counted by the memory model where
# the clamps run eagerly (not under the fused grouped MLP or compiled elementwise: autopar.cost.memory) and the
# activation is not recomputed (moe_act keeps only the checkpoint's input, the fc1 output).
CLAMP_STORED = 2.0


@dataclass(frozen=True)
class MoE(Block):
    kind = "moe"
    title = "mixture of experts (router, routed and shared experts; LatentMoE)"
    source = "Megatron-Core MoELayer, SharedExpertMLP"
    routed = True

    hidden: int
    num_experts: int
    top_k: int
    expert_ffn: int
    num_shared: int = 0
    shared_ffn: int = 0
    gated: bool = True
    expert_bias: bool = False
    linear_bias: bool = False
    latent: int = 0                     # LatentMoE width l (0: the experts run at h)
    clamped: bool = False               # the experts' gated activation clamps its inputs (CLAMP_ELEMS)

    @classmethod
    def from_spec(cls, model) -> "MoE":
        m = model.moe
        return cls(hidden=model.hidden_size, num_experts=m.num_experts, top_k=m.top_k,
                   expert_ffn=m.expert_ffn_hidden_size, num_shared=m.num_shared_experts, shared_ffn=m.shared_ffn,
                   gated=model.gated_mlp, expert_bias=m.expert_bias, linear_bias=model.linear_bias,
                   latent=m.latent_size or 0, clamped=m.activation_clamp is not None)

    @property
    def routed_width(self) -> int:
        """Width of a routed token: the latent l under LatentMoE, else h."""
        return self.latent or self.hidden

    def latent_params(self) -> int:
        """fc1_latent_proj (h·l) and fc2_latent_proj (l·h); 0 without LatentMoE."""
        return 2 * self.hidden * self.latent

    @property
    def expert(self) -> MLP:
        """One routed expert (on the latent width under LatentMoE)."""
        return MLP(self.routed_width, self.expert_ffn, self.gated, self.expert_bias or self.linear_bias)

    @property
    def shared(self) -> MLP:
        """One shared expert."""
        return MLP(self.hidden, self.shared_ffn, self.gated, self.linear_bias)

    def one_expert_params(self) -> int:
        return self.expert.params()

    def params(self) -> int:
        """Router (h·E), shared experts and the latent projections: the part outside the routed experts (counted
        with what TP shards, as the router is, although the router and the latent projections are replicated)."""
        return self.hidden * self.num_experts + self.num_shared * self.shared.params() + self.latent_params()

    def gemm_params(self) -> int:
        return self.params()

    def expert_params(self) -> int:
        return self.num_experts * self.one_expert_params()

    def forward_flops(self) -> float:
        """Router (2·h·E) + shared + k routed experts."""
        return 2.0 * (self.params() + self.top_k * self.one_expert_params())

    def routed_flops(self) -> float:
        """The k routed experts (grouped GEMMs)."""
        return 2.0 * self.top_k * self.one_expert_params()

    @property
    def tp_reduces(self) -> bool:
        """Shared experts are a TP-split MLP; the routed tokens travel by the expert all-to-all instead."""
        return self.num_shared > 0

    def _gemms(self, separate: bool) -> tuple[Linear, ...]:
        h, n_in, r = self.hidden, self.expert.n_in, self.routed_width
        lin = [Linear(h, self.num_experts, "replicated", "router")]
        if self.num_shared:
            fs = self.num_shared * self.shared_ffn
            lin += [*input_gemms(h, fs, n_in, "col", "shared_experts", separate),
                    Linear(fs, h, "row", "shared_experts")]
        if self.latent:
            lin += [Linear(h, self.latent, "replicated", "moe"), Linear(self.latent, h, "replicated", "moe")]
        fe = self.expert_ffn
        return tuple(lin + [*input_gemms(r, fe, n_in, "expert_col", "moe", separate),
                            Linear(fe, r, "expert_row", "moe")])

    def gemms(self) -> tuple[Linear, ...]:
        return self._gemms(separate=False)

    def separate_gemms(self) -> tuple[Linear, ...]:
        """Gated experts with gate and up as two GEMMs on one input (pytorch/torchtitan@0adca686
        torchtitan/models/moe.py: the shared experts are a FeedForward of w1, w2, w3 nn.Linear; the routed experts
        run silu(grouped_mm(x, w1)) * grouped_mm(x, w3), then grouped_mm(h, w2))."""
        return self._gemms(separate=True)

    def membound(self) -> dict[str, tuple[float, float]]:
        h, k, fe, r = self.hidden, self.top_k, self.expert_ffn, self.routed_width
        act = self.expert.act_elems()
        out = norm_residual(h)
        if self.num_shared:
            fs = self.num_shared * self.shared_ffn
            out["shared_act"] = (act[0] * fs, act[1] * fs)
        out["moe_act"] = (k * act[0] * fe, k * act[1] * fe)
        if self.clamped and self.gated:
            fwd, bwd = CLAMP_ELEMS
            out["moe_act_clamp"] = (k * fwd * fe, k * bwd * fe)
        out["permute"] = (2.0 * k * r, 2.0 * k * r)
        if self.expert_bias or self.linear_bias:
            fwd, bwd = EXPERT_BIAS_ELEMS
            out["expert_bias"] = (fwd * k * r, bwd * k * r)
        return out

    def fp8_cast_width(self) -> int:
        h, fs, lat = self.hidden, self.num_shared * self.shared_ffn, self.latent
        shared = h + self.expert.n_in * fs + fs + h if self.num_shared else 0
        return shared + (2 * (h + lat) if lat else 0)

    def fp8_cast_width_expert(self) -> int:
        """The same for one routed copy through the expert GEMMs."""
        return self.expert.fp8_cast_width()

    def stored(self) -> dict[str, float]:
        """Saved for the backward, per token (module docstring): the k routed copies entering the experts' fc1
        (``moe_io``), not their outputs: Megatron-Core applies the routing probabilities inside the expert
        activation (NVIDIA/Megatron-LM@d98e8a64 megatron/core/transformer/moe/experts.py ``TEGroupedMLP.forward``
        ``bias_act_func``: ``weighted_bias_swiglu_impl`` / ``weighted_bias_quick_geglu_impl(intermediate,
        bias, permuted_probs, ...)``, the TE op fuser's grouped MLP likewise takes ``permuted_probs``), so the
        combine and the unpermutation take no probabilities and keep nothing of the fc2 output for their
        backward; the latent projections' tensors (``moe_latent``); with clamped experts the eager clamps' saved fc1
        output (``moe_act_clamp``, :data:`CLAMP_STORED`)."""
        k, fe, gated, r = self.top_k, self.expert_ffn, self.expert.n_in + 1, self.routed_width
        out = {"shared": self.num_shared * self.shared_ffn * gated, "moe_io": 1.0 * k * r,
               "moe_latent": 2.0 * self.latent, "moe_inner": k * fe * gated, "moe_act": k * fe if self.gated else 0.0}
        if self.clamped and self.gated:     # the eager clamps' saved fc1 output (CLAMP_STORED)
            out["moe_act_clamp"] = k * fe * CLAMP_STORED
        return out

    def dispatch_elems(self) -> int:
        """Per token, what the expert all-to-all carries each way: k copies of h (of l under LatentMoE)."""
        return self.top_k * self.routed_width

    def rules(self) -> tuple[Rule, ...]:
        shared = (Rule("tp", "shared expert FFN", self.shared_ffn),) if self.num_shared else ()
        return shared + (Rule("ep", "num_experts", self.num_experts),
                         Rule("etp", "expert_ffn_hidden_size", self.expert_ffn))
