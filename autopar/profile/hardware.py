"""``autopar profile hardware``: measure GEMM throughput and collective bus bandwidth, write a hardware file.

What is measured
  * GEMM TFLOP/s per precision, at the model's QKV / attention-output / MLP shapes for ``tokens`` rows
    (micro-batch x sequence length) when a model is given, else at a standard square set. The per-precision
    figure is total FLOPs / total time over the shapes (a FLOP-weighted harmonic mean, the way a step's math
    mixes them).
  * Memory copy bandwidth (``hbm_tbps`` of a CPU description): bytes read + written per second of a large copy.
  * all-reduce, all-gather, reduce-scatter, all-to-all and send/recv **bus bandwidth** by message size and group
    size with the nccl-tests definitions (NVIDIA nccl-tests, doc/PERFORMANCE.md):
        algbw = S / t                     S: the message size below, t: time of one operation
        busbw = algbw * factor            all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all (n-1)/n;
                                          send/recv 1
    S is the all-reduce buffer, the all-gather *output*, the reduce-scatter *input*, the per-rank all-to-all
    buffer and the point-to-point message (each rank sends S to the next rank of a ring and receives S).

How
  Each group size runs as its own set of ``n`` Python processes (``python -m autopar.profile.hardware
  --worker``; gloo on CPU, NCCL on CUDA) under one timeout; every process started is waited for or killed
  before the call returns, so no process outlives it. Rank 0 streams one JSON line per measurement to a
  results file, which the parent prints as a table as it goes. Only one machine is driven by the launcher:
  cross-node bandwidth needs the worker started by ``torchrun`` on each node (see ``_worker_main``) and the
  result merged with ``--results-from``.

torch is imported inside functions only: planning code that imports this module never loads it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from autopar.errors import AutoparInputError
from autopar.specs.hardware import HardwareSpec, KernelModel, MeasuredCollectives
from autopar.specs.model import ModelSpec

MIB = 2 ** 20
GIB = 2 ** 30
OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
OP_LABELS = {"all_reduce": "AR", "all_gather": "AG", "reduce_scatter": "RS", "all_to_all": "A2A",
             "send_recv": "P2P"}
_ELEM_BYTES = 4  # collectives move fp32 elements
_LATENCY_PROBE_BYTES = 4096  # small all-reduce whose time gives the per-step latency (alpha)
_REPO_ROOT = Path(__file__).resolve().parents[2]


class ProfileError(RuntimeError):
    """A measurement could not be made (a worker failed or timed out)."""


# ---- the nccl-tests definitions -------------------------------------------------------------------------
def bus_factor(op: str, n: int) -> float:
    """busbw / algbw for a collective over ``n`` ranks (nccl-tests doc/PERFORMANCE.md).

    all-reduce moves 2(n-1)/n of the buffer per rank (reduce-scatter then all-gather); all-gather,
    reduce-scatter and all-to-all move (n-1)/n; a point-to-point send moves the whole message."""
    if n < 1:
        raise ValueError(f"group size must be positive (got {n})")
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op == "send_recv":
        return 1.0
    raise ValueError(f"unknown collective '{op}' (choose from {', '.join(OPS)})")


def algbw_gbps(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth, GB/s (1e9 B/s): message bytes per second of one operation."""
    return nbytes / seconds / 1e9


def busbw_gbps(op: str, n: int, nbytes: float, seconds: float) -> float:
    """Bus bandwidth, GB/s: algbw times the op's factor, comparable with link bandwidth."""
    return algbw_gbps(nbytes, seconds) * bus_factor(op, n)


def group_sizes(world: int) -> list[int]:
    """Group sizes measured for ``world`` processes: powers of two from 2, and ``world`` itself."""
    if world < 2:
        return []
    sizes = []
    n = 2
    while n < world:
        sizes.append(n)
        n *= 2
    sizes.append(world)
    return sizes


