"""Run one layout for real: spawn torchrun with the layout's world size, collect a :class:`RunResult`.

Failure isolation: torchrun runs in its own session (``start_new_session``) under a time limit. A rank that
runs out of memory, crashes or hangs, or a backend error, becomes ``RunResult(ok=False, failure=...)``; the
caller never hangs. On a timeout every process of the run is killed: torchrun's process group, and each
worker's own process group (torchrun starts every worker in a new session, so killing torchrun's group alone
would orphan them; the workers are found as torchrun's descendants and from their ``rank<R>.pid`` files).

Failure strings: ``"oom"`` (out-of-memory error, or a worker killed by SIGKILL that we did not send, the
kernel OOM killer's signal), ``"timeout"``, ``"crash: <exception or last log line>"``,
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

    def to_dict(self) -> dict:
        return asdict(self)


def unsupported_reason(model: ModelSpec, layout: Layout) -> str | None:
    """Valid layouts this runner cannot apply (None: runnable)."""
    if model.is_moe and layout.tp > 1 and not layout.sp:
        return "MoE with tp > 1 needs sequence parallelism (as in Megatron-LM)"
    return None


def _descendants(pid: int) -> list[int]:
    """All descendants of ``pid`` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _is_worker(pid: int) -> bool:
    try:
        return b"autopar.run.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _kill_run(proc: subprocess.Popen, workdir: Path) -> None:
    """SIGKILL torchrun, its descendants and every worker listed in a pid file, by process group."""
    pids = set(_descendants(proc.pid)) if sys.platform.startswith("linux") else set()
    for f in workdir.glob("rank*.pid"):
        try:
            pid = int(f.read_text())
        except (OSError, ValueError):
            continue
        if _is_worker(pid):
            pids.add(pid)
    own = os.getpgrp()
    for pid in [proc.pid, *pids]:
        try:
            pgid = os.getpgid(pid)
            if pgid != own:
                os.killpg(pgid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def _last_error_line(log: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b", ln):
            return ln[:300]
    return lines[-1][:300] if lines else "no output"


def _worker_env() -> dict:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])      # so the workers import this autopar
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def worker_spec(model: ModelSpec, layout: Layout, training: TrainingSpec, *, steps: int = 4, warmup: int = 1,
                seed: int = 0, backend: str = "auto", result_dir: Path | None = None,
                timeout_s: float = 600.0) -> dict:
    """The JSON run spec ``python -m autopar.run.worker --spec`` reads (layout already resolved)."""
    return {"model": model.model_dump(mode="json"), "layout": layout.model_dump(mode="json"),
            "training": training.model_dump(mode="json"), "steps": steps, "warmup": warmup, "seed": seed,
            "backend": backend, "result_dir": None if result_dir is None else str(result_dir),
            "timeout_s": timeout_s}


def run_layout(model: ModelSpec, layout: Layout, training: TrainingSpec, *, world: int, steps: int = 4,
               warmup: int = 1, timeout_s: float = 120.0, seed: int = 0, backend: str = "auto",
               workdir: Path | None = None, progress: Callable[[str], None] | None = None) -> RunResult:
    """Train ``steps`` steps of ``model`` under ``layout`` on ``world`` ranks and measure them.

    The layout is resolved for ``world`` GPUs (an invalid one raises LayoutError). ``backend``: "auto"
    (NCCL when CUDA is available, else gloo), "gloo" or "nccl". ``workdir`` keeps the spec, the per-rank
    results and the log (default: a temporary folder, removed when the run succeeds). ``progress`` receives
    the workers' progress lines while the run goes on. ``warmup`` is capped at steps - 1."""
    t_start = time.monotonic()
    if steps < 1 or warmup < 0:
        raise AutoparInputError(f"steps ({steps}) must be at least 1 and warmup ({warmup}) at least 0")
    warmup = min(warmup, steps - 1)      # always time at least one step
    resolved = resolve_layout(layout, model, training, world)
    reason = unsupported_reason(model, resolved)
    if reason:
        return RunResult(False, f"unsupported: {reason}", None, None, [], [], {}, time.monotonic() - t_start)
    keep = workdir is not None
    work = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="autopar-profile-"))
    work.mkdir(parents=True, exist_ok=True)
    for stale in [*work.glob("rank*.json"), *work.glob("rank*.pid")]:
        stale.unlink()
    spec = worker_spec(model, resolved, training, steps=steps, warmup=warmup, seed=seed, backend=backend,
                       result_dir=work, timeout_s=timeout_s)
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    log_path = work / "torchrun.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
           "-m", "autopar.run.worker", "--spec", str(spec_path)]
    timed_out = False
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=_worker_env(), cwd=work, start_new_session=True)
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
        finally:
            if proc.poll() is None or timed_out:
                _kill_run(proc, work)
            else:  # a finished run must not leave a worker behind either
                _kill_stragglers(work)
    wall = time.monotonic() - t_start
    result = _collect(work, world, training, warmup, proc.returncode, timed_out, log_path, wall)
    if result.ok and not keep:
        shutil.rmtree(work, ignore_errors=True)
        result.log_path = None
    return result


def _kill_stragglers(work: Path) -> None:
    for f in work.glob("rank*.pid"):
        try:
            pid = int(f.read_text())
            if _is_worker(pid):
                os.killpg(os.getpgid(pid), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def _collect(work: Path, world: int, training: TrainingSpec, warmup: int, rc: int | None, timed_out: bool,
             log_path: Path, wall: float) -> RunResult:
    ranks: dict[int, dict] = {}
    for f in work.glob("rank*.json"):
        try:
            r = json.loads(f.read_text())
            ranks[int(r["rank"])] = r
        except (OSError, ValueError, KeyError):
            continue

    def fail(reason: str) -> RunResult:
        return RunResult(False, reason, None, None, [], [], {}, wall, log_path=str(log_path))

    if timed_out:
        return fail("timeout")
    failed = sorted((r for r in ranks.values() if not r.get("ok")), key=lambda r: r.get("time", 0.0))
    if failed:   # the earliest failure is the cause; the others are peers losing their connection to it
        return fail(failed[0]["failure"])
    if rc != 0 or len(ranks) != world:
        log = log_path.read_text(errors="replace") if log_path.exists() else ""
        if re.search(r"exitcode\s*:\s*-9\b", log):
            return fail("oom")
        return fail(f"crash: {_last_error_line(log)}")
    r0 = ranks[0]
    times = r0["step_times_s"]
    step = statistics.median(times[warmup:])
    holder = next((r for r in ranks.values() if r.get("loss_rank")), r0)
    return RunResult(
        ok=True, failure=None, step_time_s=step, tokens_per_s=r0["tokens_per_step"] / step,
        peak_mem_gib=[round(ranks[r]["peak_mem_gib"], 4) for r in sorted(ranks)], losses=holder["losses"],
        applied=dict(r0["applied"], memory=r0["mem_method"]), wall_s=wall, notes=r0["approximations"],
        step_times_s=times, log_path=str(log_path))
