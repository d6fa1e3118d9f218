"""Compute time: the math of one micro-batch on one GPU of a pipeline stage.

FLOPs per token come from :mod:`autopar.specs.model` (2 FLOPs per multiply-add; backward = 2x forward,
Narayanan et al. 2021, arXiv 2104.04473 sec. 5.1). A stage's GPUs (tp·cp of them per data-parallel rank, and
the same GPUs re-sliced as ep·etp for the experts) share the tokens of a micro-batch evenly, so per GPU:

    F_mb = (b·s) / (tp·cp) · [3·F_fwd(stage) + F_recompute(stage)]

where b is the micro-batch size, s the sequence length, F_fwd the forward FLOPs per token of the stage's
layers (+ LM head and MTP on the last stage) and F_recompute the forward FLOPs run again by the recompute
policy (full: the whole layer; selective: QK^T and AV; 'mlp'/'moe'/'shared_experts': those blocks).
Routed experts assume balanced routing (the published MoE runs force it). Time = F_mb / (peak · eff_gemm),
with the dense peak of the training precision (datasheet) and the achievable fraction ``efficiency.gemm``
(calibrated, see autopar validate).
"""

from __future__ import annotations

from autopar.cost.profile import ModelProfile
from autopar.cost.stage import Stage
from autopar.specs.layout import Layout
from autopar.specs.training import TrainingSpec


def forward_flops_per_token(prof: ModelProfile, st: Stage) -> float:
    f = st.sum(prof, "fwd_flops")
    if st.is_last:
        f += prof.head_fwd_flops + prof.mtp_fwd_flops
    return f


def recompute_flops_per_token(prof: ModelProfile, st: Stage, layout: Layout) -> float:
    policy = layout.recompute
    if policy == "none":
        return 0.0
    if policy == "full":
        return st.sum(prof, "fwd_flops")
    mods = layout.recompute_modules
    f = 0.0
    if "core_attn" in mods:
        f += st.sum(prof, "attn_core_flops")
    if "mlp" in mods:
        f += st.sum(prof, "mlp_flops") - st.sum(prof, "moe_mlp_flops")
    if "moe" in mods:
        f += st.sum(prof, "moe_mlp_flops")
    # layernorm, moe_act, mla_up_proj and shared_experts recomputation is memory-bound or small; counted as 0
    # FLOPs here (an approximation: MLA up-projections are ~5% of a DeepSeek-V3 layer's forward FLOPs).
    return f


def microbatch_time(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, flops_per_s: float,
                    hbm_bytes_per_s: float, elementwise_passes: float = 0.0,
                    imbalance: float = 1.0) -> tuple[float, float]:
    """(total, forward-only) seconds of one micro-batch's math on one GPU, by the roofline model
    (Williams, Waterman & Patterson 2009): each group of GEMMs takes max(FLOPs / achievable FLOP/s,
    weight bytes / achievable HBM bandwidth). A GEMM over T tokens with a K x N weight does 2·T·K·N FLOPs
    and reads 2·K·N bytes of bf16 weight, so below T ≈ peak/bandwidth tokens (≈ 300 on an H100) it is
    memory-bound. ``imbalance`` (busiest expert rank / mean, 1 for balanced routing) scales the routed
    experts' work. Two groups are timed separately: the routed experts (grouped GEMMs over the few tokens
    each local expert receives — why small-micro-batch MoE runs far below peak) and everything else.

    Weight traffic per micro-batch: forward reads W (w bytes/param), backward reads W again for the input
    gradient and writes the weight gradient (g bytes/param); full recomputation reads W once more."""
    tokens = L.micro_batch * tr.seq_len / (L.tp * L.cp)
    routed = st.sum(prof, "routed_flops") * tokens
    fwd_all = forward_flops_per_token(prof, st) * tokens + routed * (imbalance - 1)
    rc_all = recompute_flops_per_token(prof, st, L) * tokens
    fwd_routed = routed * imbalance
    rc_routed = fwd_routed if (L.recompute == "full" or "moe" in L.recompute_modules) else 0.0
    w_dense = st.sum(prof, "dense_params") / L.tp + (prof.head_params / L.tp if st.is_last else 0.0)
    w_expert = st.sum(prof, "expert_params") / (L.ep * L.etp)
    wb, gb = tr.weight_bytes, tr.grad_bytes
    passes = 2 * wb + gb + (wb if L.recompute == "full" else 0)

    def roof(flops: float, weight_bytes: float) -> float:
        return max(flops / flops_per_s, weight_bytes / hbm_bytes_per_s)

    f_other, f_routed = fwd_all - fwd_routed, fwd_routed
    # Non-GEMM kernels (norms, residuals, rotary, activation functions, casts) are HBM-bound: each layer moves
    # about `elementwise_passes` h-wide activation tensors per token (SP splits them over the TP group).
    sp_tokens = L.micro_batch * tr.seq_len / (L.cp * (L.tp if L.sp else 1))
    t_elem = st.n_layers * elementwise_passes * prof.hidden * tr.activation_bytes * sp_tokens / hbm_bytes_per_s
    total = roof(3 * f_other + rc_all - rc_routed, w_dense * passes) + roof(3 * f_routed + rc_routed, w_expert * passes)
    fwd = roof(f_other, w_dense * wb) + roof(f_routed, w_expert * wb)
    return total + t_elem, fwd + t_elem / 3
