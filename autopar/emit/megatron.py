"""Megatron-LM command-line arguments for a resolved Layout (the parallel, batch and precision flags only).

Flag names were checked against NVIDIA/Megatron-LM ``megatron/training/arguments.py`` (main branch, 2025,
the Megatron-Core 0.14+ generation: it has ``--dist-ckpt-save-pre-mcore-014``, ``--use-megatron-fsdp``,
``--fp4-format``, ``--pipeline-model-parallel-layout``, ``--num-virtual-stages-per-pipeline-rank``) and,
for Megatron-FSDP, the Megatron-Core "Megatron-FSDP User Guide"
(docs.nvidia.com/megatron-core/developer-guide/latest/discussions/megatron-fsdp-user-guide). Megatron-Bridge
sets the same fields by their config names (``tensor_model_parallel_size`` ...); these are the CLI
spellings ``pretrain_gpt.py`` accepts. Model-shape flags (``--num-layers``, ``--hidden-size`` ...) are not
emitted: they come from the model's recipe.

Layout field -> flags:

- tp, pp, cp -> ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
  ``--context-parallel-size``.
- ep, etp (MoE only) -> ``--expert-model-parallel-size``, ``--expert-tensor-parallel-size`` (always written:
  Megatron's default ETP is TP, autopar's is 1).
- vpp with even stages that divide by vpp -> ``--num-layers-per-virtual-pipeline-stage L/(pp·vpp)`` (accepted
  by every Megatron-LM since interleaving landed; current Megatron also takes
  ``--num-virtual-stages-per-pipeline-rank``.
  ``virtual_pipeline_model_parallel_size`` is a config field, not a CLI flag, in current Megatron-LM).
- uneven stages where only the first and last differ, vpp 1 -> ``--decoder-first-pipeline-num-layers`` and
  ``--decoder-last-pipeline-num-layers`` (the middle stages share the rest evenly).
- any other split (uneven stages with vpp > 1, or stages not divisible by vpp) ->
  ``--pipeline-model-parallel-layout`` with one ``|``-separated entry per virtual stage in model order (entry
  v·pp + i is virtual stage v of pipeline rank i; a stage's chunks differ by at most one layer, see
  :func:`autopar.emit._common.virtual_chunks`); E = embedding, t = transformer layer, m = MTP layer, L = loss:
  DeepSeek-V3 on PP16 without interleaving would read ``Et*3|t*4|...|t*2mL``.
- sequence_parallel -> ``--sequence-parallel``.
- zero_stage 1 or 2 -> ``--use-distributed-optimizer`` (optimizer state sharded over DP, gradients
  reduce-scattered to their owner; Megatron has no separate ZeRO-2 switch). fsdp / zero_stage 3 ->
  Megatron-FSDP: ``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params
  --no-gradient-accumulation-fusion --use-distributed-optimizer --ckpt-format fsdp_dtensor`` (the guide's
  required set); or, with ``fsdp_impl="torch"``, ``--use-torch-fsdp2`` (Megatron rejects it with PP > 1 or
  EP > 1). hsdp_shard -> ``--num-distributed-optimizer-instances dp/hsdp_shard`` (replicas of the sharded
  state across the DP group).
- micro_batch, global batch, seq_len -> ``--micro-batch-size``, ``--global-batch-size``, ``--seq-length``.
- recompute: selective -> ``--recompute-granularity selective`` (Megatron's default module is core_attn);
  a module list -> ``--recompute-granularity selective --recompute-modules m1 m2 ...``; full ->
  ``--recompute-granularity full --recompute-method uniform --recompute-num-layers 1``.
- offload_activations f -> ``--cpu-offloading --cpu-offloading-num-layers N`` with N = round(f·layers per stage),
  at least 1 and at most one less than the stage's layers (Megatron-Core keeps one layer on the GPU).
- precision: bf16 -> ``--bf16``; fp16 -> ``--fp16``; fp8 -> ``--bf16 --fp8-format hybrid --fp8-recipe
  delayed``; fp8_block -> ``--fp8-recipe blockwise``; mxfp8 -> ``--fp8-recipe mxfp8``; nvfp4 -> ``--bf16
  --fp4-format e2m1 --fp4-recipe nvfp4`` (Transformer Engine >= 2.7).
"""

from __future__ import annotations

import shlex

from autopar.emit._common import require_resolved, virtual_chunks
from autopar.errors import AutoparInputError
from autopar.specs.layout import Layout
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

__all__ = ["format_megatron", "megatron_args", "pipeline_layout_string", "precision_args"]

_FP8_RECIPE = {"fp8": "delayed", "fp8_block": "blockwise", "mxfp8": "mxfp8"}


