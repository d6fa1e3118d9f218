"""Data-parallel communication: gradient reduction and ZeRO/FSDP parameter gathers (Rajbhandari et al.
2020, arXiv 1910.02054 sec. 7: ZeRO-1/2 move 2Ψ per step like an all-reduce, ZeRO-3 3Ψ).

Groups: dense weights over dp·cp ranks tp apart (Megatron's dp-cp group); expert weights over edp ranks,
ep·etp apart in the stage's expert mesh. HSDP shards over ``hsdp_shard`` ranks and all-reduces the shards
across the replicas.

    ZeRO-0:   AR(grads)                         once per step
    ZeRO-1/2: RS(grads) + AG(weights)           once per step (Megatron distributed optimizer)
    ZeRO-3:   per micro-batch AG(weights) for forward and again for backward, RS(grads) (FSDP2 default)

Overlap (``training.dp_comm_overlap``: Megatron --overlap-grad-reduce / --overlap-param-gather; FSDP2's
prefetch). Exposed traffic is what does not fit in the compute that can hide it:

  * ZeRO-0/1/2: gradients are reduced in buckets as the last micro-batch's backward produces them, and the updated
    weights gathered bucket by bucket under the first micro-batch's forward. The last gradient bucket and the first
    weight bucket cannot hide (nothing is left to compute after, or before, them); the rest hides behind that
    backward (forward). Bucket: max(40M, 1M·dp·cp) parameters (Megatron-Core's default,
    NVIDIA/Megatron-LM megatron/training/training.py ``ddp_config.bucket_size = max(40000000, 1000000 *
    mpu.get_data_parallel_world_size(with_context_parallel=True))``), a share f = min(1, bucket / the
    stage's parameters):

        exposed = f·T + max(0, (1 − f)·T − W)        T: the reduction (gather), W: the backward (forward)

    Megatron-Core r0.8.0 (NVIDIA/Megatron-LM@baf94af3 megatron/core/optimizer/distrib_optimizer.py) gathers that
    way: ``zero_grad`` dispatches the first bucket's all-gather and each forward pre-hook waits for its bucket and
    only then dispatches the next (``_finish_param_sync_helper``: one in flight, "to ensure that the communication
    kernels don't head-of-line block the compute kernels since we run with CUDA_DEVICE_MAX_CONNECTIONS=1"); the
    gradients are reduced under the last micro-batch's backward only (``no_sync`` for the others).

  * ZeRO-3 / FSDP: every micro-batch gathers each layer's weights before its forward and again before its
    backward, and reduce-scatters its gradients after; one layer's gather is prefetched under the previous layer's
    compute. The first layer's gather and the last layer's reduce-scatter are exposed; the rest hides behind the
    micro-batch's forward + backward, its recomputation included (f = 1 / the stage's layers, FSDP2 wraps each
    transformer block):

        exposed per micro-batch = f·(AG + RS) + max(0, (1 − f)·(2·AG + RS) − W_mb)

    Megatron-FSDP runs the same schedule (NVIDIA/Megatron-LM@1e057005, the commit of the Megatron-MoE-ModelZoo
    Qwen3-235B FSDP row, megatron/core/distributed/custom_fsdp/fully_sharded_data_parallel.py; the row's flags,
    yanring/Megatron-MoE-ModelZoo@a35c74b3 best-practice/qwen3/run_235b.sh: --use-custom-fsdp
    --data-parallel-sharding-strategy optim_grads_params, full recompute):
      - gathers every micro-batch: ``_post_forward`` releases each TransformerLayer's weights after its forward
        and ``_post_backward`` after its backward;
      - reduce-scatters every micro-batch: ``grad_reduce_every_bprop`` is true for optim_grads and
        optim_grads_params, and ``no_sync`` only clears ``is_last_microbatch`` (its docstring: "for grads shard
        mode there will actually always be gradient sync happening"), so gradient accumulation does not defer it;
      - with full recomputation, two gathers, not three: ``_root_pre_backward`` marks every unit PRE_BACKWARD, so
        the recomputed forward's pre-forward hook gathers once without forward prefetch and its post-forward keeps
        the weights for the backward (docs/source/api-guide/custom_fsdp.md sec. 4.1 at the same commit);
      - prefetch: ``suggested_AG_prefetch_size`` = 2 x the mean parameters of an FSDP unit (the layer and the next,
        in forward order, then backward order from ``_pre_backward``); the reduce-scatter runs on its own side
        stream (``GradReducePipeline(cuda_stream=side_stream_for_buffer_copy_and_grad_accum)``), beside the next
        layer's recomputation and backward: the window W_mb counts recomputation;
      - dense and expert weights are separate parameter groups with their own buffers and groups (``dp_cp_group``
        and ``expt_dp_group``): sharded over dp·cp and edp, priced group by group below.
    Gradients are reduced in ``TrainingSpec.grad_dtype``. Megatron-LM reduces them in fp32 unless
    --grad-reduce-in-bf16 (megatron/training/arguments.py@1e057005 sets accumulate_allreduce_grads_in_fp32 for bf16
    when main_grads_dtype is fp32, and custom_fsdp/param_and_grad_buffer.py makes the main_grad_buffer float32;
    r0.8.0, arguments.py@baf94af3 lines 299-305, sets it for every bf16 run): the published rows are priced with
    bf16 gradients (autopar.measure.validation), which that code does not do; an open discrepancy (README
    'Accuracy').

  * ZeRO-3 / FSDP under PP with ``training.pp_fsdp = 'per_step'`` (torchtitan with torch.distributed.pipelining:
    pytorch/torchtitan@9dec370 parallelize_llama.py apply_fsdp sets reshard_after_forward = False under PP, "to
    avoid per-microbatch all-gathers"; torch/distributed/pipelining/stage.py backward_maybe_with_nosync turns
    gradient sync and resharding off for every micro-batch's backward and runs FSDP's post_backward by hand after
    the last one): the weights are gathered once per step, under the first micro-batch's forward, and the
    gradients reduce-scattered once, after the stage's last backward, with nothing of the stage left to hide them:

        exposed per step = f·AG + max(0, (1 − f)·AG − W_fwd) + RS

  * Each layer's (bucket's) collective pays its own latency (Network's alpha term): ``units`` per micro-batch
    under FSDP, one per bucket otherwise; this is what makes a large DP group cost more than its bytes.
  * Bandwidth is shared: the window W is what is left of the compute after the same link's other traffic in that
    time (TP collectives on NVLink, the EP all-to-all and CP ring on whichever link their groups span, forward and
    backward): W = max(0, compute − busy(link)), link = the network when the group spans NVLink domains.

PyTorch FSDP2 as torchtitan runs it (``training.dp_impl`` fsdp2):

  * Gradients are reduce-scattered in fp32 (``TrainingSpec.grad_bytes``, fp32 under fsdp2: torchtitan@9dec370's
    mixed_precision_reduce 'float32'), twice the bytes of a bf16 reduction.
  * Each all-gather is copied out of the flat gather buffer into the unsharded parameters by
    ``torch.split_with_sizes_copy`` on the compute stream (pytorch/pytorch@01d66d21
    torch/distributed/_composable/fsdp/_fsdp_collectives.py ``foreach_all_gather_copy_out``, called from
    ``FSDPParamGroup.wait_for_unshard`` on the current stream): it reads and writes the gathered parameters once,
    2·w bytes per parameter per gather at the HBM rate, time the compute stream spends and nothing hides:

        copy-out = gathers · 2 · w · P / (hbm_tbps · 1e12 · kernel_model.hbm)

    The copy-in (``torch._foreach_copy_`` of the local shard) and the reduce-scatter copy-in (``torch.cat`` of the
    bf16 gradients into the fp32 buffer) run on FSDP2's own streams beside the compute: not priced (they take HBM
    bandwidth from it, an approximation).
  * Under PP with ``pp_fsdp = 'per_step'`` (above): one gather per step, so one copy-out.
  * ZeRO-1/2 under FSDP2 (reshard_after_forward False, as ``--emit torchtitan`` writes them): the forward gather
    stays for the backward, but FSDP2 still reshards after each backward and torchtitan reduce-scatters every
    micro-batch (it leaves gradient sync on across accumulation steps, torchtitan 0.3.0 trainer): per micro-batch one
    gather and one reduce-scatter per layer, exposed as ZeRO-3's; under PP with ``pp_fsdp = 'per_step'``
    one of each per step, as ZeRO-3's there (torchtitan's PP rows read as ZeRO-1, fp32 gradients).

Overlap off: everything is exposed. The hiding windows are the stage's kernels of a micro-batch: W_fwd its forward,
W_bwd its backward with the recomputation (``Estimator.stage_tail``: recomputation runs inside the backward while
the reductions and prefetched gathers run on their own streams). Approximations: gathers and reduce-scatters share
one window per micro-batch (Megatron-FSDP's backward prefetch of layer i−1 is issued at layer i's pre-backward, after
its recomputation, so a gather's own window is a little shorter than the reduce-scatter's), and the expert and dense
buffers are bucketed separately.
"""

