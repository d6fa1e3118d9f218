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

Overlap off (``training.tp_comm_overlap`` False) is not quite all exposed on Megatron-Core: Transformer Engine's
column-parallel ``LayerNormLinear`` issues the backward reduce-scatter (all-reduce without SP) of its input gradient
with ``async_op=True`` right after the data-gradient GEMM and waits for it only after the weight-gradient GEMM ("Overlap
dgrad-RS/AR with wgrad", NVIDIA/TransformerEngine@v1.8 transformer_engine/pytorch/module/layernorm_linear.py
``_LayerNormLinear.backward``; Megatron-LM's own ColumnParallelLinear does the same since 2021-09). One such
collective per block and backward pass (BF16, the reduce-scatter of an all-gather + reduce-scatter pair) hides
behind the column-parallel weight-gradient GEMMs W_c (``training.tp_dgrad_overlap``; PyTorch DTensor TP issues it
after both GEMMs, so not in torchtitan):

    exposed = T_tp − min(T_dgrad, W_c)          (overlap off),   W_c ≈ G / (2·(3 + [full recompute]))

W_c is approximated as half the weight-gradient share of G (each GEMM's forward, data- and weight-gradient passes
are equal; a block's column-parallel GEMMs, QKV and fc1, have at least the FLOPs of its row-parallel ones): a lower
bound, so the hidden part errs small.

An approximation: summed over the stage's layers (equal where the layers are alike). What hides is not free: the
compute it hides under runs slower while it does (:func:`autopar.cost.overlap.overlap_cost`, by engine). Transformer
Engine's all-gathers are ``ring_exchange`` peer copies on the copy engines and its reduce-scatters ``pipeline`` /
``bulk`` kernels on 16 reserved SMs (TransformerEngine ``transformer_engine/pytorch/module/base.py``
``initialize_ub`` defaults: ``num_sm`` 1 and ``use_ce`` for ring_exchange, 16 with ``set_sm_margin`` otherwise),
so the hidden all-gather time pays the ``copy_engine`` slowdown and the hidden reduce-scatter time the ``sm`` one.

Async TP (``training.tp_overlap_impl == 'async_tp'``: PyTorch's ``torch._inductor.fx_passes.micro_pipeline_tp``
pass under torch.compile, torchtitan ``enable_async_tensor_parallel``; "[Distributed w/ TorchTitan] Introducing
Async Tensor Parallelism in PyTorch", PyTorch dev-discuss 2024, discuss.pytorch.org/t/209487: ~8% end-to-end on
Llama 3 8B and 70B) is a graph rewrite, not a library switch, and only what its pattern matcher finds is overlapped
(torch ``micro_pipeline_tp.py``: ``fuse_all_gather_matmul`` for an all-gather whose output is the left operand of
matmuls, ``fuse_matmul_reduce_scatter`` for a reduce-scatter whose input is one matmul's output,
``_find_producer_matmul``):

* forward: the all-gather before the column-parallel GEMMs (one gather for q, k, v or w1, w3) and the
  reduce-scatter after the row-parallel GEMM; the backward's all-gather of the output gradient before the
  row-parallel input-gradient GEMM;
* NOT the backward's reduce-scatter after the column-parallel input-gradient GEMMs: its input is the SUM of the
  q, k, v (w1, w3) input gradients, an add, not a matmul, so it stays a plain NCCL reduce-scatter, all exposed;
* FP8 with a recipe that quantises after the all-gather (rowwise: "all-gather happens in high precision",
  torchtitan ``enable_float8_tensorwise_tp``; and the other FP8 families): the gathered tensor feeds a cast, not a
  matmul, so only the forward reduce-scatters are fused (pytorch/pytorch issue #149990, 2025-03-25: async TP under
  rowwise scales fuses matmul -> reduce-scatter, not all-gather -> matmul). Tensorwise casts before the gather: as
  BF16.

Each fused op runs its GEMM as tp GEMMs of M/tp rows, one per shard (``_fused_all_gather_matmul_impl``,
``_fused_matmul_reduce_scatter_impl``), on two streams, pulling each peer's shard with a peer ``copy_`` (the
copy engines; ``torch.distributed._symmetric_memory._pipelined_multi_all_gather_and_consume`` and
``_pipelined_produce_and_all2all``). The local shard is consumed first (all-gather) or produced last
(reduce-scatter), so the tp − 1 remote transfers hide behind the other tp − 1 chunks' GEMMs. Priced:

    exposed = T_u + max(0, T_m − G_m · (tp − 1)/tp)                       T_m + T_u = T_tp; G_m = G · T_m / T_tp
            + Σ_fused GEMMs (tp · t(M/tp) − t(M))                        the chunks' lower efficiency (gemm_half_m)
            + n_rs · stream((M·h + M·h/tp) · e)                          each fused reduce-scatter ends in a sum of
                                                                          the tp stacked partials (torch.sum: read all,
                                                                          write one shard), an HBM pass NCCL did
                                                                          inside its kernel
            + overlap_cost(hidden part of T_m, copy_engine)

with T_m the fused collectives' share of T_tp (per block and pass an all-gather and a reduce-scatter of equal
volume; under tensorwise FP8 the all-gather moves half the reduce-scatter's bytes), T_u the rest, M = b·s/cp
tokens, h the hidden size and e the activation bytes. The last stage's LM-head gather (and its backward reduce-
scatter, one matmul) counts as fused. A TP group that spans NVLink domains cannot map its peers' memory (symmetric
memory needs peer access): there async TP is priced as no overlap. Approximations: the window G_m is G's share by
volume; the symmetric-memory barriers (two per step) are not counted; op-SAC's recomputed matmuls are not counted as
chunked.

