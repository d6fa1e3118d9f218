"""Published runs that state their peak memory, predicted by the memory model (``data/published_memory.csv``).

Each row names its source (repository@commit, file, table) and sets every knob the memory model reads: the layout,
ZeRO stage, gradient dtype, recompute policy and cross-entropy kernel, with the reason for each choice that is not
printed in the source in its ``notes``. The prediction is the fullest stage's memory (``Estimate.memory_gib``);
the measurement is what the source printed (torchtitan prints the CUDA caching allocator's peak reserved memory,
the maximum over ranks). ``tests/measure/test_published_memory.py`` checks that no prediction is below its
measurement, and names the rows where it still is.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from autopar.cost import Estimator
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_model, read_text_file, zoo_dir
from autopar.specs.training import TrainingSpec


def default_csv() -> Path:
    """``published_memory.csv`` beside ``published_runs.csv`` (data/ in a checkout, the wheel's zoo data)."""
    return zoo_dir("data") / "published_memory.csv"


@dataclass(frozen=True)
class MemoryRow:
    row_id: str
    source: str
    measured_gib: float
    predicted_gib: float
    layout: str

    @property
    def ratio(self) -> float:
        """predicted / measured peak memory (>= 1: not under-predicted)."""
        return self.predicted_gib / self.measured_gib


def predict_rows(path: Path | None = None) -> list[MemoryRow]:
    """Every row of the file (default: :func:`default_csv`), predicted."""
    out = []
    text = read_text_file(path or default_csv()).removeprefix("\ufeff")   # the one bounded reader
    for row in csv.DictReader(io.StringIO(text, newline="")):
        prec = row["precision"]
        tr = TrainingSpec(seq_len=int(row["seq_len"]), global_batch=int(row["global_batch"]), precision=prec,
                          grad_dtype=row["grad_dtype"], cross_entropy=row["cross_entropy"])
        z = int(row["zero_stage"])
        layout = Layout(tp=int(row["tp"]), pp=int(row["pp"]), vpp=int(row["vpp"]), cp=int(row["cp"]),
                        zero_stage=z, fsdp=z == 3, micro_batch=int(row["micro_batch"]),
                        recompute=row["recompute"])
        est = Estimator(load_model(row["model"]), load_hardware(row["system"]), tr, int(row["gpus"]))
        e = est.estimate(layout)
        out.append(MemoryRow(row["id"], row["source"], float(row["measured_peak_gib"]), e.memory_gib.total,
                             e.layout.short()))
    return out
