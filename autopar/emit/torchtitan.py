"""torchtitan settings for a resolved Layout.

Target: **torchtitan 0.3.0** (the current release on PyPI, checked 2026-11-24; its configs are Python functions
returning ``Trainer.Config``, selected with ``--module`` / ``--config``; TOML job files are gone). The emitted text is a
Python module with one function, ``autopar_config()``, that takes torchtitan's own config function for the model
(``torchtitan.models.llama3.config_registry.llama3_70b`` ...) and replaces the parallelism, batch and activation
checkpointing fields with ``dataclasses.replace``, so torchtitan's own ``__post_init__`` checks run when the config is
built. Field names are those of ``torchtitan/config/configs.py`` (``ParallelismConfig``, ``TrainingConfig``,
``CompileConfig``) and ``torchtitan/distributed/activation_checkpoint.py`` (``SelectiveAC``, ``FullAC``, or None)
in the 0.3.0 wheel. Models torchtitan 0.3.0 does not ship a config for get a note instead of a config.

``version="0.2.2"`` keeps the old TOML job file (``[parallelism]``, ``[activation_checkpoint]``, ``[training]``,
written with tomli_w) for torchtitan 0.2.x.

How autopar's layout maps onto torchtitan's:

- DP: FSDP2 over ``data_parallel_shard_degree``, replication over ``data_parallel_replicate_degree``. fsdp / ZeRO-3
  -> shard = dp; HSDP -> shard = hsdp_shard, replicate = dp/hsdp_shard; ZeRO-0 (DDP) -> replicate = dp. torchtitan
  has no ZeRO-1/2: they map to FSDP2 with ``fsdp_reshard_after_forward = "never"`` (parameters stay gathered from
  forward to backward, the ZeRO-2-like trade-off) and a note says so.
- TP: ``tensor_parallel_degree`` and ``enable_sequence_parallel``; where the prediction counts TP overlap
  (``TrainingSpec.tp_comm_overlap``) async TP is switched on (``compile.enable_async_tensor_parallel``, which torchtitan
  allows only with ``compile.enable`` and "model" in ``compile.components``).
- PP: ``pipeline_parallel_schedule`` "1F1B", or "Interleaved1F1B" when vpp > 1; the stage split is written out as
  ``module_fqns_per_model_part`` (one list per virtual stage, model order: tok_embeddings, layers.i, norm, output).
  ``training.disable_cuda_graphs = True`` with PP, and with EP (torchtitan's ``Trainer.Config`` refuses CUDA graphs
  with PP, and with EP unless the model's dispatcher is HybridEP with ``non_blocking_capacity_factor`` or
  MinimalAsyncEP, which autopar cannot see: torchtitan trainer.py ``_validate_cuda_graphs``).
- Batch: ``local_batch_size`` is split into ``local_batch_size / pipeline_parallel_microbatch_size`` pipeline
  micro-batches; torchtitan accumulates ``global / (local·dp)`` steps. With PP, local = micro_batch·grad_accum; without
  PP, local = micro_batch.
- EP: ``expert_parallel_degree``; torchtitan 0.3.0 has no expert-TP degree (experts are FSDP-sharded over
  efsdp = dp_shard·cp·tp/ep), so a layout with etp > 1, or an EP that does not divide dp_shard·cp·tp, cannot be
  expressed and gets a note instead of a config.
- Recompute: none -> ``activation_checkpoint=None``; full -> ``FullAC.Config()``; Megatron's "selective" and module
  lists -> torchtitan's op-level ``SelectiveAC.Config()``, the nearest it has (note).
- Compile (0.3.0): ``compile.enable`` where the prediction priced compiled kernels; ``compile.components`` with
  "loss" where it priced the compiled loss (``TrainingSpec.cross_entropy`` 'compiled', knob ``compiled_loss``),
  ["model"]
  where it priced torch's loss eager beside compiled blocks (``compiled_loss=off``), ["loss"] where it priced the
  compiled loss beside eager blocks (a ``TrainingSpec`` built so; the stack knob compiles the loss only with the model).
- Optimizer: torchtitan 0.2.2 and 0.3.0 default to fused AdamW (``optimizer.implementation = "fused"``); where the
  prediction priced torch's foreach AdamW (``TrainingSpec.optimizer_impl``, the torchtitan stack's default: its
  2024-12 published runs used it) the emitted config sets ``implementation = "foreach"``, so the run is the one priced.
- Precision other than bf16 and activation offload have no config field (model converters / a wrapper); a note says so.
- Hybrid models (Mamba, linear attention, parallel or mixer-less layers) are refused (:func:`hybrid_refusal`): torchtitan
  0.2.2 ships no such model (its models: llama3, llama3_ft, llama4, deepseek_v3, qwen3, gpt_oss, flux, moe), and
  0.3.0's only one is Qwen3.5 (``torchtitan/models/qwen3_5``: GatedDeltaNet + gated attention, ``qwen35_*`` configs),
  which is not in autopar's zoo; none has a Mamba, GLA, KDA or Lightning layer (both wheels checked 2026-11-24).
"""