FP8 with Transformer Engine (``precision: fp8``, ``fp8_recipe: te``) under sequence parallelism: TE gathers the
FP8 tensors, not the BF16 ones. The column-parallel input (``LayerNormLinear``: the norm writes its output straight
to FP8, ``ln_out_dtype = torch.uint8 if (fp8 and not return_layernorm_output)``, then ``gather_along_first_dim(ln_out,
tp_group)``) and, in the backward, the row-parallel output gradient (``grad_output_preprocess``: "FP8 case with
gather: ... cast, transpose for efficient gather", ``cast_to_fp8`` into a uint8 tensor, then
``gather_along_first_dim``) are all-gathered at 1 byte per element; the reduce-scatters (the row-parallel output,
the column-parallel input gradient) stay BF16 (NVIDIA/TransformerEngine@v1.8 transformer_engine/pytorch/module/
layernorm_linear.py ``_LayerNormLinear.forward``, module/base.py ``grad_output_preprocess``; TE 1.8 is the NeMo 24.07
container's). Megatron-Core runs its TP-split GEMMs through these modules (TELayerNormColumnParallelLinear,
TERowParallelLinear), so the volume is 3/4 of BF16's, as torchao's tensorwise below. The MXFP8 / blockwise recipes
(other precisions) are left at BF16 volume: not checked. Without SP the collectives are BF16 all-reduces.

FP8 tensorwise with torchao (``fp8_recipe: tensorwise``): torchtitan's Float8ColwiseParallel / Float8RowwiseParallel
cast before the sequence-parallel all-gathers, so each all-gather moves 1-byte elements and each reduce-scatter
stays in BF16: 3/4 of the BF16 volume ("float8 all-gather with TP is only supported for tensorwise float8 scaling
recipes. For rowwise recipes, we use regular TP and all-gather happens in high precision": pytorch/torchtitan
torchtitan/models/llama3/infra/parallelize.py, ``enable_float8_tensorwise_tp``).

torchao tensorwise scaling under DTensor TP also reduces each cast's amax over the TP group ("For TP ... The overhead is
communicating max(abs) across ranks. For sharded weights, we communicate max(abs) as well": pytorch/torchtitan
docs/float8.md): one 4-byte all-reduce per cast of a TP-sharded operand, latency-bound and waited on before the cast,
so not hidden by async TP (:func:`fp8_amax_seconds`).