def message_elems(nbytes: float, n: int) -> int:
    """fp32 elements of a message of about ``nbytes``, rounded down to a multiple of n (at least n)."""
    per = max(1, int(nbytes) // _ELEM_BYTES // n)
    return per * n


# ---- GEMM -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GemmShape:
    """One GEMM (M x K) @ (K x N): M rows (tokens), K the reduction dim, N the output columns."""

    label: str
    m: int
    k: int
    n: int

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n


def gemm_shapes(model: ModelSpec | None, tokens: int, *, square: tuple[int, ...] = (512, 1024, 2048)) -> list[GemmShape]:
    """The forward GEMMs of one transformer layer for ``tokens`` rows, or a square set without a model.

    QKV: h -> (a + 2g)·d (MLA: the Q projection plus the joint KV down-projection); attention output: a·d_v -> h;
    MLP: h -> f (x2 when gated: gate and up fused) and f -> h. An MoE model adds one routed expert's GEMMs at
    the average rows an expert sees, tokens·top_k / num_experts."""
    if model is None:
        return [GemmShape(f"square{s}", s, s, s) for s in square]
    h, a = model.hidden_size, model.num_attention_heads
    if model.mla:
        qkv_n = a * model.qk_head_dim + model.mla.kv_lora_rank + model.mla.qk_rope_head_dim
    else:
        qkv_n = (a + 2 * model.kv_heads) * model.dim_per_head
    gate = 2 if model.gated_mlp else 1
    f = model.ffn_hidden_size
    shapes = [GemmShape("qkv", tokens, h, qkv_n), GemmShape("attn_out", tokens, a * model.v_head_dim, h),
              GemmShape("mlp_up", tokens, h, gate * f), GemmShape("mlp_down", tokens, f, h)]
    if model.moe:
        rows = max(1, tokens * model.moe.top_k // model.moe.num_experts)
        ef = model.moe.expert_ffn_hidden_size
        shapes += [GemmShape("expert_up", rows, h, gate * ef), GemmShape("expert_down", rows, ef, h)]
    return shapes


def _fit_to_budget(shape: GemmShape, max_flops: float, max_weight_elems: float) -> GemmShape:
    """Shrink a shape for a slow device: fewer rows (down to 64) to stay under ``max_flops``, then fewer output
    columns (as a tensor-parallel shard would have) to keep the weight under ``max_weight_elems``."""
    m, k, n = shape.m, shape.k, shape.n
    if k * n > max_weight_elems:
        n = max(64, int(max_weight_elems // k))
    if 2.0 * m * k * n > max_flops:
        m = max(64, int(max_flops // (2.0 * k * n)))
    if (m, n) == (shape.m, shape.n):
        return shape
    return GemmShape(f"{shape.label}*", m, k, n)


def _device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def _precisions_for(device: str) -> list[str]:
    if device == "cuda":
        import torch
        return ["bf16", "fp16"] + (["fp32"] if torch.cuda.get_device_capability() < (8, 0) else [])
    return ["fp32", "bf16", "fp16"]


def measure_gemm(shapes: list[GemmShape], precisions: list[str] | None = None, *, device: str | None = None,
                 min_time_s: float = 0.15, threads: int | None = None,
                 progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Time each shape in each precision on one device; returns per-shape and per-precision TFLOP/s.

    Each precision is first probed with a 256^3 GEMM; one running under 5% of the fastest probe (fp16 on most
    CPUs, which emulate it) is reported at the probe only. On CPU the shapes are cut to a FLOP budget (see
    ``_fit_to_budget``); cut shapes carry a '*' in their label. ``threads``: CPU threads to use (default:
    torch's current setting)."""
    import torch
    dev = device or _device()
    if threads is not None and dev == "cpu":
        saved = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            out = measure_gemm(shapes, precisions, device=dev, min_time_s=min_time_s, progress=progress)
        finally:
            torch.set_num_threads(saved)
        out["threads"] = threads
        return out
    say = progress or (lambda _m: None)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    precisions = precisions or _precisions_for(dev)

    def sync() -> None:
        if dev == "cuda":
            torch.cuda.synchronize()

    def time_one(m: int, k: int, n: int, dtype: Any) -> float:
        """Seconds of the fastest repetition: a peak, not a typical time (on a shared machine the median
        would also count other people's work)."""
        a = torch.randn(m, k, device=dev).to(dtype)
        b = torch.randn(k, n, device=dev).to(dtype)
        a @ b  # warm-up (kernel selection, page faults)
        sync()
        times: list[float] = []
        start = time.perf_counter()
        while True:
            t = time.perf_counter()
            a @ b
            sync()
            times.append(time.perf_counter() - t)
            if time.perf_counter() - start >= min_time_s or len(times) >= 50:
                return min(times)

    if dev == "cpu":
        max_flops, max_weight = 4e10, 64e6
    else:
        max_flops, max_weight = 1e15, 4e9
    out: dict[str, Any] = {"device": dev, "shapes": [], "tflops": {}, "probe_only": []}
    probes: dict[str, float] = {}
    for prec in precisions:
        try:
            probes[prec] = 2.0 * 256 ** 3 / time_one(256, 256, 256, dtypes[prec]) / 1e12
        except RuntimeError as err:  # dtype not supported by this device's matmul
            say(f"gemm {prec}: not supported ({str(err).splitlines()[0][:80]})")
    best = max(probes.values(), default=0.0)
    for prec, probe in probes.items():
        dtype = dtypes[prec]
        if probe < 0.05 * best:  # emulated (fp16 on most CPUs): full shapes would take minutes
            out["tflops"][prec] = probe
            out["probe_only"].append(prec)
            out["shapes"].append({"precision": prec, "label": "probe256", "m": 256, "k": 256, "n": 256,
                                  "seconds": 2.0 * 256 ** 3 / probe / 1e12, "tflops": probe})
            say(f"gemm {prec}: {probe * 1e3:.2f} GFLOP/s at 256^3 (under 5% of the fastest precision: probe only)")
            continue
        total_flops = total_time = 0.0
        for shape in shapes:
            s = _fit_to_budget(shape, max_flops, max_weight)
            t = time_one(s.m, s.k, s.n, dtype)
            tf = s.flops / t / 1e12
            total_flops += s.flops
            total_time += t
            out["shapes"].append({"precision": prec, "label": s.label, "m": s.m, "k": s.k, "n": s.n,
                                  "seconds": t, "tflops": tf})
            say(f"gemm {prec} {s.label:<10} {s.m}x{s.k}x{s.n}: {tf * 1e3:,.1f} GFLOP/s")
        out["tflops"][prec] = total_flops / total_time / 1e12
    return out


def measure_copy_bandwidth(*, device: str | None = None, mib: int = 256, threads: int | None = None) -> float:
    """Best-of-5 bandwidth of copying a ``mib`` MiB buffer, TB/s, counting bytes read plus written."""
    import torch
    dev = device or _device()
    if threads is not None and dev == "cpu":
        saved = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return measure_copy_bandwidth(device=dev, mib=mib)
        finally:
            torch.set_num_threads(saved)
    if dev == "cuda":
        mib = 4 * mib
    n = mib * MIB // 4
    src = torch.ones(n, device=dev)
    dst = torch.empty_like(src)
    best = math.inf
    for _ in range(6):
        if dev == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src)
        if dev == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return 2.0 * n * 4 / best / 1e12


# ---- collectives: the worker (one per rank) -------------------------------------------------------------
def _bench_collective(op: str, nbytes: float, group_n: int, rank: int, device: Any, min_time_s: float,
                      max_iters: int) -> tuple[int, float]:
    """Time one collective over the default group; returns (message bytes S, seconds per op, max over ranks)."""
    import torch
    import torch.distributed as dist

    n = group_n
    elems = message_elems(nbytes, n)
    x = torch.ones(elems, device=device)
    if op == "all_reduce":
        def step() -> None:
            dist.all_reduce(x)
    elif op == "all_gather":
        part = torch.ones(elems // n, device=device)

        def step() -> None:
            dist.all_gather_into_tensor(x, part)
    elif op == "reduce_scatter":
        part = torch.empty(elems // n, device=device)

        def step() -> None:
            dist.reduce_scatter_tensor(part, x)
    elif op == "all_to_all":
        y = torch.empty_like(x)

        def step() -> None:
            dist.all_to_all_single(y, x)
    elif op == "send_recv":
        y = torch.empty_like(x)
        nxt, prv = (rank + 1) % n, (rank - 1) % n

        def step() -> None:
            reqs = [dist.isend(x, nxt), dist.irecv(y, prv)]
            for r in reqs:
                r.wait()
    else:
        raise ValueError(op)

    def sync() -> None:
        if x.is_cuda:
            torch.cuda.synchronize()

    def timed(iters: int) -> float:
        dist.barrier()
        sync()
        t = time.perf_counter()
        for _ in range(iters):
            step()
        sync()
        elapsed = torch.tensor([(time.perf_counter() - t) / iters], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the time, as in nccl-tests
        return float(elapsed.item())

    step()  # warm-up: connections, buffers
    one = timed(1)
    iters = int(min(max_iters, max(3, min_time_s / max(one, 1e-9))))
    return elems * _ELEM_BYTES, timed(iters)


def _rss_gib() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    return float("nan")


def _concurrent_compute(cfg: dict, world: int, device: Any) -> dict:
    """GEMM TFLOP/s and copy bandwidth measured on every rank at the same time; the slowest rank's figures.

    On a CPU the processes share cores, caches and memory bandwidth, so what one "GPU" achieves while the
    others work — the situation of a training step — can be far below what a lone process achieves."""
    import torch
    import torch.distributed as dist
    shapes = [GemmShape(*s) for s in cfg["shapes"]]
    dev = device.type
    dist.barrier()
    res = measure_gemm(shapes, cfg.get("precisions"), device=dev, min_time_s=cfg.get("min_time", 0.15))
    dist.barrier()
    copy = measure_copy_bandwidth(device=dev)
    names = sorted(res["tflops"])
    vals = torch.tensor([res["tflops"][p] for p in names] + [copy], dtype=torch.float64, device=device)
    dist.all_reduce(vals, op=dist.ReduceOp.MIN)
    vals = vals.tolist()
    return {"kind": "compute", "n": world, "tflops": dict(zip(names, vals[:-1])), "copy_tbps": vals[-1],
            "probe_only": res["probe_only"], "shapes": res["shapes"], "threads": torch.get_num_threads()}


def _worker_main(argv: list[str]) -> int:
    """One rank of a measurement group.

    Started by :func:`run_collectives` (rank, world size and a file rendezvous on the command line) or by
    torchrun across nodes (``torchrun --nnodes N --nproc-per-node G -m autopar.profile.hardware --worker
    --results R.jsonl --sizes-mib 1,16,64``: rank, world and rendezvous from the environment)."""
    p = argparse.ArgumentParser(prog="autopar.profile.hardware --worker")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("--world", type=int, default=None)
    p.add_argument("--rendezvous", default=None, help="file for a FileStore rendezvous; default: env://")
    p.add_argument("--results", required=True)
    p.add_argument("--sizes-mib", default="1,16,64")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--min-time", type=float, default=0.1)
    p.add_argument("--max-iters", type=int, default=50)
    p.add_argument("--threads", type=int, default=1, help="CPU threads per rank")
    p.add_argument("--gemm", default=None, help="JSON file: GEMM shapes to time on every rank at once")
    a = p.parse_args(argv)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(max(1, a.threads))
    rank = a.rank if a.rank is not None else int(os.environ["RANK"])
    world = a.world if a.world is not None else int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count()) \
        if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    init = f"file://{a.rendezvous}" if a.rendezvous else "env://"
    dist.init_process_group("nccl" if cuda else "gloo", init_method=init, rank=rank, world_size=world)
    results = open(a.results, "a") if rank == 0 else None

    def emit(rec: dict) -> None:
        if results is not None:
            results.write(json.dumps(rec) + "\n")
            results.flush()

    try:
        emit({"kind": "start", "n": world, "backend": dist.get_backend(), "rss_gib": _rss_gib()})
        if a.gemm:
            emit(_concurrent_compute(json.loads(Path(a.gemm).read_text()), world, device))
        nbytes, t = _bench_collective("all_reduce", _LATENCY_PROBE_BYTES, world, rank, device, a.min_time,
                                      a.max_iters)
        emit({"kind": "latency", "n": world, "bytes": nbytes, "seconds": t,
              "alpha_us": t / (2 * (world - 1)) * 1e6})
        for op in a.ops.split(","):
            for mib in (float(s) for s in a.sizes_mib.split(",")):
                nbytes, t = _bench_collective(op, mib * MIB, world, rank, device, a.min_time, a.max_iters)
                emit({"kind": "collective", "op": op, "n": world, "size_mib": mib, "bytes": nbytes,
                      "seconds": t, "algbw_gbps": algbw_gbps(nbytes, t),
                      "busbw_gbps": busbw_gbps(op, world, nbytes, t)})
        emit({"kind": "done", "n": world})
        dist.barrier()
    finally:
        if results is not None:
            results.close()
        dist.destroy_process_group()
    return 0


# ---- collectives: the launcher ---------------------------------------------------------------------------
def _stop(procs: list[subprocess.Popen]) -> None:
    """Terminate, then kill, every process still running; reap them all."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_collectives(n: int, sizes_mib: list[float], ops: list[str], *, timeout_s: float,
                    on_record: Callable[[dict], None] | None = None, min_time_s: float = 0.1,
                    max_iters: int = 50, threads: int = 1,
                    gemm_shapes_: list[GemmShape] | None = None) -> list[dict]:
    """Measure ``ops`` at ``sizes_mib`` in one group of ``n`` local processes; returns rank 0's records.

    ``gemm_shapes_``: also time these GEMMs (and a memory copy) on all ranks at once first (a 'compute'
    record). ``threads``: CPU threads per rank.

    Raises :class:`ProfileError` when a rank fails or the group exceeds ``timeout_s`` (every process started
    is stopped first). Records already measured are attached to the error as ``.records``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO_ROOT), env.get("PYTHONPATH", "")]))
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one machine: loopback, whatever the hostname resolves to
    env["OMP_NUM_THREADS"] = str(max(1, threads))
    records: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="autopar-hw-") as tmp:
        results = Path(tmp) / "results.jsonl"
        results.touch()
        rdzv = Path(tmp) / "rendezvous"
        extra: list[str] = ["--threads", str(threads)]
        if gemm_shapes_:
            cfg = Path(tmp) / "gemm.json"
            cfg.write_text(json.dumps({"shapes": [[g.label, g.m, g.k, g.n] for g in gemm_shapes_]}))
            extra += ["--gemm", str(cfg)]
        procs: list[subprocess.Popen] = []
        logs = []
        pos = 0

        def drain() -> None:
            nonlocal pos
            with open(results) as fh:
                fh.seek(pos)
                while True:
                    line = fh.readline()
                    if not line.endswith("\n"):
                        break
                    pos = fh.tell()
                    rec = json.loads(line)
                    records.append(rec)
                    if on_record:
                        on_record(rec)

        try:
            for rank in range(n):
                log = open(Path(tmp) / f"rank{rank}.log", "w+")
                logs.append(log)
                cmd = [sys.executable, "-m", "autopar.profile.hardware", "--worker", "--rank", str(rank),
                       "--world", str(n), "--rendezvous", str(rdzv), "--results", str(results),
                       "--sizes-mib", ",".join(repr(float(s)) for s in sizes_mib), "--ops", ",".join(ops),
                       "--min-time", str(min_time_s), "--max-iters", str(max_iters), *extra]
                procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL))
            deadline = time.monotonic() + timeout_s
            while True:
                drain()
                codes = [p.poll() for p in procs]
                bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
                if bad:
                    r, c = bad[0]
                    logs[r].seek(0)
                    tail = " | ".join(logs[r].read().strip().splitlines()[-3:])
                    raise ProfileError(f"group of {n}: rank {r} exited with status {c}: {tail}")
                if all(c == 0 for c in codes):
                    drain()
                    break
                if time.monotonic() > deadline:
                    raise ProfileError(f"group of {n}: timed out after {timeout_s:g} s "
                                       f"({sum(r['kind'] == 'collective' for r in records)} measurements done)")
                time.sleep(0.05)
        except ProfileError as err:
            err.records = records  # type: ignore[attr-defined]
            raise
        finally:
            _stop(procs)
            for log in logs:
                log.close()
    return records


# ---- the whole profile ----------------------------------------------------------------------------------
def _meminfo_total_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024 / GIB
    raise ProfileError("/proc/meminfo has no MemTotal line")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def busbw_table(records: list[dict]) -> dict[str, dict[int, dict[float, float]]]:
    """{op: {group size: {size MiB: busbw GB/s}}} from the worker records."""
    table: dict[str, dict[int, dict[float, float]]] = {}
    for r in records:
        if r.get("kind") == "collective":
            table.setdefault(r["op"], {}).setdefault(r["n"], {})[r["size_mib"]] = r["busbw_gbps"]
    return table


def measured_collectives(records: list[dict], message_mib: float) -> MeasuredCollectives | None:
    """The spec's table: bus GB/s per op and group size at ``message_mib`` (the largest size measured)."""
    tab = busbw_table(records)
    fields: dict[str, Any] = {}
    for op, by_n in tab.items():
        vals = {n: round(by_size[message_mib], 3) for n, by_size in sorted(by_n.items()) if message_mib in by_size}
        if vals:
            fields[op] = vals
    if not fields:
        return None
    return MeasuredCollectives(message_mib=message_mib, **fields)


def _row(rec: dict) -> str:
    return (f"{rec['op']:<15}{rec['n']:>4}{rec['size_mib']:>11.3f}{rec['seconds'] * 1e6:>13.1f}"
            f"{rec['algbw_gbps']:>11.3f}{rec['busbw_gbps']:>11.3f}")


TABLE_HEADER = f"{'op':<15}{'n':>4}{'size MiB':>11}{'time us':>13}{'algbw GB/s':>11}{'busbw GB/s':>11}"


def profile_hardware(base: HardwareSpec | None, *, world: int, sizes_mib: list[float], ops: list[str],
                     model: ModelSpec | None, timeout_s: float, tokens: int = 4096, name: str | None = None,
                     gemm: bool = True, min_time_s: float = 0.1, cpu_math: str = "fp32",
                     out: Callable[[str], None] | None = None,
                     progress: Callable[[str], None] | None = None) -> tuple[HardwareSpec, dict]:
    """Measure this machine and return (hardware spec, raw measurements).

    ``base`` None: a description of this machine built from the measurements, each process playing one GPU:
    peak_tflops_* = measured GEMM TFLOP/s with kernel_model.gemm 1.0 (on CPU: the ``cpu_math`` rate, fp32 by
    default, because autopar's CPU runner computes in fp32 whatever the training precision; measured with
    the process's share of the cores), hbm_gib = MemTotal / world, hbm_tbps = copy bandwidth of one process,
    nvlink and scale-out bandwidth = measured all-reduce bus bandwidth with efficiency 1.0, latency from a
    4 KiB all-reduce, reserve_gib = resident memory of an idle worker.
    ``base`` given: a copy with ``measured_busbw_gbps`` replaced; its datasheet numbers and efficiencies are
    kept (GEMM figures are in the raw dict). ``out`` receives the table rows, ``progress`` status lines."""
    if world < 1:
        raise AutoparInputError(f"world must be at least 1 (got {world})")
    if not sizes_mib or any(s <= 0 for s in sizes_mib):
        raise AutoparInputError(f"message sizes must be positive MiB values (got {sizes_mib})")
    bad = [o for o in ops if o not in OPS]
    if bad:
        raise AutoparInputError(f"unknown collective(s) {', '.join(bad)} (choose from {', '.join(OPS)})")
    if timeout_s <= 0:
        raise AutoparInputError(f"timeout must be positive (got {timeout_s})")
    if tokens <= 0:
        raise AutoparInputError(f"tokens must be positive (got {tokens})")
    if cpu_math not in ("fp32", "bf16", "fp16"):
        raise AutoparInputError(f"cpu_math must be fp32, bf16 or fp16 (got '{cpu_math}')")
    say = progress or (lambda m: print(m, file=sys.stderr, flush=True))
    emit = out or (lambda m: print(m, flush=True))
    sizes = sorted(set(float(s) for s in sizes_mib))
    raw: dict[str, Any] = {"world": world, "sizes_mib": sizes, "ops": list(ops), "nodes": 1,
                           "cross_node": "not measured: all processes run on this one machine",
                           "host": platform.node(), "cpu": _cpu_model(), "records": [], "failures": []}

    device = _device()
    raw["device"] = device
    # On CPU each process plays one GPU: it gets its share of the cores, as the runner's workers do (one
    # thread each when world >= cores).
    threads = max(1, (os.cpu_count() or 1) // world) if device == "cpu" else 1
    shapes = gemm_shapes(model, tokens)
    if gemm:
        say(f"GEMM on {device} ({'model ' + model.name + f', {tokens} tokens' if model else 'square shapes'}"
            + (f", {threads} thread(s) per process" if device == "cpu" else "") + "), one process alone")
        raw["gemm"] = measure_gemm(shapes, device=device, threads=threads if device == "cpu" else None,
                                   progress=say)
        copy = measure_copy_bandwidth(device=device, threads=threads if device == "cpu" else None)
        raw["copy_tbps"] = copy
        say(f"copy bandwidth, one process alone: {copy * 1e3:.1f} GB/s (read + write)")
    groups = group_sizes(world)
    if not groups:
        say("world = 1: no collectives to measure")
    else:
        say(f"collectives on this one machine (cross-node: not measured); group sizes {groups}")
        emit(TABLE_HEADER)
    for n in groups:
        def on_record(rec: dict) -> None:
            if rec["kind"] == "collective":
                emit(_row(rec))
            elif rec["kind"] == "start":
                say(f"group of {n}: backend {rec['backend']}")
            elif rec["kind"] == "compute":
                say(f"all {n} processes at once, slowest: GEMM GFLOP/s "
                    + ", ".join(f"{p} {v * 1e3:,.1f}" for p, v in rec["tflops"].items())
                    + f"; copy {rec['copy_tbps'] * 1e3:.1f} GB/s")
        concurrent = gemm and device == "cpu" and n == world
        try:
            recs = run_collectives(n, sizes, list(ops), timeout_s=timeout_s, on_record=on_record,
                                   min_time_s=min_time_s, threads=threads,
                                   gemm_shapes_=shapes if concurrent else None)
        except ProfileError as err:
            recs = getattr(err, "records", [])
            raw["failures"].append(str(err))
            say(f"warning: {err}")
        raw["records"].extend(recs)
    if groups and not any(r["kind"] == "collective" for r in raw["records"]):
        raise ProfileError("no collective could be measured: " + "; ".join(raw["failures"]))

    largest = sizes[-1]
    table = measured_collectives(raw["records"], largest)
    raw["busbw_gbps"] = {op: {n: dict(v) for n, v in by_n.items()} for op, by_n in busbw_table(raw["records"]).items()}
    if base is not None:
        spec = base.model_copy(update={"measured_busbw_gbps": table, **({"name": name} if name else {})})
        if device == "cpu" and base.peak_tflops_bf16 > 50:
            say(f"note: measured on CPU but the base '{base.name}' is an accelerator; its datasheet numbers are "
                "kept and the bandwidth table describes this CPU")
        return HardwareSpec.model_validate(spec.model_dump()), raw
    return _describe_machine(raw, world, table, name, cpu_math), raw


def _describe_machine(raw: dict, world: int, table: MeasuredCollectives | None, name: str | None,
                      cpu_math: str = "fp32") -> HardwareSpec:
    """A HardwareSpec for this machine where every process plays one GPU (see :func:`profile_hardware`)."""
    if not raw.get("gemm"):
        raise ProfileError("a description of this machine needs the GEMM measurement (no --base given)")
    together = next((r for r in raw["records"] if r["kind"] == "compute"), None)
    # All processes computing at once is the situation of a training step; a lone process is the fallback.
    tf = dict((together or raw["gemm"])["tflops"])
    copy_tbps = together["copy_tbps"] if together else raw.get("copy_tbps", 0.01)
    probe = (together or raw["gemm"]).get("probe_only") or []
    measured = ", ".join(f"{p} {v * 1e3:,.1f}" for p, v in tf.items()) + (
        f" per process with all {world} computing at once (alone: "
        + ", ".join(f"{p} {v * 1e3:,.1f}" for p, v in raw["gemm"]["tflops"].items()) + ")" if together else "")
    if raw["device"] == "cpu":
        # autopar's CPU runner (autopar.run.worker) computes in `cpu_math` whatever training.precision
        # says, so the peak a training spec's precision looks up must be that rate.
        if cpu_math not in tf:
            raise ProfileError(f"--cpu-math {cpu_math} was not measured (measured: {', '.join(tf)})")
        bf16 = fp16 = tf[cpu_math]
        peaks = (f"peak_tflops_bf16 and peak_tflops_fp16 both hold the measured {cpu_math} rate, the math "
                 f"autopar's CPU runner executes whatever training.precision says (kernel_model.gemm 1.0)")
    else:
        fallback = max(tf.values())
        bf16, fp16 = tf.get("bf16", fallback), tf.get("fp16", fallback)
        peaks = "peak_tflops_* hold these measured figures (kernel_model.gemm 1.0)"
    recs = raw["records"]
    lat = [r for r in recs if r["kind"] == "latency"]
    alpha_us = min((r["alpha_us"] for r in lat), default=10.0)
    rss = [r["rss_gib"] for r in recs if r["kind"] == "start" and not math.isnan(r.get("rss_gib", math.nan))]
    ar = table.all_reduce if table else {}
    link = ar[max(ar)] if ar else 1.0  # bus GB/s of the largest all-reduce group at the largest message
    gemm_eff = dict(KernelModel().gemm)
    gemm_eff.update({p: 1.0 for p in (*tf, "bf16", "fp16")})
    source = (f"measured by 'autopar profile hardware' on {raw['cpu']} ({os.cpu_count()} cores, {world} processes, "
              f"{raw['device']}) {time.strftime('%Y-%m-%d')}: GEMM GFLOP/s {measured}"
              + (f" ({', '.join(probe)} at a 256^3 probe only)" if probe else "") + "; " + peaks)
    return HardwareSpec(
        name=name or f"{raw['device']}_{'gloo' if raw['device'] == 'cpu' else 'nccl'}_{world}p",
        source=source,
        peak_tflops_bf16=max(bf16, 1e-6),
        peak_tflops_fp16=max(fp16, 1e-6),
        hbm_gib=round(_meminfo_total_gib() / world, 3),
        hbm_tbps=max(copy_tbps, 1e-6),
        gpus_per_node=world,
        nvlink_domain_size=world,
        nvlink_gbps=round(link, 3),
        scaleout_gbps=round(link, 3),
        nvlink_latency_us=round(alpha_us, 2),
        scaleout_latency_us=round(alpha_us, 2),
        reserve_gib=round(max(rss), 3) if rss else 0.5,
        # The peaks above ARE the measured rates: every kernel class runs at 1.0 of them with no shape falloff
        # (attention, grouped GEMMs and small shapes are not measured separately on this path).
        kernel_model=KernelModel(source="measured peaks of this machine (see source); shape and kernel-class "
                                        "factors not measured: 1.0", gemm=gemm_eff, gemm_half_m=1e-6,
                                 gemm_half_nk=1e-6, grouped_gemm=1.0, attention_fwd=1.0, attention_bwd=1.0,
                                 attention_half_seq=1e-6, attention_head_dim={128: 1.0}, hbm=1.0, nvlink=1.0,
                                 scaleout=1.0),
        measured_busbw_gbps=table,
    )


def compute_summary(raw: dict) -> list[str]:
    """GEMM and copy figures, alone and (CPU) with every process computing at once."""
    lines = []
    gemm = raw.get("gemm", {}).get("tflops")
    if gemm:
        thr = raw["gemm"].get("threads")
        lines.append("GEMM GFLOP/s, one process alone" + (f" ({thr} thread(s))" if thr else "") + ": "
                     + ", ".join(f"{p} {v * 1e3:,.1f}" for p, v in gemm.items())
                     + (f"; copy {raw['copy_tbps'] * 1e3:.1f} GB/s" if raw.get("copy_tbps") else ""))
    for r in raw.get("records", []):
        if r["kind"] == "compute":
            lines.append(f"GEMM GFLOP/s per process, all {r['n']} at once (slowest): "
                         + ", ".join(f"{p} {v * 1e3:,.1f}" for p, v in r["tflops"].items())
                         + f"; copy {r['copy_tbps'] * 1e3:.1f} GB/s")
    return lines


def file_header(spec: HardwareSpec, raw: dict) -> str:
    """YAML comment lines: where the file comes from and the full bus-bandwidth table."""
    lines = [f"# Written by 'autopar profile hardware' on {raw.get('host', '?')} ({raw.get('cpu', '?')}), "
             f"{raw['world']} processes on {raw.get('device', '?')}, {time.strftime('%Y-%m-%d %H:%M')}.",
             f"# Cross-node: {raw['cross_node']}."]
    for line in compute_summary(raw):
        lines.append("# " + line)
    tab = raw.get("busbw_gbps", {})
    if tab:
        lines.append("# Bus bandwidth GB/s (nccl-tests definition) by op, group size and message MiB:")
        for op, by_n in tab.items():
            for n, by_size in sorted(by_n.items()):
                cells = ", ".join(f"{s:g} MiB: {v:.2f}" for s, v in sorted(by_size.items()))
                lines.append(f"#   {OP_LABELS[op]:<4}n={n}: {cells}")
    if spec.measured_busbw_gbps is not None:
        lines.append(f"# measured_busbw_gbps holds the {spec.measured_busbw_gbps.message_mib:g} MiB column.")
    for f in raw.get("failures", []):
        lines.append(f"# FAILED: {f}")
    return "\n".join(lines)


def write_new_file(spec: HardwareSpec, path: Path, header: str, *, force: bool) -> None:
    """Write ``spec`` with dump_spec, refusing to replace an existing file unless ``force``."""
    from autopar.specs.loaders import dump_spec
    if path.exists() and not force:
        raise AutoparInputError(f"{path} exists; pass --force to overwrite it (or choose another --out)")
    if path.is_dir():
        raise AutoparInputError(f"{path} is a folder, not a file")
    if not path.parent.exists():
        raise AutoparInputError(f"folder {path.parent} does not exist")
    dump_spec(spec, path, header)


# ---- CLI ------------------------------------------------------------------------------------------------
def parse_float_list(text: str, what: str) -> list[float]:
    try:
        vals = [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise AutoparInputError(f"{what}: expected comma-separated numbers, got '{text}'") from None
    if not vals or any(v <= 0 or not math.isfinite(v) for v in vals):
        raise AutoparInputError(f"{what}: expected positive numbers, got '{text}'")
    return vals


def register_hardware(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``hardware`` to the ``autopar profile`` subparsers."""
    p = subparsers.add_parser(
        "hardware", help="measure GEMM TFLOP/s and collective bus bandwidth; write a hardware file",
        description="Measure GEMM throughput and all-reduce / all-gather / reduce-scatter / all-to-all / send-recv "
                    "bus bandwidth (nccl-tests definitions) with real processes on this machine (gloo on CPU, "
                    "NCCL on CUDA), and write a hardware YAML with the measured table.")
    p.add_argument("--out", required=True, type=Path, help="hardware YAML to write (never overwritten without --force)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--base", default=None,
                   help="hardware zoo name or file to start from (default: describe this machine from the measurements)")
    p.add_argument("--name", default=None, help="name of the written hardware (default: base's, or cpu_gloo_<N>p)")
    p.add_argument("--world", type=int, default=2, help="processes (group sizes 2, 4, ... up to this; default 2)")
    p.add_argument("--sizes", default="1,4,16,64", help="message sizes in MiB, comma-separated (default 1,4,16,64); "
                   "the spec keeps the largest")
    p.add_argument("--ops", default=",".join(OPS), help=f"collectives, comma-separated (default all: {','.join(OPS)})")
    p.add_argument("--model", default=None, help="model zoo name or file: measure GEMMs at its shapes")
    p.add_argument("--tokens", type=int, default=4096, help="GEMM rows for --model: micro-batch x seq_len (default 4096)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per measurement group (default 300)")
    p.add_argument("--cpu-math", choices=("fp32", "bf16"), default="fp32",
                   help="CPU only: the measured rate to store as peak_tflops_bf16/fp16 (default fp32: autopar's CPU "
                        "runner computes in fp32)")
    p.add_argument("--results-from", type=Path, default=None,
                   help="merge collective records (JSON lines) written by a torchrun multi-node worker run")
    p.set_defaults(func=_cmd_hardware)
    return p


def _cmd_hardware(args: argparse.Namespace) -> int:
    from autopar.specs.loaders import load_hardware, load_model
    out: Path = args.out
    if out.exists() and not args.force:  # fail before minutes of measuring, and again before writing
        raise AutoparInputError(f"{out} exists; pass --force to overwrite it (or choose another --out)")
    if args.world < 1:
        raise AutoparInputError(f"--world must be at least 1 (got {args.world})")
    if args.results_from is not None and not args.results_from.is_file():
        raise AutoparInputError(f"--results-from: file not found: {args.results_from}")
    base = load_hardware(args.base) if args.base else None
    model = load_model(args.model) if args.model else None
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    sizes = parse_float_list(args.sizes, "--sizes")
    try:
        spec, raw = profile_hardware(base, world=args.world, sizes_mib=sizes, ops=ops, model=model,
                                     timeout_s=args.timeout, tokens=args.tokens, name=args.name,
                                     cpu_math=args.cpu_math)
    except ProfileError as err:
        print(f"autopar: profile failed: {err}", file=sys.stderr)
        return 1
    if args.results_from:
        extra = [json.loads(line) for line in args.results_from.read_text().splitlines() if line.strip()]
        raw["records"].extend(extra)
        raw["nodes"] = "see --results-from"
        raw["cross_node"] = f"merged from {args.results_from}"
        raw["busbw_gbps"] = busbw_table(raw["records"])
        table = measured_collectives(raw["records"], max(raw["sizes_mib"]))
        spec = HardwareSpec.model_validate({**spec.model_dump(), "measured_busbw_gbps":
                                            table.model_dump() if table else None})
    if spec.measured_busbw_gbps is not None:
        m = spec.measured_busbw_gbps
        parts = [f"{OP_LABELS[op]}={dict(getattr(m, op))}" for op in OPS if getattr(m, op)]
        print(f"Measured BW (GB/s, {m.message_mib:g} MiB): " + ", ".join(parts))
    for line in compute_summary(raw):
        print(line)
    write_new_file(spec, out, file_header(spec, raw), force=args.force)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    if "--worker" in sys.argv[1:]:
        sys.exit(_worker_main(sys.argv[1:]))
    print("usage: autopar profile hardware ... (this module's own entry point is the per-rank --worker)",
          file=sys.stderr)
    sys.exit(2)
