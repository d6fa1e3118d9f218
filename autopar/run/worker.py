"""Per-rank entry point of a profiling run: build the model, apply the layout, train a few steps, report.

Launch by hand with torch's launcher (one process per GPU, or per CPU "rank" with gloo)::

    torchrun --nproc-per-node N -m autopar.run.worker --spec spec.json

``N`` must equal the layout's world size (pp·dp·cp·tp). ``spec.json`` holds::

    {"model": {...ModelSpec...}, "layout": {...resolved Layout...}, "training": {...TrainingSpec...},
     "steps": 4, "warmup": 1, "seed": 0, "backend": "auto", "result_dir": "out/",
     "lr": 3e-4, "lr_warmup_steps": null, "dtype": "auto"}

``autopar profile spec --model ... --gpus N [layout flags] -o spec.json`` writes one and prints the command.
Each rank writes ``rank<R>.json`` (and ``rank<R>.pid``) into ``result_dir`` (default: the spec's folder);
``autopar.run.launch`` reads them. ``python -m autopar.run.worker --spec spec.json`` without torchrun
runs a world of one.

Order of application on each (virtual) pipeline stage, as torchtitan: build + deterministic init ->
context parallel -> expert parallel -> tensor/sequence parallel -> recompute -> FSDP / ZeRO.

Numbers (precision.py): on CUDA (NCCL) Megatron-LM's scheme: weights in the training spec's weight dtype
(bf16), fp32 main weights and Adam moments in the optimizer, sharded as the ZeRO stage says. On the CPU (gloo)
fp32 weights by default ("dtype": "bf16" runs the GPU scheme on the CPU). The learning rate warms up linearly
to "lr" over "lr_warmup_steps" steps (default: a quarter of the steps), then stays constant; the synthetic
task (model.synthetic_batch) is learnable, so the loss falls.

Memory per rank: the overall peak (CUDA ``torch.cuda.max_memory_allocated``; CPU the growth of the process's
peak RSS, ``resource.getrusage(RUSAGE_SELF).ru_maxrss``, from just after process-group init to the end), and
term by term: weights, gradients and optimizer state read from the tensors this rank stores, and on CUDA
the forward/backward peak above what was allocated when the step began (activations, plus the gradients and
FSDP-gathered weights that exist at that moment).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

LR = 3e-4                 # AdamW peak learning rate: Llama 3 8B's (Llama 3 paper, arXiv 2407.21783, sec. 3.4.1);
                          # betas (0.9, 0.95), weight decay 0.1
FAULT_ENV = "AUTOPAR_PROFILE_FAULT"   # test-only: "crash:<rank>", "hang:<rank>", "oom:<rank>" or "kill:<rank>"
# Test-only: "sgd" trains with plain SGD (lr SGD_LR). Adam is blind to a constant gradient scale (sum instead of
# mean over replicas), SGD is not, so the loss-equivalence tests run some layouts with it.
OPTIMIZER_ENV = "AUTOPAR_PROFILE_OPTIMIZER"
SGD_LR = 0.5


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20     # KiB on Linux


def _inject_fault(rank: int) -> None:
    """Test-only hook: make one rank crash, hang, run out of memory or SIGKILL itself after process-group init."""
    what = os.environ.get(FAULT_ENV, "")
    if not what:
        return
    kind, _, who = what.partition(":")
    if int(who or 0) != rank:
        return
    if kind == "hang":
        time.sleep(3600)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "oom":
        import torch
        raise torch.OutOfMemoryError("injected out-of-memory (test)")
    raise RuntimeError("injected crash (test)")


def classify(err: BaseException) -> str:
    """The RunResult.failure string of an exception: 'oom' (torch's out-of-memory error, Python's MemoryError,
    or the CPU allocator's "can't allocate memory" RuntimeError), 'backend: ...' or 'crash: ...'."""
    import torch
    import torch.distributed as dist
    msg = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
    if isinstance(err, (torch.OutOfMemoryError, MemoryError)) or "can't allocate memory" in str(err):
        return "oom"
    if isinstance(err, dist.DistBackendError) or any(w in msg for w in ("Gloo", "gloo", "NCCL", "nccl")):
        return f"backend: {msg}"
    return f"crash: {type(err).__name__}: {msg}"


def approximations(model_spec, layout) -> list[str]:
    """What this runner does differently from the architecture / layout it was given (the token mixers' part from
    autopar.run.mixers.approximations)."""
    from autopar.run.mixers import approximations as mixer_approximations
    notes = []
    if model_spec.mla is not None:
        notes.append("MLA run as multi-head attention with the same head counts (no low-rank projections)")
    if model_spec.sliding_window is not None:
        notes.append("sliding-window layers run full causal attention")
    if model_spec.mtp_layers:
        notes.append("MTP modules not built")
    if model_spec.is_moe:
        notes.append("MoE: softmax top-k router, dropless, no auxiliary loss; routed experts not FSDP-sharded")
    if model_spec.mla is None and model_spec.kv_heads < layout.tp:
        notes.append(f"KV heads copied {layout.tp // model_spec.kv_heads}x to reach tp={layout.tp} "
                     "(copies' gradients summed, so they stay equal)")
    return notes + mixer_approximations(model_spec)


def _cp_description(model_spec) -> str:
    """How context parallelism ran: ring attention for softmax-attention mixers, state passing for linear/SSM ones."""
    mixers = [mx for i in range(model_spec.num_layers) for mx in model_spec.mixers_of(i)]
    parts = (["ring attention"] if any(not mx.is_linear for mx in mixers) else []) \
        + (["state passing (linear/SSM)"] if any(mx.is_linear for mx in mixers) else [])
    return ", ".join(parts) + ", zig-zag split"


def precision_notes(training, wdtype) -> list[str]:
    """What the runner's number formats leave out of the training spec's."""
    import torch
    notes = []
    if wdtype == torch.float16:
        notes.append("fp16 weights without loss scaling")
    if training.precision not in ("bf16", "fp16", "fp32") and wdtype != torch.float32:
        notes.append(f"precision {training.precision} not applied: the GEMMs run in {str(wdtype).split('.')[-1]}")
    return notes


def build_stages(model_spec, layout, meshes, seq_len: int, seed: int, device, wdtype=None, grad_dtype: str = "fp32"):
    """This pipeline rank's (virtual) stages, built, initialised and parallelised, in torchtitan's order.
    ``wdtype``: the weights' dtype (precision.py); FSDP2 parameters stay fp32 shards and are gathered in it.
    Returns (plans, modules, fsdp_wrapped, recomputed module names)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from autopar.run import context_parallel, expert_parallel, fsdp, pipeline, recompute, tensor_parallel
    from autopar.run.model import GroupedExperts, Transformer, init_weights
    from autopar.run.precision import TORCH_DTYPES

    wdtype = wdtype or torch.float32
    sharded = fsdp.applies(meshes, layout)
    mp = None
    if sharded and wdtype != torch.float32:
        mp = MixedPrecisionPolicy(param_dtype=wdtype, reduce_dtype=TORCH_DTYPES[grad_dtype])
    kv_heads = model_spec.kv_heads if model_spec.mla is not None else max(model_spec.kv_heads, layout.tp)
    tie = model_spec.tie_embeddings and layout.pp == 1     # across stages: two copies kept equal (pipeline.py)
    plans = pipeline.stage_plans(layout, model_spec.num_layers, meshes.local_rank("pp"))
    modules, wrapped, recomputed = [], False, []
    for plan in plans:
        m = Transformer(model_spec, seq_len, plan.layer_ids, plan.first, plan.last, kv_heads=kv_heads, tie=tie)
        init_weights(m, seed)
        m.to(device)
        for mod in (m.modules() if sharded else [m]):   # under FSDP only the (unsharded) routed experts
            if not sharded or isinstance(mod, GroupedExperts):
                mod.to(wdtype)                          # (FSDP2 gathers the others in wdtype: ``mp``)
        context_parallel.apply_context_parallel(m, meshes.world["cp"], seq_len)
        expert_parallel.apply_expert_parallel(m, meshes)
        tensor_parallel.apply_tensor_parallel(m, meshes.world["tp"], layout.sp)
        recomputed = recompute.apply_recompute(m, layout)
        wrapped = fsdp.apply_data_parallel(m, meshes, layout, mp)
        modules.append(m)
    return plans, modules, wrapped, recomputed


def train(spec: dict, rank: int) -> dict:
    """Run the layout on this rank; returns this rank's result dict. The process group must exist."""
    import torch
    import torch.distributed as dist

    from autopar.run import expert_parallel, fsdp, pipeline, precision, tensor_parallel
    from autopar.run.context_parallel import shard_sequence
    from autopar.run.mesh import applied_sizes, build_meshes
    from autopar.run.model import loss_fn, synthetic_batch
    from autopar.specs import Layout, ModelSpec, TrainingSpec

    model_spec = ModelSpec.model_validate(spec["model"])
    layout = Layout.model_validate(spec["layout"])
    training = TrainingSpec.model_validate(spec["training"])
    steps, seed = int(spec.get("steps", 4)), int(spec.get("seed", 0))
    S, B, V = training.seq_len, training.global_batch, model_spec.vocab_size
    cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.manual_seed(seed)
    base_rss = _rss_gib()
    wdtype = precision.weight_dtype(spec.get("dtype", "auto"), training.weight_dtype, cuda)
    peak_lr = float(spec.get("lr") or LR)
    lr_warmup = spec.get("lr_warmup_steps")
    lr_warmup = max(1, steps // 4) if lr_warmup is None else int(lr_warmup)

    meshes = build_meshes(layout, device.type)
    _inject_fault(rank)
    plans, modules, wrapped, recomputed = build_stages(model_spec, layout, meshes, S, seed, device, wdtype,
                                                       training.grad_dtype)
    kv_group = tensor_parallel.kv_replica_group(meshes.world["tp"], model_spec.kv_heads) \
        if model_spec.mla is None else None
    tied_group = pipeline.tied_embedding_group(meshes.world.mesh, model_spec.tie_embeddings)
    params = [p for m in modules for p in m.parameters()]
    kind = os.environ.get(OPTIMIZER_ENV, "adamw")
    if kind == "sgd":
        peak_lr = SGD_LR
    opt = precision.MainParamOptimizer(params, kind=kind, lr=peak_lr)
    schedule = pipeline.build_schedule(modules, plans, layout, meshes.world["pp"], device) if layout.pp > 1 else None
    mem = {"weights": opt.weight_bytes(), "grads": 0, "optimizer": 0, "fwd_bwd_peak": None}

    dp, dp_rank = meshes.size("dp"), meshes.local_rank("dp")
    per_dp, mbs, ga = B // dp, layout.micro_batch, layout.grad_accum
    times, losses, peak_bytes = [], [], 0
    for step in range(steps):
        # The same global batch as the single-process run; this DP rank's rows, this CP rank's tokens.
        data = synthetic_batch(step, B, S, V, seed)[dp_rank * per_dp:(dp_rank + 1) * per_dp]
        inputs = shard_sequence(data[:, :-1], meshes.world["cp"]).to(device)
        labels = shard_sequence(data[:, 1:], meshes.world["cp"]).to(device)
        opt.set_lr(precision.warmup_lr(step, peak_lr, lr_warmup))
        if cuda:
            torch.cuda.synchronize()
            at_start = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        if schedule is not None:         # the schedule splits micro-batches and scales grads by 1/ga
            loss = pipeline.pipeline_step(schedule, plans, inputs, labels)
        else:
            model, total = modules[0], torch.zeros((), device=device)
            for i in range(ga):
                if wrapped:              # FSDP reduce-scatters once, after the last micro-batch
                    model.set_requires_gradient_sync(i == ga - 1)
                mb_loss = loss_fn(model(inputs[i * mbs:(i + 1) * mbs]), labels[i * mbs:(i + 1) * mbs]) / ga
                mb_loss.backward()
                total += mb_loss.detach()
            loss = float(total)
        for m in modules:                # hand-written gradient reductions (each a no-op when not needed)
            tensor_parallel.sync_kv_replica_grads(m, kv_group)
            pipeline.sync_tied_embedding_grads([m], tied_group)
            if not wrapped:
                fsdp.allreduce_grads(m, meshes)
            expert_parallel.sync_expert_grads(m, meshes)
        if cuda:
            fwd_bwd = torch.cuda.max_memory_allocated() - at_start
            mem["fwd_bwd_peak"] = max(mem["fwd_bwd_peak"] or 0, fwd_bwd)
        mem["grads"] = max(mem["grads"], opt.grad_bytes())
        opt.step()
        opt.zero_grad()
        if cuda:
            torch.cuda.synchronize()
            peak_bytes = max(peak_bytes, torch.cuda.max_memory_allocated())
        times.append(time.perf_counter() - t0)
        losses.append(float("nan") if loss is None else loss)
        print(f"[rank {rank}] step {step + 1}/{steps} {times[-1]:.3f}s"
              + (f" loss {loss:.5f}" if loss is not None else ""), file=sys.stderr, flush=True)

    # Global loss = mean over the dp·cp ranks of the last stage; step time = slowest rank.
    loss_t = torch.tensor(losses, dtype=torch.float64, device=device).nan_to_num(0.0)
    dist.all_reduce(loss_t, group=meshes.dp_cp.get_group())
    loss_t /= meshes.dp_cp.size()
    time_t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(time_t, op=dist.ReduceOp.MAX)
    holder = (meshes.local_rank("pp") == layout.pp - 1 and meshes.dp_cp.get_local_rank() == 0
              and meshes.local_rank("tp") == 0)
    mem["optimizer"] = opt.optimizer_bytes()
    if cuda:
        peak, how = max(peak_bytes, torch.cuda.max_memory_allocated()) / 2**30, "torch.cuda.max_memory_allocated"
    else:
        peak, how = max(0.0, _rss_gib() - base_rss), "peak RSS growth after process-group init (ru_maxrss)"
    applied = applied_sizes(meshes)
    dist.barrier()      # nobody tears the groups down while a peer still talks (gloo aborts otherwise)
    applied.update({
        "vpp": len(plans) if layout.pp > 1 else 1, "sp": bool(layout.sp and layout.tp > 1),
        "data_parallel": fsdp.describe(layout, meshes), "recompute": recomputed,
        "schedule": pipeline.schedule_name(layout), "micro_batch": mbs, "grad_accum": ga,
        "stage_layers": [p.layer_ids for p in plans], "backend": dist.get_backend(),
        "dtype": precision.dtype_name(wdtype),
        "memory_scheme": precision.describe(wdtype, training.grad_dtype, wrapped, layout.zero_stage, cuda,
                                              model_spec.is_moe),
        "lr": f"AdamW peak {peak_lr:g}, linear warm-up over {lr_warmup} steps, then constant"
        if kind != "sgd" else f"SGD {peak_lr:g} (test), warm-up over {lr_warmup} steps",
        "context_parallel": _cp_description(model_spec) if layout.cp > 1 else "none",
    })
    return {"rank": rank, "ok": True, "failure": None, "step_times_s": time_t.tolist(),
            "losses": loss_t.tolist() if holder else [], "loss_rank": holder, "peak_mem_gib": peak,
            "mem_method": how, "applied": applied,
            "mem_terms_gib": {k: None if v is None else v / 2**30 for k, v in mem.items()},
            "approximations": approximations(model_spec, layout) + precision_notes(training, wdtype),
            "tokens_per_step": B * S}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autopar.run.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, type=Path, help="JSON run spec (see the module docstring)")
    args = parser.parse_args(argv)
    from autopar.run.lifetime import die_with_parent
    die_with_parent()           # torchrun (or whoever started this rank) dies: this rank dies too
    spec = json.loads(args.spec.read_text())
    rank = int(os.environ.get("RANK", "0"))
    out_dir = Path(spec.get("result_dir") or args.spec.parent)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{rank}.pid").write_text(str(os.getpid()))
    code = 0
    try:
        import torch
        import torch.distributed as dist
        backend = spec.get("backend", "auto")
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            need, have = int(os.environ.get("LOCAL_WORLD_SIZE", "1")), torch.cuda.device_count()
            if need > have:
                raise RuntimeError(f"NCCL needs one GPU per rank: {need} ranks on this node, {have} GPUs")
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if "MASTER_ADDR" not in os.environ:   # plain `python -m ...`: a world of one
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29511", RANK="0", WORLD_SIZE="1")
        dist.init_process_group(backend, timeout=timedelta(seconds=float(spec.get("timeout_s", 600))))
        try:
            result = train(spec, rank)
        finally:
            dist.destroy_process_group()
    except BaseException as err:  # noqa: BLE001 - every failure becomes a result, then a non-zero exit
        traceback.print_exc()
        result = {"rank": rank, "ok": False, "failure": classify(err), "time": time.time()}
        code = 1
    tmp = out_dir / f"rank{rank}.json.tmp"
    tmp.write_text(json.dumps(result))
    tmp.replace(out_dir / f"rank{rank}.json")
    return code


if __name__ == "__main__":
    status = main()
    # Leave without running C++ static destructors: a torch/gloo background thread torn down at interpreter
    # exit sometimes aborts the process ("terminate called without an active exception") after the result
    # was already written, which torchrun would report as a failed run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
