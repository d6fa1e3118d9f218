"""Compute time: the kernels of one micro-batch on one GPU of a pipeline stage, priced class by class.

A stage's GPUs (tp·cp of them per data-parallel rank, re-sliced as ep·etp for the experts) share the tokens of a
micro-batch: each GPU runs the GEMMs of T = b·s/cp tokens on its 1/tp slice of the weights (column-parallel
layers split N, row-parallel split K; Shoeybi et al. 2019, arXiv 1909.08053 sec. 3), the attention core of its
a/tp heads, and the memory-bound kernels of T/tp tokens where sequence parallelism splits them (Korthikanti et
al. 2022, arXiv 2205.05198 sec. 4.2.2). Routed experts: each GPU runs the T·k/tp token copies its EP rank
receives (balanced routing) over E/ep local experts of f_e/etp columns, so one local expert sees
M_e = T·k·ep·etp / (tp·E) tokens; under dropless routing the busiest rank has ``imbalance`` times the mean.

Each layer is the sum, per kernel class, of :mod:`autopar.cost.kernels`' prices of the kernels listed in its
:class:`autopar.cost.shapes.LayerKind`, plus the calibrated per-layer overhead (``efficiency.layer_overhead_us``,
one third in the forward pass). Recomputation re-runs the forward kernels of the modules it names (full: all of
them). The last stage adds the LM head (a BF16 GEMM) and its cross-entropy over the vocabulary; MTP modules
(DeepSeek-V3) are priced as one more layer of the last kind plus one more head each.
"""

from __future__ import annotations

from autopar.cost.cp import ring_full_share
from autopar.cost.kernels import Kernels
from autopar.cost.layer_sums import ModelProfile
from autopar.cost.shapes import TP_SPLIT, LayerKind
from autopar.cost.stage import Stage
from autopar.specs.layout import Layout
from autopar.specs.training import TrainingSpec

# Cross entropy over the vocabulary, bytes moved per logit element (forward + backward): fused (Megatron
# --cross-entropy-loss-fusion / Transformer Engine: logits read once in forward, the gradient written once in
# backward, bf16: 2 + 2 B, plus the fp32 max/sum statistics re-read: 4 B) or unfused (Megatron's
# vocab-parallel cross entropy in plain torch: bf16 logits read and upcast to fp32 (2 + 4), max (4), exp and
# sum (4 + 4), softmax (4 + 4); backward softmax − one-hot (4 + 4) and the bf16 gradient (4 + 2) = 44 B).
# torchtitan's loss (train.py@9dec370: F.cross_entropy(pred.flatten(0, 1).float(), labels)) counts alike: upcast
# 2 + 4; log_softmax over a 128K-wide row, too wide for the shared-memory kernel, reads the fp32 row for the max,
# for the exp-sum and to write the result (4 + 4 + 4 + 4); backward: nll_loss_backward's zero-filled fp32 gradient
# (4), log_softmax_backward's row-sum pass and its read-read-write (4 + 4 + 4 + 4), the cast back to bf16 (4 + 2) =
# 48 B, within 10% of the unfused figure (4 B per logit: ~4 ms of Llama 3 8B's 2 x 8192-token micro-batch), so
# one figure serves both.
# Transformer Engine's Triton kernel ('te', TE before v2.18, autopar.cost.memory.LOGIT_EXTRA_BYTES): the online-softmax
# pass reads the bf16 logits (2), the loss kernel reads them again and writes the gradient in place (2 + 2), and the
# backward scales it by the per-token loss gradient in place (element_mul_kernel, read 2 + write 2: Megatron passes
# reduce_loss False, so grad_output is not the scalar 1.0 the kernel skips) = 10 B (NVIDIA/TransformerEngine@71bbefbf
# transformer_engine/pytorch/triton/cross_entropy.py).
# torch.compile'd ('compiled': torchtitan's loss under --training.compile from 2025-04, autopar.cost.memory
# TORCH_LOSS_BYTES), read from the kernels Inductor generates (benchmarks/torch_compiled_loss_memory.py, torch 2.13.0,
# C++ backend, 2026-11-26): without TP the forward is one kernel that reads the bf16 logits twice (the row max, then
# the exp-sum: 2 + 2) and the backward one kernel that reads them again and writes the bf16 gradient (2 + 2) = 8 B;
# with TP (DTensor loss_parallel traced into the graph) the all-reduces split the forward into four kernels: max
# (2), exp-sum (2), the zero-filled fp32 one-hot matrix written (4), then the fp32 one-hot + softmax written for the
# backward from it and the logits (4 + 2 + 4), and the backward reads it and writes the bf16 gradient (4 + 2) = 24 B
# (COMPILED_LOSS_PARALLEL_BYTES). APPROXIMATE on CUDA: the Triton backend's kernels were not read (its online softmax
# may fuse the two forward reads without TP). Kernel launches (2, and 5 with TP, against about 8 eager) are not priced.
CROSS_ENTROPY_BYTES = {"fused": 8.0, "te": 10.0, "unfused": 44.0, "compiled": 8.0}
COMPILED_LOSS_PARALLEL_BYTES = 24.0

