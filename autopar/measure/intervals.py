"""Error bars on predictions: an interval for the measured figure around each prediction, from held-out errors.

``autopar validate --fit --cv --write-intervals`` predicts every published run with constants fitted to the
*other* sources (the held-out error, ``predicted / measured − 1``) and stores, per regime, the 10th and 90th
percentiles of those errors in ``data/error_bars.yaml`` (with the date, the runs file and the row counts: the
provenance). A prediction P then reads "the measurement lies in [P / (1 + q90), P / (1 + q10)] for 80% of runs
like this one" (the stated share). Nothing is recomputed per call: ``estimate`` and ``solve`` read the file.

Regimes: dense / MoE / hybrid model; chip generation by its tensor-core formats (``ampere``: no FP8,
``hopper``: FP8, ``blackwell``: FP4); software stack. The most specific regime with at least :data:`MIN_ROWS`
held-out runs is used, falling back to (kind, stack), (stack), (kind), and all runs; the regime used is printed.
Memory: the same from the runs whose source prints peak memory (predicted / measured GiB − 1), only within the
prediction's stack (today: torchtitan's 18 runs; Megatron-Core predictions have no memory interval yet).

The interval is empirical (order statistics of a few dozen errors, at split-conformal levels): it says how the model
erred on published runs like the one asked about, not a probability model of the step time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np

from autopar.errors import AutoparInputError
from autopar.specs.hardware import HardwareSpec
from autopar.specs.model import ModelSpec

SHARE = 0.8                  # the stated share of runs inside the interval
MIN_ROWS = 5                 # a regime needs this many held-out runs to have its own interval
LEVELS = (("kind", "generation", "stack"), ("kind", "stack"), ("stack",), ("kind",), ())


def model_kind(model: ModelSpec) -> str:
    return "hybrid" if model.is_hybrid else "MoE" if model.is_moe else "dense"


def generation(hw: HardwareSpec) -> str:
    """Chip generation by the tensor-core formats its datasheet lists."""
    return "blackwell" if hw.peak_tflops_nvfp4 else "hopper" if hw.peak_tflops_fp8 else "ampere"


def regime_of(model: ModelSpec, hw: HardwareSpec, stack: str) -> dict[str, str]:
    return {"kind": model_kind(model), "generation": generation(hw), "stack": stack}


@dataclass(frozen=True)
class Interval:
    """The measured figure's interval around ``predicted``: [low, high] holds ``share`` of held-out runs of
    ``regime`` (``rows`` of them)."""

    predicted: float
    low: float
    high: float
    share: float
    regime: str
    rows: int

    def to_dict(self) -> dict:
        return {"low": self.low, "high": self.high, "share": self.share, "regime": self.regime, "rows": self.rows}


def quantile_band(errors: list[float], share: float = SHARE) -> tuple[float, float]:
    """(q_lo, q_hi) of the relative errors, with the split-conformal finite-sample levels (Lei et al. 2018,
    "Distribution-free predictive inference for regression", JASA, sec. 2.2): of n sorted errors e(1) <= ... <= e(n),
    q_lo = e(floor((n + 1)(1 − share)/2)) and q_hi = e(ceil((n + 1)(1 + share)/2)) (clipped to 1..n), so that a new
    run's error falls inside with probability at least ``share`` when it is exchangeable with the n; plain
    percentiles of a few dozen errors cover less than they state."""
    a = np.sort(np.asarray(errors, dtype=float))
    n = len(a)
    k_lo = min(max(int(np.floor((n + 1) * (1 - share) / 2)), 1), n)
    k_hi = min(max(int(np.ceil((n + 1) * (1 + share) / 2)), 1), n)
    return float(a[k_lo - 1]), float(a[k_hi - 1])


def band_table(rows: list[tuple[dict[str, str], float]], share: float = SHARE) -> list[dict]:
    """Every regime (at every level of :data:`LEVELS`) with at least MIN_ROWS errors: its band."""
    out = []
    for level in LEVELS:
        groups: dict[tuple, list[float]] = {}
        for reg, err in rows:
            groups.setdefault(tuple(reg[k] for k in level), []).append(err)
        for key, errs in sorted(groups.items()):
            if len(errs) >= MIN_ROWS:
                lo, hi = quantile_band(errs, share)
                out.append({"regime": dict(zip(level, key)), "rows": len(errs), "q_lo": round(lo, 4),
                            "q_hi": round(hi, 4)})
    return out


def write(path: Path, throughput: list[tuple[dict[str, str], float]], memory: list[tuple[dict[str, str], float]],
          provenance: str) -> None:
    import yaml
    doc = {"share": SHARE, "min_rows": MIN_ROWS, "written": str(date.today()), "provenance": provenance,
           "throughput": band_table(throughput), "memory": band_table(memory)}
    path.write_text("# Error bars of autopar's predictions (autopar/measure/intervals.py); written by\n"
                    "# `autopar validate --fit --cv --write-intervals`. Do not edit by hand.\n"
                    + yaml.safe_dump(doc, sort_keys=False))


def _table(path: Path | None = None) -> dict:
    from autopar.specs.loaders import read_structured_file, zoo_dir
    path = path or zoo_dir("data") / "error_bars.yaml"
    if not path.exists():
        raise AutoparInputError(f"{path}: no error bars (run autopar validate --fit --cv --write-intervals)")
    return read_structured_file(path)


def _lookup(entries: list[dict], regime: dict[str, str], same_stack: bool = False) -> dict | None:
    for level in LEVELS:
        if same_stack and "stack" not in level:
            break
        want = {k: regime[k] for k in level}
        for e in entries:
            if e["regime"] == want:
                return e
    return None


def _name(reg: dict[str, str]) -> str:
    return ", ".join(reg.values()) or "all runs"


def throughput_interval(predicted_tokens: float, regime: dict[str, str], path: Path | None = None) -> Interval | None:
    """Interval of the measured tokens/s/GPU for a prediction (None when the file has no entry)."""
    t = _table(path)
    e = _lookup(t.get("throughput", []), regime)
    if e is None:
        return None
    return Interval(predicted_tokens, predicted_tokens / (1 + e["q_hi"]), predicted_tokens / (1 + e["q_lo"]),
                    t["share"], _name(e["regime"]), e["rows"])


def memory_interval(predicted_gib: float, regime: dict[str, str], path: Path | None = None) -> Interval | None:
    """Interval of the measured peak GiB per GPU for a predicted memory (None without an entry)."""
    t = _table(path)
    # Memory: only from runs of the same stack (what a framework reports as peak memory, and what it allocates,
    # differ between stacks: torchtitan prints reserved memory), never a fallback across stacks.
    e = _lookup(t.get("memory", []), regime, same_stack=True)
    if e is None:
        return None
    return Interval(predicted_gib, predicted_gib / (1 + e["q_hi"]), predicted_gib / (1 + e["q_lo"]),
                    t["share"], _name(e["regime"]), e["rows"])


def coverage(results: list[tuple[dict[str, str], float, float]], path: Path | None = None) -> tuple[int, int]:
    """(inside, total): how many (regime, predicted, measured) throughputs fall inside their interval."""
    inside = total = 0
    for reg, pred, meas in results:
        iv = throughput_interval(pred, reg, path)
        if iv is None:
            continue
        total += 1
        inside += iv.low <= meas <= iv.high
    return inside, total