from __future__ import annotations

from autopar.cost._select import maximum, may_hold, where
from autopar.cost.collectives import Network
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import Layout
from autopar.specs.training import TrainingSpec

# Megatron-Core's default gradient bucket: max(BUCKET_MIN, BUCKET_PER_RANK · dp·cp) parameters (docstring).
BUCKET_MIN_PARAMS = 40_000_000
BUCKET_PER_RANK_PARAMS = 1_000_000


def _groups(L: Layout) -> list[tuple[str, int, int]]:
    """(which params, group size, stride) of the sharding groups."""
    dense_n, dense_stride = L.dp * L.cp, L.tp
    exp_n, exp_stride = L.edp, L.ep * L.etp
    if L.hsdp_shard:
        dense_n, exp_n = min(dense_n, L.hsdp_shard), min(exp_n, L.hsdp_shard)
    return [("dense", dense_n, dense_stride), ("expert", exp_n, exp_stride)]


def dp_time_per_step(dense: float, expert: float, L: Layout, tr: TrainingSpec, hw: HardwareSpec, net: Network,
                     t_fwd_mb: float, t_bwd_mb: float, units: int = 1,
                     busy: dict[str, float] | None = None) -> tuple[float, float]:
    """(exposed seconds, total seconds) of data-parallel traffic per step for one GPU holding ``dense`` and
    ``expert`` parameters (before sharding) in ``units`` layers. ``busy``: seconds per micro-batch each link
    ('nvlink', 'network') carries other traffic. ``L.zero_stage``, ``L.grad_accum`` and the compute times may be
    broadcastable numpy arrays (the search's tables): the result is then elementwise."""
    M = L.grad_accum
    z = L.zero_stage
    # which ZeRO branches the result can read: with a plain-number zero stage only the chosen one is priced (the
    # other is a placeholder that ``where`` never picks); with an array both, elementwise
    need3, need0, need12 = may_hold(z >= 3), may_hold(z == 0), may_hold((z >= 1) & (z < 3))
    on = tr.dp_comm_overlap
    busy = busy or {}
    units = max(1, units)
    f_unit = 1.0 / units
    fsdp2 = tr.dp_impl == "fsdp2"
    per_step = L.pp > 1 and tr.pp_fsdp == "per_step"   # one gather and one reduce-scatter per step (docstring)
    hbm = hw.hbm_tbps * 1e12 * hw.kernel_model.hbm   # B/s of memory-bound kernels
    total = exposed = 0.0
    for (group, n, stride), params in zip(_groups(L), (dense, expert)):
        if params == 0:
            continue
        g_bytes, w_bytes = params * tr.grad_bytes, params * tr.param_gather_bytes   # FP8 under fp8_param_gather
        replicate = (L.dp * L.cp if group == "dense" else L.edp) // n if L.hsdp_shard else 1
        copy_out = 2.0 * w_bytes / hbm if fsdp2 else 0.0   # one gather's copy-out: read + write (docstring)
        load = busy.get(net.link(n, stride), 0.0)
        w_fwd, w_bwd = maximum(t_fwd_mb - load / 3.0, 0.0), maximum(t_bwd_mb - 2.0 * load / 3.0, 0.0)
        tot3 = exp3 = tot_f2 = exp_f2 = 0.0   # placeholders of branches not priced (above)
        if need3 or (fsdp2 and n > 1 and need12):   # FSDP2's ZeRO-1/2 reads ZeRO-3's gathers
            # ZeRO-3 / FSDP: per micro-batch, one gather (forward), one gather and one reduce-scatter (backward) per
            # layer
            ag, rs = _times(net, "all_gather", w_bytes, n, stride, units), _times(net, "reduce_scatter", g_bytes, n,
                                                                                   stride, units)
            if per_step:
                tot3 = ag + rs
                exp3 = f_unit * ag + _exposed((1.0 - f_unit) * ag, w_fwd) + rs if on else tot3
            else:
                per_mb = 2 * ag + rs
                tot3 = M * per_mb
                exp3 = M * (f_unit * (ag + rs) + _exposed((1.0 - f_unit) * per_mb, w_fwd + w_bwd)) if on else tot3
            if fsdp2 and n > 1:
                # copy-out of every gather on the compute stream: twice per micro-batch, or once per step under PP
                gathers = 1.0 if per_step else 2.0 * M
                tot3, exp3 = tot3 + gathers * copy_out, exp3 + gathers * copy_out
                # ZeRO-1/2 as FSDP2 runs them (reshard_after_forward False, resharded after each backward, gradients
                # reduce-scattered every micro-batch: torchtitan leaves gradient sync on across accumulation steps):
                # per micro-batch one gather and one reduce-scatter per layer; under PP per step, ZeRO-3's own
                if per_step:
                    tot_f2, exp_f2 = tot3, exp3
                else:
                    once = ag + rs
                    tot_f2 = M * once + M * copy_out
                    exp_f2 = (M * (f_unit * once + _exposed((1.0 - f_unit) * once, w_fwd + w_bwd)) if on
                              else M * once) + M * copy_out
        # bucketed ZeRO-0/1/2 (and the HSDP replica all-reduce): one collective per bucket with overlap, one for
        # everything without (Megatron-Core: bucket_size None when --overlap-grad-reduce is off)
        f_b = min(1.0, max(BUCKET_MIN_PARAMS, BUCKET_PER_RANK_PARAMS * n) / params) if on else 1.0
        buckets = -(-1.0 // f_b)   # ceil(1 / f_b)
        if replicate > 1 and need3:  # HSDP: all-reduce the gradient shards across replicas once per step
            t = _times(net, "all_reduce", g_bytes / n, replicate, stride * n, buckets)
            tot3, exp3 = tot3 + t, exp3 + (_bucketed(t, f_b, w_bwd) if on else t)
        # ZeRO-0: all-reduce the gradients; ZeRO-1/2: reduce-scatter them and all-gather the updated weights
        tot12 = exp12 = 0.0
        if n > 1 and (need0 or need12):
            t_grad = where(z == 0, _times(net, "all_reduce", g_bytes, n, stride, buckets) if need0 else 0.0,
                           _times(net, "reduce_scatter", g_bytes, n, stride, buckets) if need12 else 0.0)
            t_param = where(z == 0, 0.0, _times(net, "all_gather", w_bytes, n, stride, buckets) if need12 else 0.0)
            tot12 = t_grad + t_param
            exp12 = _bucketed(t_grad, f_b, w_bwd) + _bucketed(t_param, f_b, w_fwd) if on else tot12
            if fsdp2:   # ZeRO-1/2 as FSDP2 without resharding after forward (above); ZeRO-0 stays the all-reduce
                tot12, exp12 = where(z == 0, tot12, tot_f2), where(z == 0, exp12, exp_f2)
        total = total + where(z >= 3, tot3, tot12)
        exposed = exposed + where(z >= 3, exp3, exp12)
    return exposed, total


def _times(net: Network, op: str, nbytes, n: int, stride: int, count: float):
    """``count`` collectives moving ``nbytes`` in all: the bandwidth term once, the latency term per collective
    (each layer's or bucket's collective pays its own ring latency)."""
    c, t0 = net.coefficients(op, n, stride)
    return nbytes * c + count * t0


def _bucketed(t, f, window):
    """f·t + max(0, (1 − f)·t − window): the one bucket that cannot hide, and what the rest leaves over."""
    return f * t + _exposed((1.0 - f) * t, window)


def _exposed(comm, hiding):
    """max(0, comm − hiding), elementwise for arrays."""
    return where(comm > hiding, comm - hiding, 0.0)