# Elementwise kernels by stack (TrainingSpec.elementwise): HBM bytes of each memory-bound op relative to the fused
# counts of autopar.cost.shapes (one kernel per op: forward reads its inputs and writes its output once), as
# (forward, backward) factors. Counted op by op, in 2-byte units per element, from what each PyTorch kernel reads and
# writes (one pass each, fp32 = 2 units):
#  - norm, eager (torchtitan@9dec370 torchtitan/models/norms.py RMSNorm: self._norm(x.float()).type_as(x) * w, _norm
#    = x * rsqrt(x.pow(2).mean(-1) + eps)): float 1+2, pow 2+2, mean 2, mul 2+2, type_as 2+1, * w 1+1 = 18 units
#    against the fused 2 -> 9x; backward through the same chain (autograd of mul, type_as, mul, mean/pow, float:
#    ~24 units against 3) -> 8x;
#  - rope, eager (models/llama/model.py apply_rotary_emb: x.float() as complex, * freqs_cis, view_as_real, type_as):
#    1+2, 2+2, 2+1 = 10 units against 2 -> 5x, and the same backward;
#  - gated activation, eager (silu(w1 x) * w3 x: silu 1+1, mul 2+1 = 5 against 3; backward: mul reads dy, a, b and
#    writes da, db, silu reads x, da and writes dx = 8 against 5) -> 5/3, 8/5;
#  - residual adds and MoE permutation are one kernel either way (1x);
#  - compiled (torch.compile / Inductor, torchtitan --training.compile per block): each op chain above becomes one
#    fused pointwise or reduction kernel reading its inputs and writing its outputs once, as the fused counts (1x;
#    an approximation: Inductor may split a chain or save an extra fp32 statistic).
#  Eager kernels stream at the hardware file's ``hbm`` fraction like fused ones: what differs is their bytes, not their
#  rate. Measured PyTorch eager kernels on large tensors: torch.maximum (fp16, vectorised TensorIterator loop) on
#  H200 3.37 TB/s of 4.8 = 0.70 at 1024 x 20480 (42 MB; 0.58 at half that; tile-ai/TileOPs issue #512, PyTorch
#  2.9.1, 2026-03-15), FBGEMM's gather/scatter on H100 SXM 2.54-2.77 TB/s of 3.35 = 0.76-0.83 (pytorch/FBGEMM PR
#  #3993, 2025-04-20), against the 0.80 the files take from DeepGEMM; a training step's elementwise tensors (one
#  layer's b·s x h activations: 134 MB for Llama 3 8B at 2 x 8192 tokens, twice that in fp32) are larger still.
ELEMENTWISE_BYTES = {
    "fused": {},
    "compiled": {"grad_sum_eager": (0.0, 0.0),    # separate projections' input gradients summed in one fused kernel
                 "moe_act_clamp": (0.0, 0.0),     # the clamps fused into the compiled activation chain
                 "rope_unfused": (0.0, 0.0)},     # Megatron-Core's unfused RoPE: not the compiled stack's
    "eager": {"norm": (9.0, 8.0), "rope": (5.0, 5.0), "moe_act": (5 / 3, 1.6), "shared_act": (5 / 3, 1.6),
              "rope_unfused": (0.0, 0.0)},       # the eager stack's own RoPE is the 5x above (its expert clamps,
                                                  # moe_act_clamp, counted as Megatron-Core's: an approximation)
}
# The dense MLP's activation is counted op by op by its block instead: under an eager stack, or where the recipe turns
# bias_activation_fusion off (NeMo 24.07's Nemotron recipes; a compiled stack fuses the chain whatever the switch),
# the ``mlp_act_unfused`` entry adds what the model's
# activation function's PyTorch ops move beyond the fused kernel (autopar.blocks.mlp.ACT_UNFUSED_EXTRA: SwiGLU's
# (2, 3) per unit of FFN width is the 5/3, 8/5 above; squared ReLU's relu-then-pow chain (2, 7)).


# Bias-dropout-add (Megatron-Core megatron/core/fusions/fused_bias_dropout.py @ core_r0.8.0 (baf94af3),
# _bias_dropout_add_func: x = x + bias; out = dropout(x, p); out = residual + out), bytes per element of a
# sub-block's output beyond the residual add already counted (``residual``, 3 elements each way), as (forward,
# backward), with e the activation dtype's bytes and a 1-byte boolean dropout mask (torch native_dropout returns
# (output, bool mask); its decomposition torch/_decomp/decompositions.py native_dropout: bool_mask = rand_like(x) > p,
# the mask what the backward reads):
#  - fused (bias_dropout_add_fused_train, compiled by jit_fuser = torch.compile on torch >= 2.2, megatron/core/jit.py
#    at the same commit): one kernel; with dropout it also writes the mask (1) forward, and the backward's
#    grad * mask * scale reads dy and the mask and writes dx (2e + 1); the bias is read inside it (nothing per
#    element);
#  - unfused (bias_dropout_add_fusion off): with dropout, native_dropout's own kernel reads x and writes the output
#    and the mask (2e + 1) before the add, and native_dropout_backward reads dy and the mask and writes dx
#    (2e + 1); with a bias, its add is one more kernel forward (read e, write e; its gradient is autograd's sum over
#    tokens either way);
#  - dropout 0 (hidden_dropout = 0.0): torch's dropout returns its input without a kernel (ATen Dropout.cpp
#    _dropout_impl: "if (p == 0 || !train ...) return input"; checked on torch 2.13: F.dropout(x, 0.0, True) is x),
#    so only the bias add can remain.
def bda_bytes(tr: TrainingSpec) -> dict[str, tuple[float, float]]:
    """(forward, backward) bytes per element of the ``bda`` (dropout) and ``bda_bias`` (separate bias add) entries
    under ``tr``'s bias_dropout_add_fusion and hidden_dropout."""
    e = float(tr.activation_bytes)
    drop = tr.hidden_dropout > 0.0
    if tr.bias_dropout_add_fusion:
        return {"bda": (1.0, 2.0 * e + 1.0) if drop else (0.0, 0.0), "bda_bias": (0.0, 0.0)}
    return {"bda": (2.0 * e + 1.0, 2.0 * e + 1.0) if drop else (0.0, 0.0), "bda_bias": (2.0 * e, 0.0)}

