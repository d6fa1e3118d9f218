"""Tensor-parallel (and sequence-parallel) communication of one micro-batch on one stage.

Megatron-LM tensor parallelism (Shoeybi et al. 2019, arXiv 1909.08053 sec. 3; Narayanan et al. 2021 sec.
3.2): each transformer layer does 2 all-reduces of the activations in the forward pass (after attention and
after the MLP) and 2 in the backward pass. With sequence parallelism each all-reduce becomes an all-gather
plus a reduce-scatter of the same total volume (Korthikanti et al. 2022 sec. 4.2.2), so the time is the same.
MoE layers keep the attention's 2 but replace the MLP's with expert all-to-alls (autopar.cost.ep) — Megatron
requires SP for MoE with TP, so routed tokens are already split across the TP group — except for their shared
experts, a TP-split MLP (Megatron-Core ``SharedExpertMLP``) that gathers and reduce-scatters like a dense one. Full recomputation
repeats the forward collectives (+1 per block). The last stage adds 1 for the LM head's gathered input.
Hybrid layers count the blocks they have (``LayerSums.tp_blocks``): a Mamba-only or MLP-only layer of
Nemotron-H reduces once per pass, not twice.

    T_tp = n_ar · AR(b·(s/cp)·h·e bytes, tp ranks, stride 1),   n_ar = (2 or 3) · Σ_layers tp_blocks (+1 last).

Overlap (``training.tp_comm_overlap``; Megatron --tp-comm-overlap, Transformer Engine userbuffers: Wang et al.
2022, "Overlap communication with dependent computation via decomposition", ASPLOS'23, sec. 3; NVIDIA
TransformerEngine ``te.pytorch.module`` ``ub_overlap_ag``/``ub_overlap_rs``): each all-gather and reduce-scatter
is split into tp chunks pipelined with the chunks of the GEMM it feeds or follows. One chunk of each collective
cannot overlap (the first all-gather chunk before the GEMM can start, the last reduce-scatter chunk after it
ends); the rest hides behind the layer's TP-split GEMMs G (:func:`autopar.cost.compute.hiding_windows`):

    exposed = T_tp / tp + max(0, T_tp · (tp − 1)/tp − G)        (overlap on; T_tp otherwise)

An approximation: summed over the stage's layers (equal where the layers are alike), and the GEMMs' slowdown
from sharing the SMs and HBM with the communication kernels is not counted.

FP8 tensorwise with torchao (``fp8_recipe: tensorwise``): torchtitan's Float8ColwiseParallel / Float8RowwiseParallel
cast before the sequence-parallel all-gathers, so each all-gather moves 1-byte elements and each reduce-scatter
stays in BF16: 3/4 of the BF16 volume ("float8 all-gather with TP is only supported for tensorwise float8 scaling
recipes. For rowwise recipes, we use regular TP and all-gather happens in high precision": pytorch/torchtitan
torchtitan/models/llama3/infra/parallelize.py, ``enable_float8_tensorwise_tp``).

torchao tensorwise scaling under DTensor TP also reduces each cast's amax over the TP group ("For TP ... The overhead is
communicating max(abs) across ranks. For sharded weights, we communicate max(abs) as well": pytorch/torchtitan
docs/float8.md): one 4-byte all-reduce per cast of a TP-sharded operand, latency-bound and waited on before the cast,
so not hidden by async TP (:func:`fp8_amax_seconds`).
"""

from __future__ import annotations

from autopar.cost.collectives import Network
from autopar.cost.layer_sums import ModelProfile
from autopar.cost.stage import Stage
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import Layout
from autopar.specs.training import TrainingSpec


FP8_TENSORWISE_TP_VOLUME = 0.75   # all-gather in FP8 (1/2), reduce-scatter in BF16 (1): (0.5 + 1) / 2


def tp_comm_seconds(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, net: Network,
                    per_block: int | None = None) -> float:
    """T_tp: every TP collective of one micro-batch on stage ``st``, none hidden. ``per_block`` overrides the
    collectives per block (2: forward and backward, whatever the recompute policy)."""
    if L.tp == 1:
        return 0.0
    if per_block is None:
        per_block = 3 if L.recompute == "full" else 2
    n_ar = per_block * st.sum(prof, "tp_blocks") + (1 if st.is_last else 0)
    nbytes = L.micro_batch * (tr.seq_len / L.cp) * prof.hidden * tr.activation_bytes
    if tr.precision == "fp8" and tr.fp8_recipe == "tensorwise":
        nbytes *= FP8_TENSORWISE_TP_VOLUME
    return n_ar * net.time("all_reduce", nbytes, L.tp, 1)


# torchao tensorwise amax all-reduces per TP-split linear and micro-batch: forward, the input's and the weight's cast;
# backward, the output gradient's (the backward weight cast reuses the forward amax: pytorch/ao
# torchao/testing/training/roofline_utils.py, tensorwise weight, kernel 4). Recomputation re-runs the forward two.
# A fused QKV or gate-up GEMM counts once (torchtitan's separate wq, wk, wv and w1, w3 weights cast apart: an
# undercount of 3 weight amaxes per Llama layer).
FP8_AMAX_PER_LINEAR, FP8_AMAX_RECOMPUTE, FP8_AMAX_BYTES = 3, 2, 4.0
# Share of T_tp that async TP leaves unfused under torchao rowwise scaling: the all-gathers, half of each all-reduce's
# all-gather + reduce-scatter pair (Korthikanti et al. 2022 sec. 4.2.2) (tp_time_per_microbatch).
ROWWISE_UNFUSED_SHARE = 0.5


def fp8_amax_seconds(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, net: Network) -> float:
    """Seconds of one micro-batch's torchao tensorwise amax all-reduces over the TP group (module docstring):
    n_lin · (3 + 2 if recomputing) latency-bound all-reduces of one fp32 scalar, n_lin the stage's TP-split linears."""
    if L.tp == 1 or tr.precision != "fp8" or tr.fp8_recipe != "tensorwise":
        return 0.0
    n_lin = sum(count * sum(lin.split in ("col", "row") for lin in prof.kinds[j].linears)
                for j, count in prof.kind_counts(st.first, st.last))
    per = FP8_AMAX_PER_LINEAR + (FP8_AMAX_RECOMPUTE if L.recompute != "none" else 0)
    return n_lin * per * net.time("all_reduce", FP8_AMAX_BYTES, L.tp, 1)


def tp_time_per_microbatch(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, hw: HardwareSpec,
                           net: Network, gemm_window: float = 0.0) -> float:
    """Exposed TP seconds of one micro-batch; ``gemm_window``: the stage's TP-split GEMM seconds (G above)."""
    t = tp_comm_seconds(prof, st, L, tr, net)
    amax = fp8_amax_seconds(prof, st, L, tr, net)
    if not t or not tr.tp_comm_overlap:
        return t + amax
    exposed = 0.0
    if tr.precision == "fp8" and tr.fp8_recipe == "rowwise":
        # torch's async-TP pass fuses matmul -> reduce-scatter under rowwise scales but not all-gather -> matmul (the
        # rowwise quantisation sits between them): the all-gather half of the volume stays exposed (pytorch/pytorch
        # issue #149990, 2025-03-25, open; torchtitan's 2025-06 tables: async TP gains +4..6% under rowwise against
        # +9..10% under bf16)
        exposed, t = t * ROWWISE_UNFUSED_SHARE, t * (1.0 - ROWWISE_UNFUSED_SHARE)
    return exposed + t / L.tp + max(0.0, t * (L.tp - 1) / L.tp - gemm_window) + amax
