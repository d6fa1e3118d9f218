"""Megatron-LM command-line arguments for a resolved Layout: the parallel, batch, precision, overlap and memory flags
that autopar's prediction assumes.

Target: **Megatron-Core 0.20.0**, NVIDIA/Megatron-LM commit d98e8a64ddf3 (2026-08-22), ``pretrain_gpt.py``. Every
flag is checked against that commit's own parser (``megatron/training/arguments.py``, extracted into
``tests/emit/fixtures/megatron_args.json`` by ``tools/gen_megatron_args.py``), and the cross-flag rules below
are transcribed from its ``validate_args`` and ``TransformerConfig.__post_init__``. Model-shape flags
(``--num-layers``, ``--hidden-size`` ...) are not emitted: they come from the model's recipe.

Layout field -> flags:

- tp, pp, cp -> ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``, ``--context-parallel-size``.
- ep, etp (MoE only) -> ``--expert-model-parallel-size``, ``--expert-tensor-parallel-size`` (always written:
  Megatron's default ETP is TP, autopar's is 1); ``--moe-token-dispatcher-type alltoall`` (autopar's EP term is
  an all-to-all dispatch + combine, autopar/cost/ep.py; Megatron's default is allgather) and ``--moe-grouped-gemm``.
- vpp with even stages that divide by vpp -> ``--num-layers-per-virtual-pipeline-stage L/(pp·vpp)``.
- uneven stages where only the first and last differ, vpp 1 -> ``--decoder-first-pipeline-num-layers`` and
  ``--decoder-last-pipeline-num-layers``.
- any other split -> ``--pipeline-model-parallel-layout`` with one ``|``-separated entry per virtual stage in model
  order (entry v·pp + i is virtual stage v of pipeline rank i, see :func:`autopar.emit._common.virtual_chunks`);
  E = embedding, t = transformer layer, m = MTP layer, L = loss.
- sequence_parallel -> ``--sequence-parallel``.
- zero_stage 1 or 2 -> ``--use-distributed-optimizer``. fsdp / zero_stage 3 -> Megatron-FSDP
  (``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params --no-gradient-accumulation-fusion
  --use-distributed-optimizer --ckpt-format fsdp_dtensor``), or with ``fsdp_impl="torch"`` ``--use-torch-fsdp2
  --no-gradient-accumulation-fusion`` (Megatron rejects it with PP > 1, EP > 1 or fp16). hsdp_shard ->
  ``--num-distributed-optimizer-instances dp/hsdp_shard``.
- micro_batch, global batch, seq_len -> ``--micro-batch-size``, ``--global-batch-size``, ``--seq-length``.
- recompute: selective -> ``--recompute-granularity selective``; a module list -> ``... --recompute-modules m1 m2``;
  full -> ``--recompute-granularity full --recompute-method uniform --recompute-num-layers 1``.
- grad_dtype: bf16 -> ``--grad-reduce-in-bf16`` (Megatron-Core 0.20 otherwise accumulates and reduces in fp32);
  fp32 -> ``--accumulate-allreduce-grads-in-fp32``.
- precision: bf16 -> ``--bf16``; fp16 -> ``--fp16``; fp8 -> ``--bf16 --fp8-format hybrid --fp8-recipe delayed``;
  fp8_block -> ``--fp8-recipe blockwise``; mxfp8 -> ``--fp8-recipe mxfp8``; nvfp4 -> ``--bf16 --fp4-format e2m1
  --fp4-recipe nvfp4``.

Overlap (emitted where ``TrainingSpec``'s switches say the run overlaps, since the prediction then hides what the
compute window covers; autopar.cost.tp, dp, ep):

- ``dp_comm_overlap`` and DP or expert-DP > 1 -> ``--overlap-grad-reduce``, plus ``--overlap-param-gather`` with the
  distributed optimizer or Megatron-FSDP (Megatron requires both for the latter).
- ``hidden_dropout`` -> ``--hidden-dropout`` (always: Megatron-LM's default 0.1 is not autopar's 0.0);
  ``bias_activation_fusion`` off -> ``--no-bias-swiglu-fusion`` (gated MLP) or ``--no-bias-gelu-fusion`` (plain:
  ``megatron/training/argument_utils.py`` sets TransformerConfig.bias_activation_fusion from the one that matches
  ``--swiglu``); ``bias_dropout_add_fusion`` off -> ``--no-bias-dropout-fusion``.
- ``fp8_param_gather`` (TE FP8 precisions) -> ``--fp8-param-gather``; Megatron allows it only with the distributed
  optimizer or FSDP (launcher rule ``fp8_param_gather``): a ZeRO-0 layout is refused.
- ``tp_comm_overlap`` and TP > 1 -> ``--tp-comm-overlap`` (Transformer Engine userbuffers); Megatron allows it only
  with sequence parallel, so a layout with SP off gets a note that its TP time is predicted too low.
- ``ep_comm_overlap`` and EP > 1 -> ``--overlap-moe-expert-parallel-comm`` (combined 1F1B all-to-all overlap), which Megatron allows
  only with VPP > 1 when PP > 1, without full recompute or 'moe' in the recompute modules, with at most one MTP
  layer, and (its combined 1F1B schedule asserts this at the first step) not with Megatron-FSDP on an interleaved
  pipeline; otherwise a note, and the prediction counts the all-to-all exposed (the cost model asks the same rules,
  autopar.cost.ep.ep_overlap_blockers). The rules, with their upstream lines, are
  autopar/specs/launcher_rules.py; the finished argv is checked against all of them before it is printed.
- ``CUDA_DEVICE_MAX_CONNECTIONS=1`` when TP or CP > 1 without FSDP or EP overlap (Megatron asserts it on Hopper).

Activation offload (offload_activations f > 0) -> Megatron-Core fine-grained activation offloading:
``--fine-grained-activation-offloading --offload-modules ... --activation-offload-fraction f`` and
``NVTE_CPU_OFFLOAD_V1=1``. It works with PP and selective recompute. The layer-level path
(``--cpu-offloading-num-layers``; there is no ``--cpu-offloading`` flag) is not used: Megatron refuses it with
PP > 1 or any recompute. Offload with full recompute is refused (Megatron supports neither path with it). Megatron's
fraction counts offload groups in execution order, not bytes: an approximation of autopar's byte share.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from autopar.emit._common import require_resolved, virtual_chunks
from autopar.emit.megatron_hybrid import (HYBRID_SCRIPT, HYBRID_SPEC, hybrid_layer_pattern, hybrid_mixer_args,
                                          hybrid_notes)
from autopar.errors import AutoparInputError
from autopar.specs.hardware import HardwareSpec
from autopar.specs.launcher_rules import EP_OVERLAP_RULES, megatron_problems, megatron_settings
from autopar.specs.layout import Layout
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

__all__ = ["MEGATRON_TARGET", "MegatronLaunch", "format_megatron", "format_megatron_launch", "megatron_args",
           "megatron_launch", "pipeline_layout_string", "precision_args"]

MEGATRON_TARGET = "Megatron-Core 0.20.0 (NVIDIA/Megatron-LM d98e8a64ddf3, 2026-08-22)"

_FP8_RECIPE = {"fp8": "delayed", "fp8_block": "blockwise", "mxfp8": "mxfp8"}


@dataclass
class MegatronLaunch:
    """Argv tokens for ``script`` (``pretrain_gpt.py``, or ``pretrain_hybrid.py`` for hybrid Mamba / linear-attention
    models), the environment they need, and notes where Megatron cannot do what the prediction assumes."""

    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    script: str = "pretrain_gpt.py"


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
    return _repeat_runs(parts)


def _repeat_runs(parts: list[str]) -> str:
    """Join virtual stages with '|', writing a run of c equal stages as Megatron's repeat group '(p|)*c' where that is
    shorter (megatron/core/transformer/pipeline_parallel_layer_layout.py parse_str_to_list unrolls '(...)*n', then
    'x*n'): 'Et|(t*2|)*29t*2mL' for 61 layers on 32 stages."""
    out, i = [], 0
    while i < len(parts):
        j = i
        while j + 1 < len(parts) and parts[j + 1] == parts[i]:
            j += 1
        count, last = j - i + 1, j == len(parts) - 1
        reps = count - 1 if last else count          # the final stage is written bare (no '|' after it)
        group = f"({parts[i]}|)*{reps}"
        if reps >= 2 and len(group) < reps * (len(parts[i]) + 1):
            out.append(group)
        else:
            out.append("".join(f"{parts[i]}|" for _ in range(reps)))
        if last:
            out.append(parts[i])
        i = j + 1
    return "".join(out)


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


def _sharding_args(layout: Layout, training: TrainingSpec, fsdp_impl: str) -> list[str]:
    if layout.fsdp or layout.zero_stage == 3:
        if fsdp_impl == "torch":
            if layout.pp > 1 or layout.ep > 1:
                raise AutoparInputError(f"Megatron-LM's --use-torch-fsdp2 does not support pipeline or expert "
                                        f"parallelism (pp={layout.pp}, ep={layout.ep}); use fsdp_impl='megatron'")
            if training.precision == "fp16":
                raise AutoparInputError("Megatron-LM's --use-torch-fsdp2 does not support fp16; use bf16 or "
                                        "fsdp_impl='megatron'")
            return ["--use-torch-fsdp2", "--no-gradient-accumulation-fusion"]
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


def _offload_args(layout: Layout, model: ModelSpec) -> list[str]:
    """Fine-grained activation offloading (docs/user-guide/features/fine_grained_activation_offloading.md)."""
    L = layout
    if L.recompute == "full":
        raise AutoparInputError(
            f"Megatron-Core cannot offload activations under full recompute ({L.short()}): fine-grained offloading "
            "supports selective recompute only and --cpu-offloading-num-layers refuses any recompute (and PP > 1); "
            "pick a layout without offload or with selective recompute")
    mods = L.recompute_modules
    modules = ["qkv_linear", "core_attn", "attn_proj"]
    if "layernorm" not in mods:
        modules = ["attn_norm", *modules, "mlp_norm"]
    if model.is_moe and "moe" not in mods:
        modules.append("expert_fc1")
        if "moe_act" not in mods:
            modules.append("moe_act")
    return ["--fine-grained-activation-offloading", "--offload-modules", *modules,
            "--activation-offload-fraction", f"{L.offload_activations:g}"]


def _kernel_switch_args(model: ModelSpec, training: TrainingSpec) -> list[str]:
    """The recipe switches the prediction prices (autopar.cost.compute: the unfused activation, the bias-dropout-add
    and its dropout): ``--hidden-dropout`` always (Megatron-LM's default is 0.1, autopar's 0.0), and the fusions'
    ``--no-bias-swiglu-fusion`` (gated MLP) or ``--no-bias-gelu-fusion`` (plain) and ``--no-bias-dropout-fusion``
    where the training spec turns them off."""
    args = ["--hidden-dropout", f"{training.hidden_dropout:g}"]
    if not training.bias_activation_fusion:
        args.append("--no-bias-swiglu-fusion" if model.gated_mlp else "--no-bias-gelu-fusion")
    if not training.bias_dropout_add_fusion:
        args.append("--no-bias-dropout-fusion")
    return args


def megatron_launch(layout: Layout, model: ModelSpec, training: TrainingSpec, hardware: HardwareSpec | None = None,
                    *, fsdp_impl: str = "megatron") -> MegatronLaunch:
    """Megatron-LM argv, environment and notes for a resolved layout. ``training``'s overlap switches decide which
    overlaps are emitted (the prediction counts them); ``hardware`` is accepted for the callers' symmetry. Raises
    AutoparInputError for a combination Megatron-Core 0.20 refuses."""
    require_resolved(layout, model)
    L = layout
    env: dict[str, str] = {}
    notes: list[str] = []
    torch_fsdp = (L.fsdp or L.zero_stage == 3) and fsdp_impl == "torch"
    megatron_fsdp = (L.fsdp or L.zero_stage == 3) and fsdp_impl == "megatron"

    args = ["--tensor-model-parallel-size", str(L.tp), "--pipeline-model-parallel-size", str(L.pp)]
    if model.is_hybrid:   # HybridModel: the pattern carries the layers and the stage split (megatron_hybrid.py)
        mixer_args = hybrid_mixer_args(L, model)   # raises for a model Megatron-Core cannot build
        args += ["--spec", *HYBRID_SPEC, "--hybrid-layer-pattern", hybrid_layer_pattern(L, model), *mixer_args]
        notes += hybrid_notes(model)
    else:
        args += _pipeline_args(L, model)
    args += ["--context-parallel-size", str(L.cp)]
    ep_overlap = False
    if model.is_moe:
        args += ["--expert-model-parallel-size", str(L.ep), "--expert-tensor-parallel-size", str(L.etp),
                 "--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm"]
        if L.ep > 1 and training.ep_comm_overlap:
            ep_overlap = True       # withheld below if a run-time rule of Megatron refuses it for this layout
            args.append("--overlap-moe-expert-parallel-comm")
    if L.sp:
        args.append("--sequence-parallel")
    if L.tp > 1 and training.tp_comm_overlap:
        if L.sp:
            args.append("--tp-comm-overlap")
        else:
            notes.append("the prediction hides TP communication behind the GEMMs, but Megatron overlaps it only "
                         "with sequence parallel, which this layout turns off: expect a longer step")
    args += _sharding_args(L, training, fsdp_impl)
    expert_dp = L.edp if model.is_moe else 1
    if (L.dp > 1 or expert_dp > 1) and training.dp_comm_overlap and not torch_fsdp:
        args.append("--overlap-grad-reduce")
        if megatron_fsdp or L.zero_stage in (1, 2):
            args.append("--overlap-param-gather")
    args += ["--micro-batch-size", str(L.micro_batch), "--global-batch-size", str(training.global_batch),
             "--seq-length", str(training.seq_len)]
    args += _recompute_args(L)
    if L.offload_activations:
        args += _offload_args(L, model)
        env["NVTE_CPU_OFFLOAD_V1"] = "1"
        notes.append(f"activation offload: Megatron's --activation-offload-fraction counts offload groups in "
                     f"execution order, not bytes; {L.offload_activations:g} approximates autopar's byte share")
    if training.optimizer_state_dtype != "fp32" or training.master_weights_dtype != "fp32":
        # NeMo 24.07's distributed_fused_adam settings (apex, stack knobs optimizer_state_dtype / master_weights_dtype):
        # Megatron-LM keeps fp32 main parameters, so its flags would hold more than the prediction counts.
        raise AutoparInputError(
            f"optimizer_state_dtype={training.optimizer_state_dtype}, master_weights_dtype="
            f"{training.master_weights_dtype}: no Megatron-LM flags emitted for them (Megatron-LM keeps fp32 main "
            f"parameters); leave these knobs at fp32 to emit")
    args += _kernel_switch_args(model, training)
    if training.precision in ("bf16",) + tuple(_FP8_RECIPE) + ("nvfp4",):
        args.append("--grad-reduce-in-bf16" if training.grad_dtype == "bf16"
                    else "--accumulate-allreduce-grads-in-fp32")
    args += precision_args(training.precision)
    if training.fp8_primary_weights:   # FP8 primary weights, FP8 parameter all-gather (autopar.cost.memory)
        args.append("--fp8-param-gather")
    if ep_overlap:   # Megatron's run-time rules for the overlap (specs/launcher_rules.py, with the upstream lines)
        settings = megatron_settings(args)
        if model.mtp_layers:
            settings["mtp_num_layers"] = model.mtp_layers   # the recipe's --mtp-num-layers (the model has them)
        blockers = megatron_problems(settings, EP_OVERLAP_RULES)
        if blockers:
            ep_overlap = False
            args.remove("--overlap-moe-expert-parallel-comm")
            notes.append(f"no EP all-to-all overlap: Megatron cannot run it here ({'; '.join(blockers)}); the "
                         "prediction counts the all-to-all exposed")
    if (L.tp > 1 or L.cp > 1) and not (torch_fsdp or megatron_fsdp or ep_overlap):
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    problems = megatron_problems(megatron_settings(args))
    if problems:   # never print settings Megatron would abort on: solve then takes the next ranked layout
        raise AutoparInputError(f"Megatron-LM would abort on {L.short()}: {'; '.join(problems)}")
    return MegatronLaunch(args=args, env=env, notes=notes,
                          script=HYBRID_SCRIPT if model.is_hybrid else "pretrain_gpt.py")


def megatron_args(layout: Layout, model: ModelSpec, training: TrainingSpec, hardware: HardwareSpec | None = None,
                  *, fsdp_impl: str = "megatron") -> list[str]:
    """Megatron-LM argv tokens (``["--tensor-model-parallel-size", "2", ...]``) for a resolved layout."""
    return megatron_launch(layout, model, training, hardware, fsdp_impl=fsdp_impl).args


def format_megatron(args: list[str]) -> str:
    """Shell-ready text: one flag and its values per line, joined by backslash continuations, values quoted."""
    lines: list[list[str]] = []
    for token in args:
        if token.startswith("--") or not lines:
            lines.append([token])
        else:
            lines[-1].append(token)
    return " \\\n".join("  " + " ".join(shlex.quote(t) for t in line) for line in lines) + "\n"


def format_megatron_launch(launch: MegatronLaunch, title: str) -> str:
    """A bash fragment: comments (target version and script, notes), ``export`` lines, then
    ``AUTOPAR_MEGATRON_ARGS=( ... )`` with one flag per line, to pass as
    ``<launch.script> ... "${AUTOPAR_MEGATRON_ARGS[@]}"``."""
    out = [f"# {title}", f"# target: {MEGATRON_TARGET}, {launch.script}; add the model-shape, data and optimizer "
                         "flags of your recipe"]
    out += [f"# note: {n}" for n in launch.notes]
    out += [f"export {k}={shlex.quote(v)}" for k, v in launch.env.items()]
    body = format_megatron(launch.args).replace(" \\\n", "\n")
    out += ["AUTOPAR_MEGATRON_ARGS=(", body.rstrip("\n"), ")"]
    return "\n".join(out) + "\n"
