"""What this node offers a real run: its GPUs, and how many CPU ranks it can hold.

Torch-free (planning and the tuner's start import it). A run without GPUs starts one gloo process per rank on the
CPU; :func:`check_cpu_world` refuses a world size this machine cannot hold before anything is started
(``--gpus 1048576`` once made torchrun try to start a million processes).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from autopar.errors import AutoparInputError

# Bounds of a CPU world (docs/input-bounds.md). Both are policy, not physics: a rank is a whole Python process.
# - CPU_RANKS_PER_CORE: gloo ranks share the cores; beyond 4 per core the step time measures the scheduler, not the
#   layout, and the run's own timeout becomes the likely outcome.
# - CPU_RANK_MIB: memory per rank, twice the 218 MiB peak RSS of `import torch, torch.distributed` (measured with
#   resource.getrusage on the 2-core, 24 GiB development machine, torch 2.13.0+cpu, 2026-11-26); the scaled-down
#   model, optimizer and gloo buffers of a CPU trial fit in the other half.
CPU_RANKS_PER_CORE = 4
CPU_RANK_MIB = 512


def local_gpus() -> int:
    """GPUs on this node, counted without importing torch: /dev/nvidia<N> (CUDA) or /dev/dri/renderD* with
    /dev/kfd (ROCm). CUDA_VISIBLE_DEVICES narrows the count when set."""
    dev = Path("/dev")
    n = sum(1 for p in dev.glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name))
    if n == 0 and (dev / "kfd").exists():
        n = len(list(dev.glob("dri/renderD*")))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if n and visible is not None:
        n = min(n, len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"]))
    return n


def runs_on_cpu(backend: str) -> bool:
    """Whether a run with ``backend`` ("auto", "gloo", "nccl") is gloo processes on the CPU."""
    return backend == "gloo" or (backend == "auto" and local_gpus() == 0)


def _memory_mib() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cpu_world_limit() -> tuple[int, str]:
    """The most CPU ranks this machine takes, and the arithmetic that gives it (for messages)."""
    cores = os.cpu_count() or 1
    by_cores = CPU_RANKS_PER_CORE * cores
    mem = _memory_mib()
    by_mem = max(1, mem // CPU_RANK_MIB) if mem else by_cores
    if by_mem < by_cores:
        return by_mem, f"{mem:,} MiB of memory / {CPU_RANK_MIB} MiB per rank"
    return by_cores, f"{CPU_RANKS_PER_CORE} ranks per core x {cores} core(s)"


def check_cpu_world(world: int, flag: str = "--gpus") -> None:
    """AutoparInputError, naming the bound, when ``world`` gloo ranks are more than this machine takes."""
    limit, why = cpu_world_limit()
    if world > limit:
        raise AutoparInputError(f"{flag} {world:,}: a run without GPUs starts one gloo process per rank, and this "
                                f"machine takes at most {limit} ({why}); give at most {limit}, or run on GPUs")