def precision_args(precision: str) -> list[str]:
    """Megatron-LM / Transformer Engine flags for a TrainingSpec precision."""
    if precision == "bf16":
        return ["--bf16"]
    if precision == "fp16":
        return ["--fp16"]
    if precision in _FP8_RECIPE:
        return ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", _FP8_RECIPE[precision]]
    if precision == "nvfp4":
        return ["--bf16", "--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]
    raise AutoparInputError(f"no Megatron-LM flags known for precision '{precision}'")


def pipeline_layout_string(layout: Layout, model: ModelSpec) -> str:
    """``--pipeline-model-parallel-layout`` value: virtual stages in model order, E first, MTP and L last."""
    chunks = virtual_chunks(layout, model.num_layers)
    parts = []
    for k, n in enumerate(chunks):
        text = "E" if k == 0 else ""
        text += "t" if n == 1 else (f"t*{n}" if n > 1 else "")
        if k == len(chunks) - 1:
            text += "m" * model.mtp_layers + "L"
        parts.append(text)
    return "|".join(parts)


def _pipeline_args(layout: Layout, model: ModelSpec) -> list[str]:
    pp, vpp = layout.pp, layout.vpp
    if pp == 1:
        return []
    stages = layout.layers_per_stage(model.num_layers)
    if len(set(stages)) == 1 and stages[0] % vpp == 0:
        return ["--num-layers-per-virtual-pipeline-stage", str(stages[0] // vpp)] if vpp > 1 else []
    if vpp == 1 and len(set(stages[1:-1])) <= 1:
        return ["--decoder-first-pipeline-num-layers", str(stages[0]),
                "--decoder-last-pipeline-num-layers", str(stages[-1])]
    return ["--pipeline-model-parallel-layout", pipeline_layout_string(layout, model)]


def _sharding_args(layout: Layout, fsdp_impl: str) -> list[str]:
    if layout.fsdp or layout.zero_stage == 3:
        if fsdp_impl == "torch":
            if layout.pp > 1 or layout.ep > 1:
                raise AutoparInputError(f"Megatron-LM's --use-torch-fsdp2 does not support pipeline or expert "
                                        f"parallelism (pp={layout.pp}, ep={layout.ep}); use fsdp_impl='megatron'")
            return ["--use-torch-fsdp2"]
        if fsdp_impl != "megatron":
            raise AutoparInputError(f"unknown fsdp_impl '{fsdp_impl}' (choose megatron or torch)")
        args = ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params",
                "--no-gradient-accumulation-fusion", "--use-distributed-optimizer", "--ckpt-format", "fsdp_dtensor"]
        if layout.hsdp_shard is not None and layout.dp // layout.hsdp_shard > 1:
            args += ["--num-distributed-optimizer-instances", str(layout.dp // layout.hsdp_shard)]
        return args
    if layout.zero_stage in (1, 2):
        return ["--use-distributed-optimizer"]
    return []


def _recompute_args(layout: Layout) -> list[str]:
    if layout.recompute == "none":
        return []
    if layout.recompute == "full":
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if layout.recompute == "selective":
        return ["--recompute-granularity", "selective"]
    return ["--recompute-granularity", "selective", "--recompute-modules", *sorted(layout.recompute_modules)]


def megatron_args(layout: Layout, model: ModelSpec, training: TrainingSpec, *,
                  fsdp_impl: str = "megatron") -> list[str]:
    """Megatron-LM argv tokens (``["--tensor-model-parallel-size", "2", ...]``) for a resolved layout."""
    require_resolved(layout, model)
    L = layout
    args = ["--tensor-model-parallel-size", str(L.tp), "--pipeline-model-parallel-size", str(L.pp)]
    args += _pipeline_args(L, model)
    args += ["--context-parallel-size", str(L.cp)]
    if model.is_moe:
        args += ["--expert-model-parallel-size", str(L.ep), "--expert-tensor-parallel-size", str(L.etp)]
    if L.sp:
        args.append("--sequence-parallel")
    args += _sharding_args(L, fsdp_impl)
    args += ["--micro-batch-size", str(L.micro_batch), "--global-batch-size", str(training.global_batch),
             "--seq-length", str(training.seq_len)]
    args += _recompute_args(L)
    if L.offload_activations:
        # Megatron-Core offloads whole layers and keeps at least one on the GPU: the share f of a stage's n layers
        # becomes round(f·n) layers, between 1 and n - 1.
        n = max(L.stage_layers) if L.stage_layers else model.num_layers // L.pp
        args += ["--cpu-offloading", "--cpu-offloading-num-layers",
                 str(max(1, min(round(L.offload_activations * n), n - 1)))]
    args += precision_args(training.precision)
    return args


def format_megatron(args: list[str]) -> str:
    """Shell-ready text: one flag and its values per line, joined by backslash continuations, values quoted."""
    lines: list[list[str]] = []
    for token in args:
        if token.startswith("--") or not lines:
            lines.append([token])
        else:
            lines[-1].append(token)
    return " \\\n".join("  " + " ".join(shlex.quote(t) for t in line) for line in lines) + "\n"
