"""The problem a tuner measures: the model as it will really run, the hardware the predictions use, the
training step and the world size, plus the defaults for a machine without GPUs.

Real runs happen on the machine at hand, one node: ``gpus`` is the world size of every run (torchrun
``--nproc-per-node``). Without GPUs the runs are gloo processes on the CPU; a zoo model is then scaled down
(same architecture, see :func:`autopar.run.scale_model`) so one run takes a few seconds, and the
problem says so in its notes.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autopar.errors import AutoparInputError
from autopar.run import check_cpu_world, local_gpus, runner_training, runs_on_cpu
from autopar.search.space import SearchOptions
from autopar.specs.hardware import HardwareSpec
from autopar.specs.loaders import load_hardware, load_model
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

# Scaled-down shape for CPU runs: each field is an upper bound (a smaller model keeps its own value).
CPU_SCALE = {"layers": 4, "hidden": 64, "ffn": 256, "heads": 4, "experts": 4, "vocab": 512}
CPU_SEQ_LEN = 128
CPU_SEQS_PER_RANK = 4        # default global batch on CPU: 4 sequences per rank
_MODEL_FIELD = {"layers": "num_layers", "hidden": "hidden_size", "ffn": "ffn_hidden_size",
                "heads": "num_attention_heads", "kv_heads": "num_kv_heads", "vocab": "vocab_size"}


@dataclass
class Problem:
    model: ModelSpec               # as the runs build it (scaled down when notes say so)
    hardware: HardwareSpec         # what the cost model predicts for (memory limit, step time)
    training: TrainingSpec
    gpus: int                      # world size of every real run
    options: SearchOptions
    backend: str                   # gloo | nccl | auto
    notes: list[str] = field(default_factory=list)
    base_model: str = ""           # the model's name before scaling

    def fingerprint(self) -> dict:
        """What must match for a study to belong to this problem (stored in the study's user attributes)."""
        return {"model": self.model.name, "model_sha": _sha(self.model.model_dump(mode="json")),
                "hardware": self.hardware.name,
                "gpus": self.gpus, "seq_len": self.training.seq_len, "global_batch": self.training.global_batch,
                "precision": self.training.precision}

    def describe(self) -> str:
        m = self.model
        shape = f"{m.num_layers} layers, hidden {m.hidden_size}, ffn {m.ffn_hidden_size}, {m.num_attention_heads} heads"
        if m.moe:
            shape += f", {m.moe.num_experts} experts top-{m.moe.top_k}"
        return (f"{m.name} ({shape}, vocab {m.vocab_size}) on {self.gpus} rank(s); seq {self.training.seq_len}, "
                f"global batch {self.training.global_batch}; predictions for {self.hardware.name}")

    def default_study_name(self) -> str:
        opts = {k: v for k, v in self.options.__dict__.items() if k not in ("time_limit_s", "workers")}
        digest = _sha({"fp": self.fingerprint(), "options": opts})[:8]
        return f"{self.model.name}-{self.gpus}gpu-{self.hardware.name}-{digest}"


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cpu_scale_for(model: ModelSpec, given: dict[str, int] | None = None) -> dict[str, int]:
    """The scale_model arguments that bring ``model`` within CPU_SCALE (fields the user gave win)."""
    given = dict(given or {})
    out: dict[str, int] = {}
    for key, cap in CPU_SCALE.items():
        if key in given:
            continue
        if key == "experts":
            if model.moe and model.moe.num_experts > cap:
                out[key] = cap
            continue
        if getattr(model, _MODEL_FIELD[key]) > cap:
            out[key] = cap
    if model.moe and "ffn" not in given and model.moe.expert_ffn_hidden_size > CPU_SCALE["ffn"]:
        out["ffn"] = CPU_SCALE["ffn"]
    if ("hidden" in out or "heads" in out) and model.mla is None:
        h, a = out.get("hidden", given.get("hidden", model.hidden_size)), out.get(
            "heads", given.get("heads", model.num_attention_heads))
        if h % a:                  # keep hidden divisible by heads
            out["heads"] = max(d for d in range(1, a + 1) if h % d == 0)
    return {**out, **given}


def resolve_problem(model: ModelSpec | str | Path, hardware: HardwareSpec | str | Path,
                    training: TrainingSpec | dict[str, Any] | None, gpus: int, options: SearchOptions | None, *,
                    scale: dict[str, int] | str | None = "auto", backend: str = "auto") -> Problem:
    """Load and (on a machine without GPUs) scale the model; pick the training step; check the world size.

    ``scale``: "auto" (scale a model larger than CPU_SCALE down when the runs go to the CPU), a dict of
    :func:`scale_model` arguments (on the CPU, completed from CPU_SCALE), or None (run the model as given).
    ``training``: a TrainingSpec, None (the defaults for the machine), or a dict of TrainingSpec fields laid over
    those defaults."""
    from autopar.run import scale_model, scale_notes

    if not isinstance(gpus, int) or gpus < 1:
        raise AutoparInputError(f"gpus must be a positive whole number (got {gpus})")
    if backend not in ("auto", "gloo", "nccl"):
        raise AutoparInputError(f"backend must be auto, gloo or nccl (got '{backend}')")
    spec = load_model(model)
    hw = load_hardware(hardware)
    n_gpu = local_gpus()
    on_cpu = runs_on_cpu(backend)
    notes: list[str] = []
    if not on_cpu:
        if n_gpu and gpus > n_gpu:
            raise AutoparInputError(f"real runs use this node only: --gpus ({gpus}) is more than the GPUs here "
                                    f"({n_gpu}); tune with at most {n_gpu}")
    else:
        check_cpu_world(gpus)
        cores = os.cpu_count() or 1
        notes.append(f"no GPU here: the runs are {gpus} gloo process(es) on the CPU ({cores} cores)")
        if gpus > cores:
            notes.append(f"{gpus} ranks share {cores} cores: step times include the sharing")
        notes.append(f"predictions are for {hw.name}, the runs are on this CPU: compare the rankings, not the "
                     "values (`autopar profile hardware` writes a description of this machine for --hardware)")
    args: dict[str, int] = {}
    if scale == "auto":
        args = cpu_scale_for(spec) if on_cpu else {}
    elif isinstance(scale, dict):
        bad = sorted(set(scale) - {"layers", "hidden", "ffn", "heads", "kv_heads", "experts", "vocab"})
        if bad:
            raise AutoparInputError(f"unknown scale field(s) {', '.join(bad)} (choose layers, hidden, ffn, heads, "
                                    "kv_heads, experts, vocab)")
        args = cpu_scale_for(spec, scale) if on_cpu else dict(scale)
    elif scale is not None:
        raise AutoparInputError(f"scale must be 'auto', a dict of scale_model arguments or None (got {scale!r})")
    base = spec.name
    if args:
        unscaled, spec = spec, scale_model(spec, **args)
        why = "so a run takes a few seconds on this CPU" if on_cpu else "as asked"
        notes.append(f"model scaled down from {base} ({why}): "
                     + ", ".join(f"{k} {v}" for k, v in sorted(args.items()))
                     + "; the plan found is for this scaled model (pass --no-scale / scale=None to run it as is)")
        notes += scale_notes(unscaled, spec)
    if not isinstance(training, TrainingSpec):
        from autopar.specs.loaders import build_spec
        over = dict(training or {})
        if on_cpu:
            seq = over.get("seq_len", CPU_SEQ_LEN)
            gb = over.get("global_batch", CPU_SEQS_PER_RANK * gpus)
            if "global_batch" not in over or "seq_len" not in over:
                notes.append(f"training step for CPU runs: seq {seq}, global batch {gb}"
                             + ("" if "global_batch" in over else f" ({CPU_SEQS_PER_RANK} sequences per rank)"))
        else:
            from autopar.defaults import DEFAULT_SEQ_LEN, default_global_batch
            seq = over.get("seq_len", DEFAULT_SEQ_LEN)
            gb = over.get("global_batch")
            if gb is None:
                gb, why = default_global_batch(spec, seq)
                notes.append(why)
        training = build_spec(TrainingSpec, {**over, "seq_len": seq, "global_batch": gb}, "training")
    ran = runner_training(training, spec)
    if ran is not training:
        notes.append(f"linear-layer context parallelism as the runner runs it: states passed between CP ranks "
                     f"(linear_cp={ran.linear_cp}), not Megatron-Core's all-to-all")
    training = ran
    hw.peak_tflops(training.precision)     # fails early, naming the precision, if the chip lacks it
    return Problem(spec, hw, training, gpus, options or SearchOptions(), "gloo" if on_cpu else backend, notes, base)