from __future__ import annotations

import textwrap

from autopar.emit._common import require_resolved, virtual_chunks
from autopar.errors import AutoparInputError
from autopar.specs.hardware import HardwareSpec
from autopar.specs.launcher_rules import torchtitan_problems
from autopar.specs.layout import Layout
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

__all__ = ["TORCHTITAN_MODELS", "TORCHTITAN_VERSION", "TORCHTITAN_VERSIONS", "hybrid_refusal", "model_parts",
           "torchtitan_config"]

TORCHTITAN_VERSION = "0.3.0"
TORCHTITAN_VERSIONS = ("0.3.0", "0.2.2")

# autopar zoo name -> (module, config function) shipped in the torchtitan 0.3.0 wheel (torchtitan/models/*/
# config_registry.py). Zoo models not listed have no torchtitan 0.3.0 config (e.g. Mixtral, Llama 2, GPT-3, Nemotron).
TORCHTITAN_MODELS: dict[str, tuple[str, str]] = {
    "llama3_8b": ("torchtitan.models.llama3.config_registry", "llama3_8b"),
    "llama3_70b": ("torchtitan.models.llama3.config_registry", "llama3_70b"),
    "llama3_405b": ("torchtitan.models.llama3.config_registry", "llama3_405b"),
    "qwen3_30b_a3b": ("torchtitan.models.qwen3.config_registry", "qwen3_30b_a3b"),
    "deepseek_v3": ("torchtitan.models.deepseek_v3.config_registry", "deepseek_v3_671b"),
    "gpt_oss_120b": ("torchtitan.models.gpt_oss.config_registry", "gpt_oss_120b"),
    "moonlight_16b_a3b": ("torchtitan.models.kimi_k2_7.config_registry", "moonlight_16b_a3b"),
}


def hybrid_refusal(model: ModelSpec) -> str | None:
    """Why torchtitan cannot train ``model`` (None unless it is a hybrid)."""
    if not model.is_hybrid:
        return None
    kinds = sorted({"+".join(m.kind for m in model.mixers_of(i)) or "none" for i in range(model.num_layers)})
    return (f"{model.name} is a hybrid model (layer kinds {', '.join(kinds)}); torchtitan has no Mamba or "
            f"linear-attention model for it (0.3.0's only hybrid is Qwen3.5, GatedDeltaNet + gated attention, "
            f"torchtitan/models/qwen3_5; 0.2.2 has none)")


def model_parts(layout: Layout, model: ModelSpec) -> list[list[str]]:
    """Module FQNs of each virtual pipeline stage in model order (stage v·pp + i runs on pipeline rank i)."""
    sizes = virtual_chunks(layout, model.num_layers)
    parts, start = [], 0
    for k, n in enumerate(sizes):
        part = ["tok_embeddings"] if k == 0 else []
        part += [f"layers.{j}" for j in range(start, start + n)]
        start += n
        if k == len(sizes) - 1:
            part += ["norm", "output"]
        parts.append(part)
    return parts


