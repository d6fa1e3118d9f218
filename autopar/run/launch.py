"""Run one layout for real: spawn torchrun with the layout's world size, collect a :class:`RunResult`.

Failure isolation: torchrun runs in its own session under a time limit. A rank that runs out of memory,
crashes or hangs, or a backend error, becomes ``RunResult(ok=False, failure=...)``; the caller never hangs. On
a timeout every process of the run is killed: torchrun's process group, and each worker's own process group
(torchrun starts every worker in a new session, so killing torchrun's group alone would orphan them; the
workers are found as torchrun's descendants and from their ``rank<R>.pid`` files). If the launching process
itself dies (even by SIGKILL), lifetime.py's guards take torchrun, the workers and the temporary folder with it.

Failure strings (:func:`failure_reason`): ``"oom"`` (an out-of-memory error, the CPU allocator's "can't
allocate memory", or a rank SIGKILLed while the kernel's OOM-kill counter rose), ``"killed by <SIGNAL>"`` (a
rank killed by a signal before it could report), ``"timeout"``, ``"crash: <exception or last log line>"``,
``"backend: <gloo/NCCL error>"``, ``"unsupported: <why>"`` (a valid layout this runner cannot apply).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autopar.errors import AutoparInputError
from autopar.run import lifetime
from autopar.run._machine import check_cpu_world, runs_on_cpu
from autopar.specs.layout import Layout, resolve_layout
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec


@dataclass
class RunResult:
    ok: bool
    failure: str | None            # when not ok: "oom", "timeout", "crash: ...", "backend: ...", "unsupported: ..."
    step_time_s: float | None      # median step time after warm-up (slowest rank of each step)
    tokens_per_s: float | None     # global tokens per second (global_batch · seq_len / step_time_s)
    peak_mem_gib: list[float]      # per rank (CUDA: max_memory_allocated; CPU: peak-RSS growth)
    losses: list[float]            # per step, global mean loss read on the rank holding the last stage
    applied: dict                  # group sizes read back from the process groups, and what was applied
    wall_s: float                  # launch to result, seconds
    notes: list[str] = field(default_factory=list)       # approximations made for this model/layout
    step_times_s: list[float] = field(default_factory=list)
    log_path: str | None = None    # torchrun's combined output (kept when not ok or when a workdir was given)
    # per rank, GiB: "weights", "grads", "optimizer" (fp32 main copies + Adam moments) read from the tensors the
    # rank stores, "fwd_bwd_peak" (CUDA only, else None): peak allocated during forward/backward above the
    # step's start (activations, plus gradients and FSDP-gathered weights alive at that moment)
    memory_terms_gib: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def unsupported_reason(model: ModelSpec, layout: Layout) -> str | None:
    """Valid layouts this runner cannot apply (None: runnable)."""
    if model.is_moe and layout.tp > 1 and not layout.sp:
        return "MoE with tp > 1 needs sequence parallelism (as in Megatron-LM)"
    if model.moe is not None and model.moe.latent_size:
        return "LatentMoE (the experts' latent projections) is not in autopar's runner yet"
    if model.mla is not None and model.mla.indexer is not None:
        return "DeepSeek Sparse Attention's indexer is not in autopar's runner yet"
    return None


def _last_error_line(log: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b", ln):
            return ln[:300]
    return lines[-1][:300] if lines else "no output"


def _worker_env(tmp: Path) -> dict:
    """The workers' environment. TMPDIR is ``tmp``, inside the run's folder: torchrun's elastic agent makes a
    ``torchelastic_*`` folder in the temp dir for every run and leaves it there; this way it goes with the run."""
    env = dict(os.environ)
    env["TMPDIR"] = str(tmp)
    root = str(Path(__file__).resolve().parents[2])      # so the workers import this autopar
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def worker_spec(model: ModelSpec, layout: Layout, training: TrainingSpec, *, steps: int = 4, warmup: int = 1,
                seed: int = 0, backend: str = "auto", result_dir: Path | None = None,
                timeout_s: float = 600.0, lr: float | None = None, lr_warmup_steps: int | None = None,
                dtype: str = "auto") -> dict:
    """The JSON run spec ``python -m autopar.run.worker --spec`` reads (layout already resolved). ``lr``: peak
    AdamW learning rate (None: the worker's LR); ``lr_warmup_steps`` (None: a quarter of the steps);
    ``dtype``: the weights' dtype ("auto": the training spec's on CUDA, fp32 on the CPU)."""
    return {"model": model.model_dump(mode="json"), "layout": layout.model_dump(mode="json"),
            "training": training.model_dump(mode="json"), "steps": steps, "warmup": warmup, "seed": seed,
            "backend": backend, "result_dir": None if result_dir is None else str(result_dir),
            "timeout_s": timeout_s, "lr": lr, "lr_warmup_steps": lr_warmup_steps, "dtype": dtype}


def run_layout(model: ModelSpec, layout: Layout, training: TrainingSpec, *, world: int, steps: int = 4,
               warmup: int = 1, timeout_s: float = 120.0, seed: int = 0, backend: str = "auto",
               workdir: Path | None = None, progress: Callable[[str], None] | None = None,
               lr: float | None = None, lr_warmup_steps: int | None = None, dtype: str = "auto") -> RunResult:
    """Train ``steps`` steps of ``model`` under ``layout`` on ``world`` ranks and measure them.

    The layout is resolved for ``world`` GPUs (an invalid one raises LayoutError). ``backend``: "auto"
    (NCCL when CUDA is available, else gloo), "gloo" or "nccl". ``workdir`` keeps the spec, the per-rank
    results and the log (default: a temporary folder, removed when the run succeeds). ``progress`` receives
    the workers' progress lines while the run goes on. ``warmup`` is capped at steps - 1. ``lr``,
    ``lr_warmup_steps``, ``dtype``: see :func:`worker_spec`."""
    t_start = time.monotonic()
    if steps < 1 or warmup < 0:
        raise AutoparInputError(f"steps ({steps}) must be at least 1 and warmup ({warmup}) at least 0")
    warmup = min(warmup, steps - 1)      # always time at least one step
    if dtype not in ("auto", "fp32", "bf16", "fp16"):
        raise AutoparInputError(f"dtype must be auto, fp32, bf16 or fp16 (got {dtype!r})")
    if lr is not None and not lr > 0:
        raise AutoparInputError(f"lr must be positive (got {lr})")
    resolved = resolve_layout(layout, model, training, world)
    if runs_on_cpu(backend):
        check_cpu_world(world, "world")
    reason = unsupported_reason(model, resolved)
    if reason:
        return RunResult(False, f"unsupported: {reason}", None, None, [], [], {}, time.monotonic() - t_start)
    keep = workdir is not None
    lifetime.sweep_stale_run_dirs()
    work = Path(workdir).resolve() if workdir is not None else lifetime.make_run_dir()   # the workers run in it
    work.mkdir(parents=True, exist_ok=True)
    for stale in [*work.glob("rank*.json"), *work.glob("rank*.pid")]:
        stale.unlink()
    spec = worker_spec(model, resolved, training, steps=steps, warmup=warmup, seed=seed, backend=backend,
                       result_dir=work, timeout_s=timeout_s, lr=lr, lr_warmup_steps=lr_warmup_steps, dtype=dtype)
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    log_path = work / "torchrun.log"
    tmp = Path(tempfile.mkdtemp(prefix=".torchrun-tmp-", dir=work))   # a new name: never a folder of the user's
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
           "-m", "autopar.run.worker", "--spec", str(spec_path)]
    timed_out, finished = False, False
    oom_before = oom_kill_counts()
    with open(log_path, "wb") as log:
        proc = lifetime.popen_tied(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=_worker_env(tmp), cwd=work)
        reaper = lifetime.start_reaper(proc.pid, work, remove=not keep)
        deadline, seen = time.monotonic() + timeout_s, 0
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                time.sleep(0.1)
                if progress is not None:
                    text = log_path.read_text(errors="replace")
                    for line in text[seen:].splitlines(keepends=True):
                        if not line.endswith("\n"):
                            break
                        seen += len(line)
                        if line.startswith(("[rank 0]", f"[rank {world - 1}]")):
                            progress(line.rstrip())
            finished = True
        finally:
            # a finished run must not leave a worker behind either; an interrupted one (Ctrl-C) its folder
            lifetime.kill_run(proc.pid, work)
            proc.wait()
            shutil.rmtree(tmp, ignore_errors=True)
            if not finished and not keep:
                shutil.rmtree(work, ignore_errors=True)
            lifetime.stop_reaper(reaper)
    wall = time.monotonic() - t_start
    result = _collect(work, world, training, warmup, proc.returncode, timed_out, log_path, wall,
                      oom_killed=oom_kill_counts() != oom_before)
    if result.ok and not keep:
        shutil.rmtree(work, ignore_errors=True)
        result.log_path = None
    return result


def _collect(work: Path, world: int, training: TrainingSpec, warmup: int, rc: int | None, timed_out: bool,
             log_path: Path, wall: float, oom_killed: bool = False) -> RunResult:
    ranks: dict[int, dict] = {}
    for f in work.glob("rank*.json"):
        try:
            r = json.loads(f.read_text())
            ranks[int(r["rank"])] = r
        except (OSError, ValueError, KeyError):
            continue

    def fail(reason: str) -> RunResult:
        return RunResult(False, reason, None, None, [], [], {}, wall, log_path=str(log_path))

    log = log_path.read_text(errors="replace") if log_path.exists() else ""
    reason = failure_reason(ranks, rank_exit_codes(log), world, rc, timed_out, oom_killed, log)
    if reason is not None:
        return fail(reason)
    r0 = ranks[0]
    times = r0["step_times_s"]
    step = statistics.median(times[warmup:])
    holder = next((r for r in ranks.values() if r.get("loss_rank")), r0)
    return RunResult(
        ok=True, failure=None, step_time_s=step, tokens_per_s=r0["tokens_per_step"] / step,
        peak_mem_gib=[round(ranks[r]["peak_mem_gib"], 4) for r in sorted(ranks)], losses=holder["losses"],
        applied=dict(r0["applied"], memory=r0["mem_method"]), wall_s=wall, notes=r0["approximations"],
        step_times_s=times, log_path=str(log_path),
        memory_terms_gib=[ranks[r].get("mem_terms_gib", {}) for r in sorted(ranks)])


# ---- why a run failed ------------------------------------------------------------------------------------
_OOM_WORDS = ("can't allocate memory", "CUDA out of memory", "OutOfMemoryError", "MemoryError")


def rank_exit_codes(log: str) -> dict[int, int]:
    """{rank: exit code} from torchrun's failure summary (a negative code -N: killed by signal N)."""
    return {int(r): int(c) for r, c in
            re.findall(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)", log)}


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def failure_reason(ranks: dict[int, dict], exits: dict[int, int], world: int, rc: int | None, timed_out: bool,
                   oom_killed: bool, log: str = "") -> str | None:
    """The RunResult.failure of a run (None: it succeeded), from the ranks' own results (``rank<R>.json``),
    torchrun's per-rank exit codes, and whether the kernel's OOM killer struck during the run.

    In order: a timeout; a rank's own exception other than a backend error (the earliest: the other ranks
    only lost their peer); a rank killed by a signal before it could write a result ("oom" when the OOM
    killer's counter rose during the run, "killed by SIGKILL" otherwise; SIGTERM counts last, because torchrun
    sends it to the survivors of a failure); the earliest backend error (a peer's "connection reset" when
    nothing better is known); the last error line of the log ("oom" when it is the CPU allocator's
    "can't allocate memory")."""
    if timed_out:
        return "timeout"
    failed = sorted((r for r in ranks.values() if not r.get("ok")), key=lambda r: r.get("time", 0.0))
    own = [r for r in failed if not str(r.get("failure", "")).startswith("backend:")]
    if own:
        return own[0]["failure"]
    signalled = {rank: code for rank, code in exits.items() if code < 0 and ranks.get(rank, {}).get("ok") is not True}
    if signalled:
        code = min(signalled.values(), key=lambda c: (c == -signal.SIGTERM, c))   # SIGTERM last
        if oom_killed and code == -signal.SIGKILL:
            return "oom"
        return f"killed by {_signal_name(code)}"
    if failed:
        return failed[0]["failure"]
    if rc != 0 or len(ranks) != world:
        if oom_killed:
            return "oom"
        line = _last_error_line(log)
        return "oom" if any(w in line for w in _OOM_WORDS) else f"crash: {line}"
    return None


def oom_kill_counts() -> tuple[int | None, ...]:
    """The kernel's OOM-kill counters: this cgroup's (v2 ``memory.events``, v1 ``memory.oom_control``) and the
    machine's (``/proc/vmstat``, Linux >= 4.13). Compared before and after a run; the machine-wide one can
    also count another process's kill, which would then be misread as this run's."""
    def field(path: str, key: str) -> int | None:
        try:
            for line in Path(path).read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == key:
                    return int(v)
        except (OSError, ValueError):
            pass
        return None
    return (field("/sys/fs/cgroup/memory.events", "oom_kill"),
            field("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill"),
            field("/proc/vmstat", "oom_kill"))
