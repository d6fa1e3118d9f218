"""Process lifetime of a run: nothing outlives the process that launched it, no temporary folder is left behind.

Three guards (Linux; elsewhere only the third and the launcher's own clean-up apply):

1. **Die with the parent.** torchrun (through ``preexec_fn``) and every worker (first thing in its ``main``)
   ask the kernel to SIGKILL them when their parent dies: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``
   (prctl(2); ``PR_SET_PDEATHSIG = 1`` in linux/prctl.h). So a SIGKILLed launcher takes torchrun down, and
   torchrun its workers. A child that lost its parent before the call notices (its parent pid changed) and
   exits.
2. **A reaper per run.** This file, run as a script, watches the launcher through a pipe, which the
   kernel closes when the launcher dies however it dies. On EOF without the word "done" it SIGKILLs
   torchrun's process group, torchrun's descendants and every worker named in a ``rank<R>.pid`` file, and
   removes the run's temporary folder. It runs in its own session, so a signal to the launcher's process
   group does not reach it.
3. **Stale folders.** A temporary run folder is named ``autopar-profile-<launcher pid>-...``; each new run
   removes those whose launcher and workers are all gone (a failed run keeps its folder for its log until
   then; a folder given as ``workdir`` is never removed).
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

PREFIX = "autopar-profile-"
PR_SET_PDEATHSIG = 1      # linux/prctl.h
WORKER_MODULE = "autopar.run.worker"
_LINUX = sys.platform.startswith("linux")
_libc = ctypes.CDLL(None, use_errno=True) if _LINUX else None     # loaded before any fork (preexec_fn)


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits. False where unsupported."""
    return bool(_libc is not None and _libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0)


def die_with_parent() -> None:
    """For a child at start-up: SIGKILL on the parent's death, and exit at once if the parent already died."""
    parent = os.getppid()
    set_parent_death_signal()
    if os.getppid() != parent:
        os._exit(1)


def _preexec_die_with(parent: int):
    def preexec() -> None:           # runs in the child between fork and exec: no imports, no locks
        set_parent_death_signal()
        if os.getppid() != parent:
            os._exit(1)
    return preexec


def popen_tied(cmd: list[str], **kw) -> subprocess.Popen:
    """``subprocess.Popen`` whose child is SIGKILLed when this process dies (Linux), in its own session."""
    if _LINUX:
        kw["preexec_fn"] = _preexec_die_with(os.getpid())
    return subprocess.Popen(cmd, start_new_session=True, **kw)


# ---- finding and killing the processes of a run ----------------------------------------------------------
def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return not _LINUX


def descendants(pid: int) -> list[int]:
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


def is_worker(pid: int) -> bool:
    try:
        return WORKER_MODULE.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def worker_pids(workdir: Path) -> list[int]:
    """Live workers named in the run folder's ``rank<R>.pid`` files."""
    pids = []
    for f in workdir.glob("rank*.pid"):
        try:
            pid = int(f.read_text())
        except (OSError, ValueError):
            continue
        if is_worker(pid):
            pids.append(pid)
    return pids


def kill_run(torchrun_pid: int, workdir: Path) -> None:
    """SIGKILL torchrun, its descendants and every worker listed in a pid file, by process group."""
    pids = set(descendants(torchrun_pid)) if _LINUX else set()
    pids.update(worker_pids(workdir))
    own = os.getpgrp()
    for pid in [torchrun_pid, *pids]:
        try:
            pgid = os.getpgid(pid)
            if pgid != own:
                os.killpg(pgid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


# ---- temporary run folders -------------------------------------------------------------------------------
def make_run_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))


def sweep_stale_run_dirs(root: Path | None = None) -> list[Path]:
    """Remove the temporary run folders whose launcher and workers are all gone; returns them."""
    removed = []
    for d in Path(root or tempfile.gettempdir()).glob(PREFIX + "*"):
        m = re.match(re.escape(PREFIX) + r"(\d+)-", d.name)
        if not m or not d.is_dir() or alive(int(m.group(1))) or worker_pids(d):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


# ---- the reaper ------------------------------------------------------------------------------------------
def start_reaper(torchrun_pid: int, workdir: Path, remove: bool) -> subprocess.Popen:
    """The watcher of guard 2. Tell it the run ended normally with :func:`stop_reaper`."""
    # Run as a plain script (this file needs only the standard library): no package import, a fast start.
    cmd = [sys.executable, str(Path(__file__).resolve()), str(torchrun_pid), str(workdir), "1" if remove else "0"]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def stop_reaper(reaper: subprocess.Popen) -> None:
    try:
        reaper.stdin.write(b"done")
        reaper.stdin.close()
    except OSError:
        pass
    try:
        reaper.wait(timeout=10)
    except subprocess.TimeoutExpired:
        reaper.kill()
        reaper.wait()


def _reap(argv: list[str]) -> int:
    torchrun_pid, workdir, remove = int(argv[0]), Path(argv[1]), argv[2] == "1"
    try:
        said = sys.stdin.buffer.read()          # returns when the launcher closes the pipe or dies
    except (OSError, KeyboardInterrupt):
        said = b""
    if said.startswith(b"done"):
        return 0
    kill_run(torchrun_pid, workdir)
    if remove:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(_reap(sys.argv[1:]))