Rowwise scaling reduces too, where TP shards the dimension a scale is taken along: torchao computes each axiswise amax
with torch.amax on the DTensor operands torchtitan's plain Colwise/RowwiseParallel hand the Float8Linear (pytorch/ao
torchao/float8/float8_linear.py matmul_with_hp_or_float8_args, float8_utils.py tensor_to_amax; TP with rowwise
scaling made to work by pytorch/ao PR #1718, 2025-02-14), so an amax over a sharded dimension is a Partial(max)
that DTensor all-reduces before the scale is formed. Per TP-split linear and micro-batch: column-parallel (weight
sharded on N), backward: the output gradient's per-row amax over its N/tp columns (T values, every GPU holding all
T = b·s/cp rows) and the weight's backward cast along N (K values); row-parallel (input and weight sharded on K),
forward: the input's per-row amax over its K/tp columns (T values) and the weight's forward cast along K (N values),
again when recomputing. Casts along an unsharded dimension (the forward input of a column-parallel linear, gathered
first; every weight-gradient operand, scaled along the tokens) reduce locally. Each all-reduce moves the amax as
torch.amax returns it, in the operand's BF16 (2 B a value; ASSUMED reduced before torchao's float64 upcast in
amax_to_scale): latency-bound at these sizes either way, and waited on before its cast.
"""

from __future__ import annotations

from autopar.cost._select import minimum, where
from autopar.cost.collectives import Network
from autopar.cost.compute import TP_GEMM_PARTS, gpu_tokens
from autopar.cost.kernels import FP8_FAMILY, Kernels
from autopar.cost.layer_sums import ModelProfile
from autopar.cost.overlap import overlap_cost
from autopar.cost.stage import Stage
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import Layout
from autopar.specs.training import TrainingSpec


FP8_TENSORWISE_TP_VOLUME = 0.75   # all-gather in FP8 (1/2), reduce-scatter in BF16 (1): (0.5 + 1) / 2


def _fp8_tensorwise(tr: TrainingSpec) -> bool:
    """Whether the GEMMs run torchao's tensorwise FP8 (module docstring): FP8 all-gathers, amax all-reduces."""
    return tr.precision == "fp8" and tr.fp8_recipe == "tensorwise"


def _fp8_gathers(tr: TrainingSpec, L: Layout):
    """Whether the TP all-gathers move FP8 elements (module docstring): torchao tensorwise, or Transformer Engine's
    fp8 recipe under sequence parallelism. ``L.sp`` may be a numpy array (elementwise result)."""
    if _fp8_tensorwise(tr):
        return True
    return L.sp if (tr.precision == "fp8" and tr.fp8_recipe == "te") else False


def _message_bytes(prof: ModelProfile, L: Layout, tr: TrainingSpec):
    """Bytes of one TP collective's b·s/cp·h activation tensor in the activation dtype (before any FP8 volume
    factor). ``L.micro_batch`` and ``L.cp`` may be numpy arrays (elementwise result)."""
    return L.micro_batch * (tr.seq_len / L.cp) * prof.hidden * tr.activation_bytes


def tp_comm_seconds(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, net: Network,
                    per_block: int | None = None) -> float:
    """T_tp: every TP collective of one micro-batch on stage ``st``, none hidden. ``per_block`` overrides the
    collectives per block (2: forward and backward, whatever the recompute policy)."""
    if L.tp == 1:
        return 0.0
    if per_block is None:
        per_block = 3 if L.recompute == "full" else 2
    n_ar = per_block * st.sum(prof, "tp_blocks") + (1 if st.is_last else 0)
    nbytes = _message_bytes(prof, L, tr)
    nbytes = nbytes * where(_fp8_gathers(tr, L), FP8_TENSORWISE_TP_VOLUME, 1.0)
    return n_ar * net.time("all_reduce", nbytes, L.tp, 1)