# FP8 quantisation bytes per element of each GEMM operand cast (forward: the input activation; backward: the output
# gradient), by recipe (TrainingSpec.fp8_recipe) and elementwise mode:
#  - te: Transformer Engine cast_transpose with the amax fused in: read 2 B, write the FP8 copy and its transpose
#    1 + 1 B = 4 B;
#  - tensorwise (torchao Float8Linear, dynamic scaling): an amax pass (read 2 B), then the cast writing the row- and
#    the column-major FP8 copies: compiled, one Inductor kernel (read 2, write 1 + 1) = 6 B (pytorch/ao@05980129
#    torchao/testing/training/roofline_utils.py get_tensor_memory_traffic_ovhd_s, tensorwise, input/grad_output,
#    kernels 1 and 3); eager, two casts (2 + 1 each) = 8 B;
#  - rowwise (torchao rowwise scaling): per-row scales along each GEMM's contraction dim, so the operand and its
#    transpose are quantised apart: compiled, kernel 1 reads 2 B and writes the FP8 rows (1 B) and a bf16 transpose
#    (2 B), kernel 2 reads that (2 B) and writes its FP8 copy (1 B) = 8 B (the same roofline_utils.py, rowwise,
#    input/grad_output); eager, 2 x (amax read 2 + read 2, write 1) = 10 B.
FP8_CAST_BYTES = {("te", "fused"): 4.0, ("te", "compiled"): 4.0, ("te", "eager"): 4.0,
                  ("tensorwise", "compiled"): 6.0, ("tensorwise", "eager"): 8.0, ("tensorwise", "fused"): 6.0,
                  ("rowwise", "compiled"): 8.0, ("rowwise", "eager"): 10.0, ("rowwise", "fused"): 8.0}

# torchao Float8Linear's weight casts, bytes per local weight element per micro-batch as (forward, backward). torchtitan
# gathers the weights in bf16 (its Llama 3 configs set float8.enable_fsdp_float8_all_gather = false:
# pytorch/torchtitan@038d5fd1 torchtitan/models/llama3/train_configs/llama3_70b.toml; torchao allows the FP8 gather for
# tensorwise only, torchao/float8/config.py) and casts them in every forward and backward, no cache across
# micro-batches (pytorch/ao@05980129 roofline_utils.py, role weight):
#  - tensorwise: amax (read 2) and the forward cast (read 2, write 1), the backward cast (read 2, write 1): (5, 3);
#  - rowwise: the forward cast (read 2, write 1); in backward a bf16 transpose (read 2, write 2) and its cast
#    (read 2, write 1): (3, 7).
TORCHAO_WEIGHT_CAST_BYTES = {"tensorwise": (5.0, 3.0), "rowwise": (3.0, 7.0)}
# Under sequence-parallel TP, torchtitan's tensorwise plan (Float8ColwiseParallel, PrepareFloat8ModuleInput,
# Float8RowwiseParallel; pytorch/torchtitan torchtitan/models/llama3/infra/parallelize.py) quantises the T/tp shard
# before the FP8 all-gather (amax read 2 + read 2, write 1 = 5 B), and the weight-gradient GEMM then needs the gathered
# FP8 operand column-major (torch._scaled_mm; torchao float8_ops.py preprocess_addmm: .t().contiguous()): a transposed
# copy over all T tokens, read 1 + write 1 = 2 B. Rowwise keeps Megatron-style bf16 all-gathers and quantises the
# gathered T tokens (8 or 10 B above).
TENSORWISE_SHARD_CAST_BYTES, FP8_TRANSPOSE_BYTES = 5.0, 2.0
# Rowwise backward GEMMs run without fast accumulation (torchao Float8LinearConfig: gemm_config_grad_input and
# gemm_config_grad_weight default use_fast_accum=False; only the output GEMM sets it), and for that case torchao calls
# the tensorwise cuBLAS kernel with unit scales and rescales the bf16 result in a separate pointwise kernel
# ("The rowwise CUTLASS-based kernel is so slow without fast-accum ...": pytorch/ao torchao/float8/float8_ops.py
# addmm_float8_unwrapped; one extra Triton kernel per GEMM under torch.compile, pytorch/ao issue #2184, 2025-05-08):
# read 2 + write 2 B per element of the grad_input (T x K) and grad_weight (K x N) outputs.
ROWWISE_RESCALE_BYTES = 4.0