def _dp_axes(layout: Layout) -> tuple[int, int, str | None, list[str]]:
    """(replicate, shard, fsdp_reshard_after_forward or None, notes)."""
    dp = layout.dp
    if layout.hsdp_shard is not None:
        return dp // layout.hsdp_shard, layout.hsdp_shard, None, [f"HSDP: shard over {layout.hsdp_shard}, "
                                                                    f"replicate x{dp // layout.hsdp_shard}"]
    if layout.fsdp or layout.zero_stage == 3:
        return 1, dp, None, ["FSDP (ZeRO-3) over all DP ranks"]
    if layout.zero_stage in (1, 2):
        return 1, dp, "never", [f"ZeRO-{layout.zero_stage} has no torchtitan equivalent: FSDP2 without resharding "
                                "after forward (ZeRO-2-like; parameters stay gathered between forward and backward)"]
    return dp, 1, None, ["ZeRO-0: plain DDP replication"]


def _ep_problems(layout: Layout, shard: int) -> list[str]:
    """Why torchtitan 0.3.0 cannot run this EP layout (ParallelismConfig.expert_parallel_degree docstring)."""
    L = layout
    if L.ep == 1:
        return []
    if L.etp != 1:
        return [f"torchtitan {TORCHTITAN_VERSION} has no expert tensor parallelism (this layout has ETP {L.etp})"]
    dense = shard * L.cp * L.tp
    if dense % L.ep:
        return [f"torchtitan needs expert_parallel_degree ({L.ep}) to divide data_parallel_shard_degree·cp·tp = "
                f"{shard}·{L.cp}·{L.tp} = {dense}"]
    return []


def _ac(layout: Layout) -> tuple[str, str | None]:
    """(Python expression for activation_checkpoint, note)."""
    if layout.recompute == "none":
        return "None", None
    if layout.recompute == "full":
        return "FullAC.Config()", None
    return "SelectiveAC.Config()", (f"autopar recompute '{layout.recompute}' (Megatron module-level) -> torchtitan's "
                                    "op-level selective AC, the nearest it has")


def _local_batch(layout: Layout) -> int:
    return layout.micro_batch * layout.grad_accum if layout.pp > 1 else layout.micro_batch


def _common_notes(layout: Layout, training: TrainingSpec) -> list[str]:
    notes = []
    if layout.offload_activations:
        notes.append(f"this layout offloads {layout.offload_activations:.0%} of the stored activations to host memory; "
                     "torchtitan has no setting for that (wrap the model's forward in "
                     "torch.autograd.graph.save_on_cpu) or the memory prediction does not hold")
    if training.precision != "bf16":
        notes.append(f"precision {training.precision}: torchtitan sets it with a model converter (Float8/MXFP8/NVFP4 "
                     "LinearConverter in model_registry(..., converters=[...])), not a config field; add it to the "
                     "base config function")
    return notes


def _header(layout: Layout, model: ModelSpec, notes: list[str], version: str) -> list[str]:
    return [f"# autopar layout: {layout.short()} on {layout.world} GPUs ({model.name})",
            f"# target: torchtitan {version}" + (" (PyPI), Trainer.Config" if version == TORCHTITAN_VERSION
                                                 else " TOML job file (--job.config_file)"),
            *(f"# note: {n}" for n in notes)]


def _note_only(layout: Layout, model: ModelSpec, problems: list[str], version: str) -> str:
    return "\n".join(_header(layout, model, [], version)
                     + [f"# no config: {p}" for p in problems]) + "\n"


