"""Collective bus bandwidth between local processes (the nccl-tests definitions), and their launcher.

What is measured
  all-reduce, all-gather, reduce-scatter, all-to-all and send/recv **bus bandwidth** by message size and group
  size with the nccl-tests definitions (NVIDIA nccl-tests, doc/PERFORMANCE.md):
      algbw = S / t                     S: the message size below, t: time of one operation
      busbw = algbw * factor            all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all (n-1)/n;
                                        send/recv 1
  S is the all-reduce buffer, the all-gather *output*, the reduce-scatter *input*, the per-rank all-to-all
  buffer and the point-to-point message (each rank sends S to the next rank of a ring and receives S).

How
  Each group size runs as its own set of ``n`` Python processes (``python -m autopar.measure.collectives
  --worker``; gloo on CPU, NCCL on CUDA) under one timeout; every process started is waited for or killed
  before the call returns, so no process outlives it. Rank 0 streams one JSON line per measurement to a
  results file, which the parent prints as a table as it goes. Only one machine is driven by the launcher:
  cross-node bandwidth needs the worker started by ``torchrun`` on each node (see ``_worker_main``) and the
  result merged with ``--results-from``.

  This launcher is separate from the training runner's (``autopar.run.launch``, torchrun-based): it needs no
  torchrun (a file rendezvous) and streams records as they come.

torch is imported inside functions only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from autopar.measure import ProfileError
from autopar.measure.kernels import GemmShape, measure_copy_bandwidth, measure_gemm
from autopar.specs.hardware import MeasuredCollectives

MIB = 2 ** 20
GIB = 2 ** 30
OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
OP_LABELS = {"all_reduce": "AR", "all_gather": "AG", "reduce_scatter": "RS", "all_to_all": "A2A",
             "send_recv": "P2P"}
_ELEM_BYTES = 4  # collectives move fp32 elements
_LATENCY_PROBE_BYTES = 4096  # small all-reduce whose time gives the per-step latency (alpha)
_REPO_ROOT = Path(__file__).resolve().parents[2]


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


WORKER_DEFAULTS: dict[str, Any] = {"rank": None, "world": None, "rendezvous": None, "sizes_mib": [1.0, 16.0, 64.0],
                                   "ops": list(OPS), "min_time": 0.1, "max_iters": 50, "threads": 1, "gemm": None}


def _worker_main(argv: list[str]) -> int:
    """One rank of a measurement group: ``python -m autopar.measure.collectives --worker CONFIG.json``.

    CONFIG holds ``results`` (the JSON-lines file rank 0 appends to) and optionally the keys of
    ``WORKER_DEFAULTS``: ``sizes_mib``, ``ops``, ``min_time``, ``max_iters``, ``threads`` (CPU threads per
    rank), ``gemm`` (GEMM shapes to time on every rank at once), and ``rank``, ``world``, ``rendezvous`` (a
    FileStore file). Started by :func:`run_collectives` with all of them, or by torchrun across nodes
    (``torchrun --nnodes N --nproc-per-node G -m autopar.measure.collectives --worker cfg.json`` with
    ``{"results": "R.jsonl"}``: rank, world and rendezvous then come from the environment)."""
    if len(argv) != 2 or argv[0] != "--worker":
        print("usage: python -m autopar.measure.collectives --worker CONFIG.json", file=sys.stderr)
        return 2
    a = {**WORKER_DEFAULTS, **json.loads(Path(argv[1]).read_text())}
    import torch
    import torch.distributed as dist

    torch.set_num_threads(max(1, int(a["threads"])))
    rank = a["rank"] if a["rank"] is not None else int(os.environ["RANK"])
    world = a["world"] if a["world"] is not None else int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count()) \
        if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    init = f"file://{a['rendezvous']}" if a["rendezvous"] else "env://"
    dist.init_process_group("nccl" if cuda else "gloo", init_method=init, rank=rank, world_size=world)
    results = open(a["results"], "a") if rank == 0 else None

    def emit(rec: dict) -> None:
        if results is not None:
            results.write(json.dumps(rec) + "\n")
            results.flush()

    try:
        emit({"kind": "start", "n": world, "backend": dist.get_backend(), "rss_gib": _rss_gib()})
        if a["gemm"]:
            emit(_concurrent_compute(a["gemm"], world, device))
        nbytes, t = _bench_collective("all_reduce", _LATENCY_PROBE_BYTES, world, rank, device, a["min_time"],
                                      a["max_iters"])
        emit({"kind": "latency", "n": world, "bytes": nbytes, "seconds": t,
              "alpha_us": t / (2 * (world - 1)) * 1e6})
        for op in a["ops"]:
            for mib in (float(s) for s in a["sizes_mib"]):
                nbytes, t = _bench_collective(op, mib * MIB, world, rank, device, a["min_time"], a["max_iters"])
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
        cfg = {"world": n, "rendezvous": str(rdzv), "results": str(results), "sizes_mib": [float(x) for x in sizes_mib],
               "ops": list(ops), "min_time": min_time_s, "max_iters": max_iters, "threads": threads,
               "gemm": {"shapes": [[g.label, g.m, g.k, g.n] for g in gemm_shapes_]} if gemm_shapes_ else None}
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
                rank_cfg = Path(tmp) / f"rank{rank}.json"
                rank_cfg.write_text(json.dumps({**cfg, "rank": rank}))
                cmd = [sys.executable, "-m", "autopar.measure.collectives", "--worker", str(rank_cfg)]
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




if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))