def torchao_cast_bytes(kind: LayerKind, L: Layout, tr: TrainingSpec, tokens: float) -> tuple[float, float]:
    """(forward, backward) HBM bytes of torchao Float8Linear's quantisation kernels (``fp8_recipe`` tensorwise or
    rowwise) in one layer's dense GEMMs for ``tokens`` = T tokens per GPU: each linear (as :mod:`autopar.blocks`
    lists it; a fused QKV or gate-up GEMM is one operand, and separate projections on one input (``shares_input``:
    torchtitan's wk, wv after wq) quantise it once: torchtitan's tensorwise TP plan casts the module input once
    (PrepareFloat8ModuleInput) and torch.compile's common-subexpression pass merges the identical casts, an
    approximation for eager mode) casts its input (forward) and its output gradient (backward) over its
    local width, its weight both ways (:data:`TORCHAO_WEIGHT_CAST_BYTES`), and under rowwise rescales its backward GEMM
    outputs (:data:`ROWWISE_RESCALE_BYTES`). Where TP gathers an operand (a column-parallel input, a row-parallel
    output gradient) every GPU holds all T tokens of it; tensorwise under SP casts the T/tp shard and transposes the
    gathered copy (:data:`TENSORWISE_SHARD_CAST_BYTES`). Expert GEMMs are not counted here."""
    tp, recipe = L.tp, tr.fp8_recipe
    act = FP8_CAST_BYTES[recipe, tr.elementwise]
    w_fwd, w_bwd = TORCHAO_WEIGHT_CAST_BYTES[recipe]

    def operand(m: float, width: float, gathered: bool) -> float:
        if gathered and tp > 1 and recipe == "tensorwise" and L.sp:
            return width * (TENSORWISE_SHARD_CAST_BYTES * m / tp + FP8_TRANSPOSE_BYTES * m)
        return width * act * m

    fwd = bwd = 0.0
    for lin in kind.linears:
        if lin.split == "col":
            m, k, n, gin, gout = tokens, lin.k, lin.n / tp, True, False
        elif lin.split == "row":
            m, k, n, gin, gout = tokens, lin.k / tp, lin.n, False, True
        elif lin.split == "replicated":
            m, k, n, gin, gout = tokens / tp, lin.k, lin.n, False, False
        else:
            continue
        fwd += (0.0 if lin.shares_input else operand(m, k, gin)) + w_fwd * k * n
        bwd += operand(m, n, gout) + w_bwd * k * n
        if recipe == "rowwise":
            bwd += ROWWISE_RESCALE_BYTES * (m * k + k * n)
    return fwd, bwd


# Transformer Engine's MXFP8 quantisation of a GEMM operand: read 2 B, write the rowwise and columnwise FP8 copies
# 1 + 1 B (their 1/32 E8M0 scales neglected) = 4 B per element: the figure layer_parts uses for every non-'fp8'
# precision of the FP8 family.
FP8_CAST_MXFP8_BYTES = 4.0

# The routed-expert segment of an MoE layer: the GPU work issued after the token dispatcher's device-to-host sync
# (:func:`moe_host_time`), and what the ``moe`` recompute module re-runs.
ROUTED_PARTS = ("moe", "moe_act", "moe_act_clamp", "permute", "expert_bias")

# Forward kernels re-run by each Megatron-Core recompute module (``--recompute-modules``).
RECOMPUTE_PARTS = {"core_attn": ("core_attn",), "mlp": ("mlp", "mlp_act", "mlp_act_unfused"), "moe": ROUTED_PARTS,
                   "moe_act": ("moe_act", "moe_act_clamp"), "shared_experts": ("shared_experts", "shared_act"),
                   "layernorm": ("norm",), "mla_up_proj": ("mla_up_proj",)}


# Parts whose tensor-core work runs in BF16 under every FP8 recipe: a linear mixer's chunked scan (Triton kernels of
# mamba_ssm / flash-linear-attention, outside Transformer Engine's fp8_autocast modules; autopar.blocks._recurrent).
# Its "GEMM" is column-split like the heads it runs over. Where the block also counts the scan kernels' HBM bytes
# (a memory-bound entry of the same name), the part costs the larger of the two per pass: a roofline (Williams,
# Waterman & Patterson 2009) over the scan's kernels taken together, an approximation on the fast side where one
# kernel is compute-bound and another memory-bound.
BF16_PARTS = ("ssm_scan",)


