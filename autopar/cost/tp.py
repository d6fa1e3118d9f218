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

    T_tp = n_ar · AR(b·(s/cp)·h·e bytes, tp ranks, stride 1),   n_ar = (2 or 3) · Σ_layers tp_blocks (+1 last),
    exposed fraction 1 − tp_overlap when the framework overlaps TP communication (training.tp_comm_overlap),
    all of it otherwise.

FP8 tensorwise with torchao (``fp8_recipe: tensorwise``): torchtitan's Float8ColwiseParallel / Float8RowwiseParallel
cast before the sequence-parallel all-gathers, so each all-gather moves 1-byte elements and each reduce-scatter
stays in BF16: 3/4 of the BF16 volume ("float8 all-gather with TP is only supported for tensorwise float8 scaling
recipes. For rowwise recipes, we use regular TP and all-gather happens in high precision": pytorch/torchtitan
torchtitan/models/llama3/infra/parallelize.py, ``enable_float8_tensorwise_tp``).
"""

from __future__ import annotations

from autopar.cost.collectives import Network
from autopar.cost.layer_sums import ModelProfile
from autopar.cost.stage import Stage
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import Layout
from autopar.specs.training import TrainingSpec


FP8_TENSORWISE_TP_VOLUME = 0.75   # all-gather in FP8 (1/2), reduce-scatter in BF16 (1): (0.5 + 1) / 2


def tp_time_per_microbatch(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, hw: HardwareSpec,
                           net: Network) -> float:
    if L.tp == 1:
        return 0.0
    per_block = 3 if L.recompute == "full" else 2
    n_ar = per_block * st.sum(prof, "tp_blocks") + (1 if st.is_last else 0)
    nbytes = L.micro_batch * (tr.seq_len / L.cp) * prof.hidden * tr.activation_bytes
    if tr.precision == "fp8" and tr.fp8_recipe == "tensorwise":
        nbytes *= FP8_TENSORWISE_TP_VOLUME
    exposed = 1.0 - hw.efficiency.tp_overlap if tr.tp_comm_overlap else 1.0
    return exposed * n_ar * net.time("all_reduce", nbytes, L.tp, 1)