# torchao tensorwise amax all-reduces per TP-split linear and micro-batch: forward, the input's and the weight's cast;
# backward, the output gradient's (the backward weight cast reuses the forward amax: pytorch/ao
# torchao/testing/training/roofline_utils.py, tensorwise weight, kernel 4). Recomputation re-runs the forward two.
# Each GEMM as the stack launches it counts (TrainingSpec.projections: torchtitan's separate wq, wk, wv and w1, w3
# cast their weights and output gradients apart); a GEMM that shares its input with the one before it
# (Linear.shares_input) shares that input's cast and amax, one forward all-reduce fewer (two when recomputing).
FP8_AMAX_PER_LINEAR, FP8_AMAX_RECOMPUTE, FP8_AMAX_BYTES = 3, 2, 4.0
# torchao rowwise amax all-reduces (module docstring): bytes per reduced amax value, the operand's BF16.
FP8_ROWWISE_AMAX_BYTES = 2.0


def fp8_amax_seconds(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, net: Network) -> float:
    """Seconds of one micro-batch's torchao amax all-reduces over the TP group (module docstring). Tensorwise:
    n_lin · (3 + 2 if recomputing) − n_shared · (1 + 1 if recomputing) latency-bound all-reduces of one fp32 scalar,
    n_lin the stage's TP-split linears, n_shared those sharing their input with the one before. Rowwise: per
    column-parallel linear one all-reduce of T amax values and one of K (backward), per row-parallel linear one of
    T and one of N (forward, twice when recomputing)."""
    if L.tp == 1 or tr.precision != "fp8" or tr.fp8_recipe not in ("tensorwise", "rowwise"):
        return 0.0
    split = [(count, lin) for j, count in prof.kind_counts(st.first, st.last) for lin in prof.kinds[j].linears
             if lin.split in ("col", "row")]
    rc = L.recompute != "none"
    if tr.fp8_recipe == "rowwise":
        rows = net.time("all_reduce", FP8_ROWWISE_AMAX_BYTES * gpu_tokens(L, tr), L.tp, 1)
        total = 0.0
        for count, lin in split:
            if lin.split == "col":
                total += count * (rows + net.time("all_reduce", FP8_ROWWISE_AMAX_BYTES * lin.k, L.tp, 1))
            else:
                total += count * (2 if rc else 1) * (rows + net.time("all_reduce", FP8_ROWWISE_AMAX_BYTES * lin.n,
                                                                     L.tp, 1))
        return total
    n_lin = sum(count for count, _ in split)
    n_shared = sum(count for count, lin in split if lin.shares_input)
    n_ar = n_lin * (FP8_AMAX_PER_LINEAR + (FP8_AMAX_RECOMPUTE if rc else 0)) - n_shared * (2 if rc else 1)
    return n_ar * net.time("all_reduce", FP8_AMAX_BYTES, L.tp, 1)


def _ag_share(tr: TrainingSpec, L: Layout):
    """The all-gather's share of one all-gather + reduce-scatter pair's time (FP8 gathers, :func:`_fp8_gathers`, move
    1-byte elements: 0.5 / (0.5 + 1))."""
    return where(_fp8_gathers(tr, L), 1.0 / 3.0, 0.5)


def async_tp_fuses_all_gather(tr: TrainingSpec) -> bool:
    """Whether async TP's pattern matcher fuses the all-gathers: the gathered tensor must feed the matmul itself,
    not an FP8 cast after the gather (module docstring)."""
    return tr.precision not in FP8_FAMILY or _fp8_tensorwise(tr)


def async_tp_fused_share(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec) -> float:
    """T_m / T_tp: the share of the stage's TP collective time async TP fuses with a matmul (module docstring)."""
    passes = 3 if L.recompute == "full" else 2
    fwd = passes - 1
    a = _ag_share(tr, L)
    per_block = fwd * (1.0 - a) + ((fwd + 1) * a if async_tp_fuses_all_gather(tr) else 0.0)
    blocks = st.sum(prof, "tp_blocks")
    last = 1.0 if st.is_last else 0.0
    total = passes * blocks + last
    return (per_block * blocks + last) / total if total else 0.0