def layer_parts(kern: Kernels, kind: LayerKind, L: Layout, tr: TrainingSpec, tokens: float,
                imbalance: float) -> dict[str, tuple[float, float]]:
    """(forward, backward) seconds of each part of one layer for ``tokens`` = b·s/cp tokens per GPU."""
    tp, ep, etp = L.tp, L.ep, L.etp
    wb, gb = tr.weight_bytes, tr.grad_bytes
    parts: dict[str, list[float]] = {}

    def add(name: str, fb: tuple[float, float], scale: float = 1.0) -> None:
        cur = parts.setdefault(name, [0.0, 0.0])
        cur[0] += fb[0] * scale
        cur[1] += fb[1] * scale

    m_exp = tokens * kind.top_k * ep * etp / (tp * kind.num_experts) if kind.is_moe else 0.0
    scan: dict[str, tuple[float, float]] = {}   # BF16_PARTS' tensor-core seconds, met by their bytes below
    for lin in kind.linears:
        if lin.module in BF16_PARTS:
            scan[lin.module] = kern.gemm(tokens, lin.n / tp, lin.k, lin.params / tp, wb, gb, hi=True)
        elif lin.split == "col":
            add(lin.module, kern.gemm(tokens, lin.n / tp, lin.k, lin.params / tp, wb, gb))
        elif lin.split == "row":
            add(lin.module, kern.gemm(tokens, lin.n, lin.k / tp, lin.params / tp, wb, gb))
        elif lin.split == "replicated":
            add(lin.module, kern.gemm(tokens / tp, lin.n, lin.k, lin.params, wb, gb))
        else:
            local = kind.num_experts / ep * lin.params / etp
            n, k = (lin.n / etp, lin.k) if lin.split == "expert_col" else (lin.n, lin.k / etp)
            add(lin.module, kern.gemm(m_exp, n, k, local, wb, gb, grouped=True), imbalance)
    span = min(kind.attn_window, tr.seq_len / L.cp)
    if tr.attention_kernel == "unfused":
        full = kind.attn_flops * kind.attn_window / kind.attn_ctx   # no causal skipping: the whole square
        add("core_attn", kern.attention_unfused(full * tokens / tp, span, kind.head_dim,
                                                kind.heads / tp * kind.attn_window * tokens))
    else:
        add("core_attn", kern.attention(kind.attn_flops * tokens / tp, span, kind.head_dim,
                                        ring_full_share(L.cp, kind.attn_window, tr.seq_len),
                                        window=kind.window if kind.window < tr.seq_len else 0,
                                        seq=tr.seq_len / L.cp))
    e = tr.activation_bytes
    ew = ELEMENTWISE_BYTES[tr.elementwise]
    # the activation's op chain: eager always, or unfused by the recipe unless torch.compile fuses the chain
    act_unfused = tr.elementwise == "eager" or (not tr.bias_activation_fusion and tr.elementwise != "compiled")
    bda = bda_bytes(tr)
    for name, (fwd, bwd) in kind.membound.items():
        if name == "batch_major" and L.micro_batch == 1:   # one sequence: [s, 1, ·] is [1, s, ·], no copy
            continue
        if name == "mlp_act_unfused" and not act_unfused:
            continue
        if name in bda and bda[name] == (0.0, 0.0):
            continue
        if name in ("expert_bias", "moe_act_clamp") and tr.fused_grouped_mlp:   # inside the fused grouped kernels
            continue
        split = TP_SPLIT[name]
        if split == "sp":
            n_tok = tokens / tp if L.sp else tokens
        elif split == "routed":
            n_tok = tokens / tp * (etp if name in ("permute", "expert_grad_sum", "expert_bias") else 1)
        elif split == "full":
            n_tok = tokens
        else:
            n_tok = tokens / tp
        scale = imbalance if split == "routed" else 1.0
        fx, bx = ew.get(name, (1.0, 1.0))
        if name in bda:   # counted in bytes per element, not in elements of the activation dtype
            fx, bx = bda[name][0] / e, bda[name][1] / e
        fb = (kern.stream(fx * fwd * e * n_tok), kern.stream(bx * bwd * e * n_tok))
        if name in scan:   # the same kernels' FLOPs and bytes: a roofline, the larger of the two
            g = scan.pop(name)
            fb = (max(fb[0], g[0]), max(fb[1], g[1]))
        add(name, fb, scale)
    for name, fb in scan.items():   # a scan without a byte inventory: its FLOPs alone
        add(name, fb)
    if kern.fp8:
        cast_b = FP8_CAST_BYTES[tr.fp8_recipe, tr.elementwise] if tr.precision == "fp8" else FP8_CAST_MXFP8_BYTES
        if tr.precision == "fp8" and tr.fp8_recipe in TORCHAO_WEIGHT_CAST_BYTES:
            fwd_b, bwd_b = torchao_cast_bytes(kind, L, tr, tokens)
            add("fp8_cast", (kern.stream(fwd_b), kern.stream(bwd_b)))
        else:
            # Transformer Engine cast_transpose: 4 B per element of each GEMM input (forward) and output gradient
            # (backward) — see autopar.cost.shapes.
            half = 0.5 * kind.fp8_cast_width * cast_b * tokens / tp
            add("fp8_cast", (kern.stream(half), kern.stream(half)))
        if kind.is_moe:
            half_e = 0.5 * kind.fp8_cast_width_expert * cast_b * tokens * kind.top_k / tp
            add("moe", (kern.stream(half_e), kern.stream(half_e)), imbalance)
    return {k: (v[0], v[1]) for k, v in parts.items()}


# torchtitan's op-level selective activation checkpointing (TrainingSpec.selective_ac == "op", the "selective"
# policy under the torchtitan stack; pytorch/torchtitan@9dec370 torchtitan/parallelisms/parallelize_llama.py
# _save_list and _custom_policy): inside each checkpointed block it saves the outputs of SDPA and of every matmul
# except every second one, and recomputes everything else. Share of each part's forward re-run:
#  - attention projections q, k, v, o in that order: k and o are the 2nd and 4th matmuls -> (|Wk| + |Wo|) / (|Wq| +
#    |Wk| + |Wv| + |Wo|) = 1/2 for any GQA ratio (|Wk| = |Wv|, |Wq| = |Wo|);
#  - gated MLP w1, w3, w2 (5th-7th matmuls): w3 -> 1/3; other GEMM modules (experts, router, MLA, shared experts):
#    every second matmul -> 1/2;
#  - the attention core (SDPA, saved): 0; every memory-bound op (norms, RoPE, activation, residual, casts): 1.
# The stored activations are counted as Megatron's selective policy (core_attn) counts them: an upper bound, since
# op-SAC also drops the elementwise outputs and half the matmul outputs.
OP_SAC_SHARE = {"attn": 0.5, "mlp": 1 / 3, "core_attn": 0.0}
OP_SAC_GEMM_DEFAULT = 0.5


def recompute_shares(L: Layout, tr: TrainingSpec, parts: dict) -> dict[str, float]:
    """The share of each part's forward kernels the layout's recompute policy re-runs (``parts``' order): 1 for the
    parts of the modules it names (:func:`recomputed_parts`), or op-SAC's shares (:data:`OP_SAC_SHARE`) for the
    selective policy under ``TrainingSpec.selective_ac == "op"``."""
    if tr.selective_ac == "op" and L.recompute not in ("none", "full") and L.recompute_modules == {"core_attn"}:
        return {p: OP_SAC_SHARE.get(p, 1.0 if KERNEL_CLASS.get(p) == "memory-bound" else OP_SAC_GEMM_DEFAULT)
                for p in parts}
    return {p: 1.0 for p in recomputed_parts(L, parts)}


def recomputed_parts(L: Layout, parts: dict) -> tuple[str, ...]:
    """The parts of a layer whose forward kernels the layout's recompute policy runs again, in ``parts``' order
    (a fixed order keeps the floating-point sums identical from run to run, whatever the string hash seed)."""
    if L.recompute == "full":
        return tuple(parts)
    if L.recompute == "none":
        return ()
    chosen = {p for mod in L.recompute_modules for p in RECOMPUTE_PARTS.get(mod, ())}
    return tuple(p for p in parts if p in chosen)