def torchtitan_config(layout: Layout, model: ModelSpec, training: TrainingSpec, hardware: HardwareSpec | None = None,
                      version: str = TORCHTITAN_VERSION) -> str:
    """Text for a resolved layout: a Python module defining ``autopar_config() -> Trainer.Config`` (torchtitan
    0.3.0), or the TOML job file sections (``version="0.2.2"``). A model or layout torchtitan cannot run gets
    comment lines saying why instead."""
    require_resolved(layout, model)
    why = hybrid_refusal(model)
    if why:
        raise AutoparInputError(f"torchtitan cannot train this model: {why}")
    if version == "0.2.2":
        return _toml_v022(layout, model, training)
    if version != TORCHTITAN_VERSION:
        raise AutoparInputError(f"unknown torchtitan version '{version}' (choose {', '.join(TORCHTITAN_VERSIONS)})")
    L = layout
    replicate, shard, reshard, notes = _dp_axes(L)
    problems = _ep_problems(L, shard)
    if model.name not in TORCHTITAN_MODELS:
        problems.insert(0, f"torchtitan {TORCHTITAN_VERSION} ships no config for '{model.name}' (it has "
                           f"{', '.join(sorted(TORCHTITAN_MODELS))}); write a Trainer.Config function for it and set "
                           "the degrees above by hand")
    if problems:
        return _note_only(L, model, problems, version)
    module, func = TORCHTITAN_MODELS[model.name]
    ac, ac_note = _ac(L)
    notes += [n for n in (ac_note,) if n] + _common_notes(L, training)
    async_tp = L.tp > 1 and training.tp_comm_overlap
    if async_tp:
        notes.append("async TP on (the prediction hides TP communication behind the GEMMs); it needs "
                     "torch.compile of the model")
    # The stack knobs the prediction priced (autopar/specs/stack.py): torch.compile of the model when it priced
    # compiled elementwise kernels (or async TP, which needs it).
    compile_model = async_tp or training.elementwise == "compiled"
    # ... and of the loss as priced (knob compiled_loss): compiled ('compiled'), or torch's loss left eager under a
    # compiled model (compiled_loss=off, as torchtitan's Dec 2024 release ran); other loss kernels keep base's list
    components = 'sorted({*base.compile.components, "model"})'
    if training.cross_entropy == "compiled":
        components = 'sorted({*base.compile.components, "model", "loss"})'
    elif training.loss_runtime == "torch" and training.cross_entropy == "unfused":
        components = '["model"]'
    if training.cross_entropy == "compiled" and not compile_model:   # the loss priced compiled beside eager blocks
        components = '["loss"]'
    if training.elementwise != "fused":
        notes.append(f"priced as torchtitan runs: elementwise kernels {training.elementwise}, attention "
                     f"{training.attention_impl}" + (f", Float8 {training.fp8_recipe} (add the float8 model converter "
                                                     f"with recipe_name='{training.fp8_recipe}')"
                                                     if training.precision == "fp8" else "")
                     + (", async TP" if async_tp else ""))
    par: list[tuple[str, object]] = [("data_parallel_replicate_degree", replicate),
                                     ("data_parallel_shard_degree", shard)]
    if reshard is not None:
        par.append(("fsdp_reshard_after_forward", reshard))
    par += [("tensor_parallel_degree", L.tp), ("enable_sequence_parallel", L.sp), ("pipeline_parallel_degree", L.pp),
            ("pipeline_parallel_schedule", "Interleaved1F1B" if L.vpp > 1 else "1F1B"),
            ("pipeline_parallel_microbatch_size", L.micro_batch), ("context_parallel_degree", L.cp),
            ("expert_parallel_degree", L.ep)]
    if L.pp > 1:
        par.append(("module_fqns_per_model_part", model_parts(L, model)))
    train: list[tuple[str, object]] = [("local_batch_size", _local_batch(L)),
                                       ("global_batch_size", training.global_batch), ("seq_len", training.seq_len)]
    if L.pp > 1 or L.ep > 1:
        train.append(("disable_cuda_graphs", True))
    broken = torchtitan_problems({**dict(par), **dict(train), "world_size": L.world})
    if broken:   # never print a config torchtitan would abort on (specs/launcher_rules.py)
        raise AutoparInputError(f"torchtitan {version} would abort on {L.short()}: {'; '.join(broken)}")

    def kwargs(items: list[tuple[str, object]], indent: str) -> list[str]:
        out = []
        for key, value in items:
            if key == "module_fqns_per_model_part":   # one list per stage, folded to fit 80 columns
                out.append(f"{indent}{key}=[")
                for part in value:
                    names = textwrap.wrap(" ".join(f"{name!r}," for name in part), 80 - len(indent) - 8,
                                          break_long_words=False, break_on_hyphens=False)
                    out += [f"{indent}    ["] + [f"{indent}        {line}" for line in names] + [f"{indent}    ],"]
                out.append(f"{indent}],")
            else:
                out.append(f"{indent}{key}={value!r},")
        return out

    lines = _header(L, model, notes, version)
    lines[1] += (f"; save as autopar_plan.py on PYTHONPATH and run torchtitan with "
                 f"--module autopar_plan --config autopar_config on {L.world} GPUs")
    lines += ["from dataclasses import replace", ""]
    if ac != "None":
        lines.append(f"from torchtitan.distributed.activation_checkpoint import {ac.split('.')[0]}")
    lines += [f"from {module} import {func}", "from torchtitan.trainer import Trainer", "", "",
              "def autopar_config() -> Trainer.Config:",
              f'    """{func}() with autopar\'s layout', f'    {L.short()}."""',
              f"    base = {func}()", "    return replace(", "        base,", "        parallelism=replace(",
              "            base.parallelism,", *kwargs(par, "            "), "        ),",
              "        training=replace(", "            base.training,", *kwargs(train, "            "), "        ),",
              f"        activation_checkpoint={ac},"]
    if compile_model or training.cross_entropy == "compiled":
        lines += ["        compile=replace(", "            base.compile,", "            enable=True,",
                  *(["            enable_async_tensor_parallel=True,"] if async_tp else []),
                  f"            components={components},", "        ),"]
    if training.optimizer_impl != "fused":   # torchtitan's default is fused: write only what the prediction differs in
        lines += ["        optimizer=replace(", "            base.optimizer,",
                  f"            implementation={training.optimizer_impl!r},", "        ),"]
    lines.append("    )")
    return "\n".join(lines) + "\n"


