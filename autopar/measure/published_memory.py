"""Published runs that state their peak memory, predicted by the memory model.

One home, one reading: a run's peak memory is the ``memory_gib`` column of the runs file it is in, read by the same
:func:`autopar.measure.validation.row_to_case` as its throughput (its stack, knobs, ZeRO stage, gradient dtype and
filled-in fields), so the memory check and ``autopar validate`` predict the same layout. ``data/published_runs.csv``
holds the runs validated for throughput; ``data/published_memory.csv`` (same columns) holds the published runs that
state their peak memory but are not in the throughput set yet (torchtitan's H200 runs of 2025-06: they carry their
throughput too, so they can move into published_runs.csv as they are).

The prediction is the fullest stage's memory (``Estimate.memory_gib``); the measurement is what the source printed
(torchtitan prints the CUDA caching allocator's peak *reserved* memory, ``reserved_bytes.all.peak``, of the rank that
logs, metrics.py@9dec370: rank 0 on the console, the last stage's first rank in TensorBoard; its Dec 2024 tables give
the maximum over all GPUs: "Different PP ranks can have different peak memory usages. We take the maximum across all
GPUs", footnote 1 of torchtitan@b5bcd76c benchmarks/llama3_h100_202412_torchtitan.md). ``tests/measure/test_published_memory.py`` checks that no prediction is below its
measurement, and names the rows where it still is.

Like for like: the allocator's reserved peak holds neither the CUDA context nor NCCL's buffers, which NCCL allocates
itself (NVIDIA/nccl@v2.21.5-1 src/include/alloc.h ``ncclCudaCalloc``, the NCCL of torch 2.5/2.6), so the prediction
compared is the fullest stage's memory less ``hardware.reserve_gib``, the part of the model that stands for them
(:func:`autopar.cost.memory.reserve_bytes`); the allocator's own excess over its live tensors,
``hardware.fragmentation`` of the modelled bytes, stays in, as the reserved figure holds it. (Until 2026-11-26 the
whole prediction was compared, 3 GiB more than the printed figure counts.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autopar.specs.loaders import zoo_dir


def default_csv() -> Path:
    """``published_memory.csv`` beside ``published_runs.csv`` (data/ in a checkout, the wheel's zoo data)."""
    return zoo_dir("data") / "published_memory.csv"


def memory_csvs() -> list[Path]:
    """The files whose ``memory_gib`` cells are checked: the validated runs and the memory-only runs."""
    from autopar.measure.validation import DEFAULT_CSV
    return [DEFAULT_CSV, default_csv()]


@dataclass(frozen=True)
class MemoryRow:
    row_id: str
    source: str
    measured_gib: float
    predicted_gib: float
    layout: str
    regime: dict[str, str]      # autopar.measure.intervals.regime_of: kind, chip generation, stack

    @property
    def ratio(self) -> float:
        """predicted / measured peak memory (>= 1: not under-predicted)."""
        return self.predicted_gib / self.measured_gib

    @property
    def error(self) -> float:
        """predicted / measured − 1 (negative: under-predicted)."""
        return self.ratio - 1


def predict_rows(paths: list[Path] | None = None) -> list[MemoryRow]:
    """Every run of the files (default: :func:`memory_csvs`) that states its peak memory, predicted."""
    from autopar.measure.intervals import regime_of
    from autopar.measure.validation import evaluate, load_cases
    out = []
    for path in paths or memory_csvs():
        cases, _ = load_cases(path)
        for r in evaluate([c for c in cases if c.measured_mem_gib]):
            c = r.case
            allocator = r.predicted_mem_gib - c.hardware.reserve_gib      # what the printed peak counts (docstring)
            out.append(MemoryRow(c.row_id, c.row_id.split("-")[0], c.measured_mem_gib, allocator,
                                 c.layout.short(), regime_of(c.model, c.hardware, c.stack)))
    return out


def largest_under_prediction(rows: list[MemoryRow]) -> float:
    """The largest share by which a prediction fell below its measured peak, ``max(0, −min(error))``: the HBM share
    a planner must keep free beyond the prediction for every one of these runs to have fitted (a run measured at M
    and predicted at P = M(1 + e), e < 0, fits when P <= HBM(1 + e))."""
    return max([0.0] + [-r.error for r in rows])


def margins_by_stack(rows: list[MemoryRow]) -> dict[str, dict]:
    """{stack: {"margin": largest under-prediction of its runs, "runs": how many}} for the error-bars file."""
    out = {}
    for st in sorted({r.regime["stack"] for r in rows}):
        mine = [r for r in rows if r.regime["stack"] == st]
        out[st] = {"margin": round(largest_under_prediction(mine), 4), "runs": len(mine)}
    return out