def _parts_key(prof: ModelProfile, j: int, L: Layout, tokens: float, imbalance: float) -> tuple:
    """The cache key of :func:`layer_parts` for layer kind j: the layout axes it reads (ep and etp only on layers with
    routed experts: shapes.layer_kind gives the others no expert GEMM, permute or expert activation)."""
    moe = prof.kinds[j].is_moe
    return (id(prof), j, tokens, L.cp, L.tp, L.sp, L.ep if moe else 1, L.etp if moe else 1, imbalance)


def _cached_parts(kern: Kernels, prof: ModelProfile, j: int, L: Layout, tr: TrainingSpec, tokens: float,
                  imbalance: float) -> dict[str, tuple[float, float]]:
    """:func:`layer_parts` of layer kind j, priced once per :func:`_parts_key` (not per recompute policy)."""
    key = _parts_key(prof, j, L, tokens, imbalance)
    parts = kern.cache.get(key)
    if parts is None:
        parts = kern.cache[key] = layer_parts(kern, prof.kinds[j], L, tr, tokens, imbalance)
    return parts


def _layer_times(kern: Kernels, prof: ModelProfile, j: int, L: Layout, tr: TrainingSpec, tokens: float,
                 imbalance: float) -> tuple[float, float, float]:
    """(forward, backward, recompute) seconds of one layer of kind j, cached per layout axes it depends on (cp too:
    the attention span is s/cp, so two layouts with the same b·s/cp tokens but other cp differ)."""
    key = _parts_key(prof, j, L, tokens, imbalance)
    hit = kern.cache.get(key + (L.recompute, L.recompute_modules))
    if hit is None:
        parts = _cached_parts(kern, prof, j, L, tr, tokens, imbalance)
        fwd = sum(v[0] for v in parts.values())
        bwd = sum(v[1] for v in parts.values())
        rc = sum(parts[p][0] * w for p, w in recompute_shares(L, tr, parts).items())
        hit = kern.cache[key + (L.recompute, L.recompute_modules)] = (fwd, bwd, rc)
    return hit


def layer_seconds(prof: ModelProfile, j: int, L: Layout, tr: TrainingSpec, kern: Kernels,
                  imbalance: float = 1.0) -> float:
    """Forward + backward + recomputation seconds of one layer of kind ``j`` on one GPU for L's micro-batch: the
    per-layer piece :func:`microbatch_time` sums (it adds the head, the embedding gradient and the per-layer
    overhead). The search bounds a stage's micro-batch time from below with these."""
    f, b, r = _layer_times(kern, prof, j, L, tr, gpu_tokens(L, tr), imbalance)
    return f + b + r


# The TP-split GEMMs of a layer (column- and row-parallel linears): what Transformer Engine's TP communication
# overlap pipelines the all-gathers and reduce-scatters with (autopar.cost.tp).
TP_GEMM_PARTS = ("attn", "mla_up_proj", "mlp", "shared_experts")


def hiding_windows(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, kern: Kernels,
                   imbalance: float = 1.0) -> tuple[float, float]:
    """(TP-split GEMM seconds, all kernel seconds) of one micro-batch's layers on stage ``st`` (forward + backward +
    recomputation, no per-layer overhead, no head): the compute that communication can hide behind
    (autopar.cost.tp, ep). Cached with the layer parts."""
    tokens = gpu_tokens(L, tr)
    gemm = total = 0.0
    for j, count in prof.kind_counts(st.first, st.last):
        wkey = _parts_key(prof, j, L, tokens, imbalance) + ("window", L.recompute, L.recompute_modules)
        hit = kern.cache.get(wkey)
        if hit is None:
            parts = _cached_parts(kern, prof, j, L, tr, tokens, imbalance)
            rc = recompute_shares(L, tr, parts)     # what the recompute re-runs, as _layer_times prices it
            g = sum(f + b + f * rc.get(n, 0.0) for n, (f, b) in parts.items() if n in TP_GEMM_PARTS)
            a = sum(f + b + f * rc.get(n, 0.0) for n, (f, b) in parts.items())
            hit = kern.cache[wkey] = (g, a)
        gemm += count * hit[0]
        total += count * hit[1]
    return gemm, total


def gpu_tokens(L: Layout, tr: TrainingSpec) -> float:
    """T = b·s/cp: the tokens of one micro-batch each GPU of a stage runs its layers on (module docstring)."""
    return L.micro_batch * tr.seq_len / L.cp


def head_time(kern: Kernels, prof: ModelProfile, L: Layout, tr: TrainingSpec, tokens: float) -> tuple[float, float]:
    """(forward, backward) seconds of the LM head GEMM and the cross entropy over V/tp logits. The head runs in
    BF16 under every FP8 recipe, unless ``tr.fp8_lm_head`` (Megatron-Core fp8_output_proj, MXFP8): then at the MXFP8
    GEMM rate, with Transformer Engine's quantisation of its operands priced as the layers' casts are (4 B per
    element: the T x h input in the forward pass, the T x V/tp logit gradient in the backward pass)."""
    h, v = prof.hidden, prof.vocab
    fp8 = tr.fp8_lm_head and kern.fp8
    g = kern.gemm(tokens, v / L.tp, h, h * v / L.tp, tr.weight_bytes, tr.grad_bytes, hi=not fp8)
    ce_bytes = CROSS_ENTROPY_BYTES[tr.cross_entropy]
    if tr.cross_entropy == "compiled" and L.tp > 1:
        ce_bytes = COMPILED_LOSS_PARALLEL_BYTES
    ce = kern.stream(ce_bytes * tokens * v / L.tp)
    cast_f = kern.stream(FP8_CAST_MXFP8_BYTES * tokens * h) if fp8 else 0.0
    cast_b = kern.stream(FP8_CAST_MXFP8_BYTES * tokens * v / L.tp) if fp8 else 0.0
    return g[0] + ce / 3.0 + cast_f, g[1] + 2.0 * ce / 3.0 + cast_b