def _toml_v022(layout: Layout, model: ModelSpec, training: TrainingSpec) -> str:
    """torchtitan 0.2.x TOML sections (keys of torchtitan/config/job_config.py at v0.2.2)."""
    import tomli_w

    L = layout
    replicate, shard, reshard, notes = _dp_axes(L)
    if L.ep > 1 and L.etp not in (1, L.tp):
        notes.append(f"WARNING: torchtitan 0.2.2 supports expert_tensor_parallel_degree 1 or = tensor_parallel_degree "
                     f"only (got etp {L.etp}, tp {L.tp})")
    if L.tp > 1 and not L.sp:
        notes.append("torchtitan 0.2.2 always uses sequence parallel with TP; this layout has SP off")
    notes += _common_notes(L, training)
    par: dict[str, object] = {"data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": shard}
    if reshard is not None:
        par["fsdp_reshard_after_forward"] = reshard
    par.update(tensor_parallel_degree=L.tp, enable_async_tensor_parallel=False, pipeline_parallel_degree=L.pp,
               pipeline_parallel_schedule="Interleaved1F1B" if L.vpp > 1 else "1F1B",
               pipeline_parallel_microbatch_size=L.micro_batch, context_parallel_degree=L.cp,
               expert_parallel_degree=L.ep, expert_tensor_parallel_degree=L.etp)
    if L.pp > 1:
        par["module_fqns_per_model_part"] = model_parts(L, model)
    ac, ac_note = _ac(L)
    ac_section = ({"mode": L.recompute} if L.recompute in ("none", "full")
                  else {"mode": "selective", "selective_ac_option": "op"})
    if ac_note:
        notes.append(ac_note)
    doc = {"parallelism": par, "activation_checkpoint": ac_section,
           "training": {"local_batch_size": _local_batch(L), "global_batch_size": training.global_batch,
                        "seq_len": training.seq_len}}
    if training.optimizer_impl != "fused":   # [optimizer] implementation, default "fused" in 0.2.2 (job_config.py)
        doc["optimizer"] = {"implementation": training.optimizer_impl}
    header = _header(L, model, notes, "0.2.2")
    return "\n".join(header) + "\n\n" + tomli_w.dumps(doc, multiline_strings=False)