def async_tp_compute_seconds(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, kern: Kernels) -> float:
    """Seconds async TP adds to a micro-batch's kernels on stage ``st``: its fused GEMMs run as tp chunks of M/tp
    rows, and each fused reduce-scatter ends in a memory-bound sum of the tp partials (module docstring)."""
    tokens = gpu_tokens(L, tr)
    tp, wb, gb = L.tp, tr.weight_bytes, tr.grad_bytes
    fwd = 2 if L.recompute == "full" else 1            # forward passes with fused collectives
    ag = async_tp_fuses_all_gather(tr)
    extra = 0.0
    for j, count in prof.kind_counts(st.first, st.last):
        for lin in prof.kinds[j].linears:
            if lin.module not in TP_GEMM_PARTS or lin.split not in ("col", "row"):
                continue
            n, k = (lin.n / tp, lin.k) if lin.split == "col" else (lin.n, lin.k / tp)
            whole = kern.gemm(tokens, n, k, lin.params / tp, wb, gb)[0]
            chunked = tp * kern.gemm(tokens / tp, n, k, lin.params / tp, wb, gb)[0]
            # column-parallel: forward (fused all-gather) only; row-parallel: forward (fused reduce-scatter) and the
            # backward's input-gradient GEMM of the same shape (fused all-gather of the output gradient)
            times = (fwd if ag else 0) if lin.split == "col" else fwd + (1 if ag else 0)
            extra += count * times * (chunked - whole)
    n_rs = fwd * st.sum(prof, "tp_blocks") + (1.0 if st.is_last else 0.0)
    extra += n_rs * kern.stream((1.0 + 1.0 / tp) * tokens * prof.hidden * tr.activation_bytes)
    return extra


def dgrad_comm_seconds(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, net: Network) -> float:
    """T_dgrad: the backward collective after each block's column-parallel data-gradient GEMM, one per block (module
    docstring): a BF16 reduce-scatter of the b·s/cp·h gradient with SP, an all-reduce without."""
    if L.tp == 1:
        return 0.0
    nbytes = _message_bytes(prof, L, tr)
    rs = net.time("reduce_scatter", nbytes, L.tp, 1)
    return st.sum(prof, "tp_blocks") * where(L.sp, rs, net.time("all_reduce", nbytes, L.tp, 1))


def tp_time_per_microbatch(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, hw: HardwareSpec,
                           net: Network, gemm_window: float = 0.0, kern: Kernels | None = None) -> float:
    """Exposed TP seconds of one micro-batch, with what the overlap costs the compute (module docstring);
    ``gemm_window``: the stage's TP-split GEMM seconds (G above); ``kern``: the kernel prices (async TP's chunked
    GEMMs and partial sums; needed when ``tr.tp_overlap_impl`` is 'async_tp')."""
    t = tp_comm_seconds(prof, st, L, tr, net)
    amax = fp8_amax_seconds(prof, st, L, tr, net)
    if t and not tr.tp_comm_overlap and tr.tp_dgrad_overlap:
        # the column-parallel input gradients' collectives behind their weight-gradient GEMMs (module docstring)
        w_c = gemm_window / (2.0 * (4.0 if L.recompute == "full" else 3.0))
        hidden = minimum(dgrad_comm_seconds(prof, st, L, tr, net), w_c)
        return t - hidden + overlap_cost(hidden, hw, "sm", net.link(L.tp, 1)) + amax
    if not t or not tr.tp_comm_overlap:
        return t + amax
    tp = L.tp
    link = net.link(tp, 1)
    if tr.tp_overlap_impl == "async_tp":
        if link == "network":
            # symmetric memory maps peers' buffers over NVLink: a TP group across domains runs plain NCCL
            return t + amax
        if kern is None:
            raise ValueError("async TP pricing needs the kernel prices (kern)")
        t_m = t * async_tp_fused_share(prof, st, L, tr)
        exposed_m = max(0.0, t_m - gemm_window * (t_m / t) * (tp - 1) / tp)
        return ((t - t_m) + exposed_m + async_tp_compute_seconds(prof, st, L, tr, kern)
                + overlap_cost(t_m - exposed_m, hw, "copy_engine", link) + amax)
    exposed = t / tp + max(0.0, t * (tp - 1) / tp - gemm_window)
    a = _ag_share(tr, L)
    hidden = t - exposed
    return (exposed + overlap_cost(hidden * a, hw, "copy_engine", link)
            + overlap_cost(hidden * (1.0 - a), hw, "sm", link) + amax)