# Embedding backward, per micro-batch: torch's embedding_dense_backward zero-fills a dense V/tp x h gradient (2 B)
# and scatter-adds the tokens' rows into it; the framework then adds it into the fp32 main-gradient buffer (read
# 2 B + 4 B, write 4 B; Megatron-Core DistributedDataParallel's main_grad.add_): 12 B per embedding element.
EMBEDDING_GRAD_BYTES = 12.0


def embedding_grad_time(kern: Kernels, prof: ModelProfile, L: Layout) -> float:
    """Seconds of the first stage's embedding backward over its V/tp x h table (memory-bound)."""
    return kern.stream(EMBEDDING_GRAD_BYTES * prof.vocab * prof.hidden / L.tp)


def microbatch_time(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, kern: Kernels,
                    overhead_s: float = 0.0, imbalance: float = 1.0,
                    moe_overhead_s: float = 0.0, host_expert_s: float = 0.0) -> tuple[float, float]:
    """(total, forward-only) seconds of one micro-batch's kernels on one GPU of stage ``st``: forward +
    backward + recomputation of every layer, the head on the last stage, ``overhead_s`` per layer,
    ``moe_overhead_s`` more per MoE layer (:func:`overhead_time`) and the routed experts' host-bound launches
    after the dispatcher's sync (:func:`moe_host_time`, ``host_expert_s`` per local expert)."""
    tokens = gpu_tokens(L, tr)
    fwd = bwd = rc = 0.0
    for j, count in prof.kind_counts(st.first, st.last):
        f, b, r = _layer_times(kern, prof, j, L, tr, tokens, imbalance)
        fwd += count * f
        bwd += count * b
        rc += count * r
    over = overhead_time(prof, st, overhead_s, moe_overhead_s)
    host_f = moe_host_time(prof, st, L, tr, kern, host_expert_s, imbalance, forward_only=True)
    host = _moe_forward_passes(L) * host_f   # forward passes only
    if st.is_first:
        bwd += embedding_grad_time(kern, prof, L)
    if st.is_last:
        hf, hb = head_time(kern, prof, L, tr, tokens)
        fwd, bwd = fwd + hf, bwd + hb
        if prof.mtp_layers:
            f, b, r = _layer_times(kern, prof, prof.kind_of[-1], L, tr, tokens, imbalance)
            fwd += prof.mtp_layers * (f + hf)
            bwd += prof.mtp_layers * (b + hb)
            rc += prof.mtp_layers * r
    return fwd + bwd + rc + over + host, fwd + over / 3.0 + host_f


# Share of the calibrated per-layer overheads (efficiency.layer_overhead_us, moe_layer_overhead_us) a run pays, by
# CUDA-graph mode (TrainingSpec.cuda_graphs). Those constants stand for time no kernel accounts for: the host
# launching kernels slower than the GPU runs them, and the MoE dispatcher's device-to-host sync. NVIDIA's
# DeepSeek-V3 GB200 guide (NVIDIA/Megatron-LM docs/discussions/deepseek-v3-gb200-optimization, 2025-11, sec. 2 and
# 2.3) measures that host overhead as the largest loss of an MXFP8 MoE step (partial CUDA graphs +8.6%, CPU-side
# work +10%) and, with the attention, router and EP preprocess graphed, still finds "only the routed experts part"
# host-bound; sec. 3.1: removing the device-host sync lets CUDA graphs cover "the entire model and completely
# eliminate CPU overhead" (at least +10% more on a proxy model). So:
#  - none: the whole overhead;
#  - partial: the whole overhead too (an approximation: which scopes a run graphs is not priced; the routed experts,
#    the host-bound part the guide names, stay eager in every partial scope list of the Bridge recipes);
#  - full_iteration: none of it (the replayed graph issues no host work; the GPU-side gap between graph nodes, a few
#    microseconds per kernel, is not priced: an approximation on the fast side).
# The same share scales the routed experts' priced host launches (:func:`moe_host_time`, the Estimator's
# host_expert_s): a full-iteration graph has no sync and issues no per-expert work from the host.
HOST_OVERHEAD_SHARE = {"none": 1.0, "partial": 1.0, "full_iteration": 0.0}


