"""Arguments shared by the commands: the problem (model, hardware, training, gpus) and layout degrees."""

from __future__ import annotations

import argparse
import json

from autopar.defaults import DEFAULT_HARDWARE, DEFAULT_PRECISION, DEFAULT_SEQ_LEN, default_global_batch
from autopar.errors import AutoparInputError
from autopar.specs.hardware import PRECISIONS, HardwareSpec
from autopar.specs.loaders import load_hardware, load_model
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec


# Version of the --json output layout; bumped when a key changes meaning or goes away (docs/launchers.md).
SCHEMA_VERSION = 1


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {v}")
    return v


def fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 1, got '{text}'") from None
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {v}")
    return v


def add_problem_args(p: argparse.ArgumentParser, gpus_required: bool = True, gpus_range: bool = False,
                     cluster: bool = False) -> None:
    g = p.add_argument_group("problem")
    g.add_argument("--model", required=True, help="zoo name (see `autopar zoo`), a model YAML, or a HF config.json")
    g.add_argument("--hardware", default=DEFAULT_HARDWARE, help=f"zoo name or YAML (default: {DEFAULT_HARDWARE})")
    if cluster:   # --gpus or --cluster: load_problem checks that one is given
        gpus_required = False
        g.add_argument("--cluster", default=None, metavar="NODESxGPUS[:FABRIC]",
                       help="the cluster instead of --gpus: e.g. 32x8 or 32x8:rail (rail-optimised), 32x8:2:1 "
                            "(2:1 oversubscribed scale-out; approximation: every inter-node collective at 1/2 of the "
                            "NIC bandwidth)")
    if gpus_range:
        g.add_argument("--gpus", required=gpus_required, metavar="N|A-B",
                       help="number of GPUs, or a range A-B searched at A, 2A, 4A, ... and B (see --objective)")
    else:
        g.add_argument("--gpus", type=positive_int, required=gpus_required, help="number of GPUs")
    g.add_argument("--seq-len", type=positive_int, default=DEFAULT_SEQ_LEN,
                   help=f"sequence length (default: {DEFAULT_SEQ_LEN})")
    g.add_argument("--global-batch", type=positive_int, default=None,
                   help="sequences per step (default: by model size, GPT-3 Table 2.1 scaling: 0.5M-4M tokens)")
    g.add_argument("--precision", choices=PRECISIONS, default=DEFAULT_PRECISION,
                   help=f"GEMM precision (default: {DEFAULT_PRECISION})")
    g.add_argument("--grad-dtype", choices=("bf16", "fp32"), default="bf16",
                   help="gradient buffer dtype (default: bf16 as Megatron-Core; fp32 = "
                        "--accumulate-allreduce-grads-in-fp32)")


def load_problem(args: argparse.Namespace) -> tuple[ModelSpec, HardwareSpec, TrainingSpec, list[str]]:
    """Model, hardware and training from the parsed flags; notes on the defaults that were applied."""
    model = load_model(args.model)
    hw = load_hardware(args.hardware)
    notes = []
    if getattr(args, "cluster", None):
        from autopar.specs.cluster import parse_cluster
        cl = parse_cluster(args.cluster)
        if args.gpus is not None and str(args.gpus) != str(cl.gpus):
            raise AutoparInputError(f"--gpus {args.gpus} and --cluster {args.cluster} ({cl.gpus} GPUs) disagree; "
                                    "give one")
        args.gpus = cl.gpus
        hw, cluster_notes = cl.apply(hw)
        notes += cluster_notes
    elif hasattr(args, "cluster") and args.gpus is None:
        raise AutoparInputError("give --gpus N or --cluster NODESxGPUS")
    gb = args.global_batch
    if gb is None:
        gb, why = default_global_batch(model, args.seq_len)
        notes.append(why)
    training = TrainingSpec(seq_len=args.seq_len, global_batch=gb, precision=args.precision,
                            grad_dtype="fp16" if args.precision == "fp16" and args.grad_dtype == "bf16"
                            else args.grad_dtype,
                            weight_dtype="fp16" if args.precision == "fp16" else "bf16")
    hw.peak_tflops(training.precision)  # fails early, naming the precision, if the chip lacks it
    return model, hw, training, notes


def dump_json(obj: object) -> str:
    return json.dumps(obj, indent=2, sort_keys=False)


def parse_int_list(text: str, name: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise AutoparInputError(f"{name}: expected comma-separated whole numbers, got '{text}'") from None
    if not vals or any(v <= 0 for v in vals):
        raise AutoparInputError(f"{name}: values must be positive, got '{text}'")
    return vals


EMIT_CHOICES = ("megatron", "bridge", "torchtitan", "env")
TORCHTITAN_VERSIONS = ("0.3.0", "0.2.2")   # autopar.emit.torchtitan.TORCHTITAN_VERSIONS (not imported: start-up time)


def add_emit_args(g, what: str) -> None:
    """--emit and --torchtitan-version (docs/launchers.md describes each target and its version)."""
    g.add_argument("--emit", choices=EMIT_CHOICES, default=None,
                   help=f"print launcher settings for {what}: megatron (Megatron-Core 0.20 pretrain_gpt.py args), "
                        "bridge (Megatron-Bridge 0.7 recipe overrides), torchtitan (0.3.0 Trainer.Config), env")
    g.add_argument("--torchtitan-version", choices=TORCHTITAN_VERSIONS, default=TORCHTITAN_VERSIONS[0],
                   help="torchtitan release to emit for (default: %(default)s; 0.2.2 = the old TOML job file)")