def moe_host_time(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, kern: Kernels,
                  host_expert_s: float, imbalance: float = 1.0, forward_only: bool = False) -> float:
    """Seconds per micro-batch on stage ``st`` that the GPU idles while the host issues the routed experts' work
    after the token dispatcher's device-to-host sync, summed over its MoE layers (the MTP layers on the last stage
    included).

    Megatron-Core's token dispatchers need the tokens per local expert on the host before they can size the
    all-to-all and the grouped GEMM's splits (``MoEAlltoAllTokenDispatcher.preprocess``: ``.to(torch.device("cpu"),
    non_blocking=True)`` then a stream sync at ``cuda_sync_point``; the flex dispatcher's DeepEP/HybridEP backends
    return the received counts to the host the same way), so the CUDA stream is empty when the host goes on. From
    then on the GPU runs the routed segment (permutation, the E_loc = experts/EP per-expert GEMMs and their
    activation, :data:`ROUTED_PARTS`) no faster than the host issues it. Per MoE layer and forward pass:

        exposed = max(0, E_loc · h_f − G_f)

    h_f: host seconds to issue one local expert's forward work (``HardwareSpec.host_us_per_expert_fwd``, measured);
    G_f: the routed segment's forward GPU seconds (:func:`layer_parts`, at the busiest rank's load). A forward pass
    that is re-run (full recomputation, or 'moe' among the recomputed modules) syncs and pays it again. The backward
    pass has no sync (the splits are kept on the host from the forward), so the host may run ahead there: not priced,
    an approximation on the fast side. NVIDIA's DeepSeek-V3 GB200 guide (NVIDIA/Megatron-LM
    docs/discussions/deepseek-v3-gb200-optimization, 2025-11, sec. 2.3 and 3.1) names exactly this: with attention,
    router and EP preprocess graphed, "only the routed experts part still has some CPU overhead", and the sync is
    what keeps the routed experts out of the graph. ``forward_only``: the first forward pass alone."""
    if host_expert_s <= 0.0:
        return 0.0
    tokens = gpu_tokens(L, tr)
    kinds = list(prof.kind_counts(st.first, st.last))
    if st.is_last and prof.mtp_layers:
        kinds.append((prof.kind_of[-1], prof.mtp_layers))
    total = 0.0
    for j, count in kinds:
        kind = prof.kinds[j]
        if not kind.is_moe:
            continue
        parts = _cached_parts(kern, prof, j, L, tr, tokens, imbalance)
        g_fwd = sum(parts[p][0] for p in ROUTED_PARTS if p in parts)
        total += count * max(0.0, kind.num_experts / L.ep * host_expert_s - g_fwd)
    return total if forward_only else _moe_forward_passes(L) * total


def _moe_forward_passes(L: Layout) -> int:
    """Forward passes of the routed experts per micro-batch: 2 where recomputation re-runs them (full, or 'moe'
    among the recomputed modules), else 1."""
    return 2 if L.recompute == "full" or "moe" in L.recompute_modules else 1


def overhead_time(prof: ModelProfile, st: Stage, overhead_s: float, moe_overhead_s: float) -> float:
    """Seconds per micro-batch that no kernel accounts for on stage ``st`` (forward + backward): ``overhead_s``
    for every layer (the MTP layers on the last stage included) and ``moe_overhead_s`` more for every MoE layer
    (its router, permutation and dispatch add kernel launches, and the all-to-all token dispatcher waits on
    the host for the tokens per expert before sizing its exchange: a device-to-host synchronisation in the
    forward and again in the backward pass; Megatron-Core ``MoEAlltoAllTokenDispatcher``)."""
    n_layers, n_moe = st.n_layers, st.sum(prof, "moe_layers")
    if st.is_last and prof.mtp_layers:
        n_layers += prof.mtp_layers
        n_moe += prof.mtp_layers if prof.kinds[prof.kind_of[-1]].num_experts else 0.0
    return n_layers * overhead_s + n_moe * moe_overhead_s


# Kernel class of each part of a layer (for reports: where the compute time goes).
KERNEL_CLASS = {"attn": "dense GEMM", "mla_up_proj": "dense GEMM", "mlp": "dense GEMM", "shared_experts": "dense GEMM",
                "router": "dense GEMM", "moe": "grouped GEMM (experts)", "core_attn": "attention core",
                "ssm_scan": "SSM / linear-attention scan",
                "norm": "memory-bound", "residual": "memory-bound", "rope": "memory-bound", "mlp_act": "memory-bound",
                "mlp_act_unfused": "memory-bound", "bda": "memory-bound", "bda_bias": "memory-bound",
                "shared_act": "memory-bound", "moe_act": "memory-bound", "permute": "memory-bound",
                "fp8_cast": "memory-bound", "grad_sum": "memory-bound", "grad_sum_eager": "memory-bound",
                "expert_grad_sum": "memory-bound", "batch_major": "memory-bound", "expert_bias": "memory-bound",
                "moe_act_clamp": "memory-bound", "rope_unfused": "memory-bound"}


def kernel_breakdown(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, kern: Kernels,
                     overhead_s: float = 0.0, imbalance: float = 1.0, moe_overhead_s: float = 0.0,
                     host_expert_s: float = 0.0) -> dict[str, float]:
    """Seconds of one micro-batch on stage ``st`` by kernel class (forward + backward + recomputation); the classes
    sum to :func:`microbatch_time`'s total, and the ``recomputation`` entry says how much of them is re-run."""
    tokens = gpu_tokens(L, tr)
    out: dict[str, float] = {}
    kinds = list(prof.kind_counts(st.first, st.last))
    if st.is_last and prof.mtp_layers:
        kinds.append((prof.kind_of[-1], prof.mtp_layers))
    for j, count in kinds:
        parts = _cached_parts(kern, prof, j, L, tr, tokens, imbalance)
        shares = recompute_shares(L, tr, parts)
        for name, (f, b) in parts.items():
            cls = KERNEL_CLASS[name]
            rc = f * shares.get(name, 0.0)
            out[cls] = out.get(cls, 0.0) + count * (f + b + rc)
            if rc:
                out["recomputation"] = out.get("recomputation", 0.0) + count * rc
    if st.is_first:
        out["memory-bound"] = out.get("memory-bound", 0.0) + embedding_grad_time(kern, prof, L)
    if st.is_last:
        hf, hb = head_time(kern, prof, L, tr, tokens)
        out["LM head + loss"] = (1 + prof.mtp_layers) * (hf + hb)
    out["per-layer overhead"] = overhead_time(prof, st, overhead_s, moe_overhead_s)
    host = moe_host_time(prof, st, L, tr, kern, host_expert_s, imbalance)
    if host:
        out["MoE host launches"] = host
    return out
