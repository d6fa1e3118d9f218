"""What each launcher aborts on at run time, beyond its argument parser: the combination rules of the emitted
settings, each with the upstream line that asserts it. One home for them: the emitters (autopar/emit/) check their
own output against these before printing it, so ``solve --emit`` never prints settings the launcher would abort
(it moves on to the next ranked layout, or withholds an optional flag with a note); the suite feeds every zoo
model's emitted settings through the frameworks' own definitions and these rules (tests/emit/test_launch_ready.py).

Pinned sources (the same commits as the fixtures in tests/emit/fixtures/):

- Megatron-LM ``d98e8a64ddf3`` (Megatron-Core 0.20.0): ``megatron/core/transformer/transformer_config.py``
  (``TransformerConfig.__post_init__``, checked when the model is built), ``megatron/training/arguments.py``
  (``validate_args``), ``megatron/core/pipeline_parallel/schedules.py`` and ``combined_1f1b.py`` (the schedules,
  which assert at the first step).
- Megatron-Bridge ``067f987df03b`` (0.7.0): the model config class each recipe family builds
  (``src/megatron/bridge/recipes/``).
- torchtitan 0.3.0 (``torchtitan/distributed/parallel_dims.py`` ``ParallelDims._validate`` and its mesh sizes;
  ``torchtitan/trainer.py`` ``Trainer.Config.__post_init__``: the PP micro-batch and CUDA graphs; read at the
  0.3.0rc1 commit ``1fdf90d3f9b7``).

A rule reads the settings as a mapping of Megatron's argparse destinations (``pipeline_model_parallel_size``,
``use_megatron_fsdp``, ...) to values, as :func:`megatron_settings` reads them from an argv or Megatron's own parser
gives them (``vars(args)``); a missing key is the option's default (None / False).
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from typing import Callable, Mapping

MEGATRON_LM = "NVIDIA/Megatron-LM@d98e8a64ddf3"
TORCHTITAN = "pytorch/torchtitan@1fdf90d3f9b7 (0.3.0rc1; the 0.3.0 wheel of tests/emit/fixtures)"
MEGATRON_BRIDGE = "NVIDIA-NeMo/Megatron-Bridge@067f987df03b"

Settings = Mapping[str, object]


@dataclass(frozen=True)
class LauncherRule:
    """One run-time combination rule: ``check`` returns why the settings break it (None = they keep it)."""

    name: str
    source: str                      # repo@commit path:line of the assertion
    check: Callable[[Settings], str | None]

    def __call__(self, s: Settings) -> str | None:
        why = self.check(s)
        return None if why is None else f"{why} ({self.source})"


def _get(s: Settings, key: str, default: object = None) -> object:
    v = s.get(key, default)
    return default if v is None else v


def virtual_stages(s: Settings) -> int:
    """Model chunks per pipeline rank as Megatron derives them: from --num-layers-per-virtual-pipeline-stage,
    --num-virtual-stages-per-pipeline-rank, the '|' stages of --pipeline-model-parallel-layout or of a hybrid
    pattern beyond PP (megatron/training/arguments.py validate_args)."""
    pp = int(_get(s, "pipeline_model_parallel_size", 1))
    if _get(s, "num_virtual_stages_per_pipeline_rank"):
        return int(_get(s, "num_virtual_stages_per_pipeline_rank"))
    if _get(s, "num_layers_per_virtual_pipeline_stage"):
        return 2    # more than one: the exact count needs --num-layers; the rules only ask "interleaved or not"
    for key in ("pipeline_model_parallel_layout", "hybrid_layer_pattern"):
        text = _get(s, key)
        if isinstance(text, str):
            stages = len(layout_stages(text)) if key == "pipeline_model_parallel_layout" else text.count("|") + 1
            if stages > pp:
                return stages // pp
    return 1


def layout_stages(text: str) -> list[str]:
    """The stages of a --pipeline-model-parallel-layout string as Megatron reads it
    (megatron/core/transformer/pipeline_parallel_layer_layout.py parse_str_to_list: commas dropped, '(...)*n' unrolled,
    then 'x*n', split at '|'): 'Et|(tt|)*2L' -> ['Et', 'tt', 'tt', 'L']."""
    text = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text)
    return text.split("|")


def _recompute_modules(s: Settings) -> list[str]:
    mods = _get(s, "recompute_modules", [])
    return list(mods) if isinstance(mods, (list, tuple)) else [str(mods)]


def _ep_overlap(s: Settings) -> bool:
    return bool(_get(s, "overlap_moe_expert_parallel_comm", False))


def _fsdp_vpp(s: Settings) -> str | None:
    if _ep_overlap(s) and _get(s, "use_megatron_fsdp", False) and virtual_stages(s) > 1:
        return ("EP overlap's combined 1F1B schedule asserts at the first step against Megatron-FSDP with "
                "virtual pipeline stages (interleaved 1F1B)")
    return None


def _ep_overlap_pp(s: Settings) -> str | None:
    if _ep_overlap(s) and int(_get(s, "pipeline_model_parallel_size", 1)) > 1 and virtual_stages(s) == 1:
        return "EP overlap needs virtual pipeline stages when PP > 1"
    return None


def _ep_overlap_ep(s: Settings) -> str | None:
    if _ep_overlap(s) and int(_get(s, "expert_model_parallel_size", 1)) <= 1:
        return "EP overlap needs expert parallelism (EP > 1)"
    return None


def _ep_overlap_recompute(s: Settings) -> str | None:
    if not _ep_overlap(s):
        return None
    if _get(s, "recompute_granularity") == "full" or _get(s, "recompute_method") is not None:
        return "EP overlap refuses full recompute and any recompute method"
    if "moe" in _recompute_modules(s):
        return "EP overlap refuses 'moe' in the recompute modules"
    return None


def _ep_overlap_precision(s: Settings) -> str | None:
    if _ep_overlap(s) and not (_get(s, "bf16", False) or _get(s, "fp16", False)):
        return "EP overlap needs a bf16 or fp16 model"
    return None


def _ep_overlap_mtp(s: Settings) -> str | None:
    if _ep_overlap(s) and int(_get(s, "mtp_num_layers", 0) or 0) > 1:
        return "EP overlap allows at most one MTP layer"
    return None


def _ep_overlap_partial_ckpt(s: Settings) -> str | None:
    if _ep_overlap(s) and _get(s, "num_microbatches_with_partial_activation_checkpoints") is not None:
        return "EP overlap's combined 1F1B step refuses per-micro-batch activation checkpointing"
    return None


def _interleaved_pp2(s: Settings) -> str | None:
    # --overlap-p2p-communication is on by default (--no-overlap-p2p-communication turns it off); validate_args
    # turns it off by itself without virtual stages, so only the interleaved case is a rule
    if virtual_stages(s) > 1 and not _get(s, "overlap_p2p_comm", True) \
            and int(_get(s, "pipeline_model_parallel_size", 1)) <= 2:
        return "the interleaved schedule without p2p overlap needs PP > 2"
    return None


def _param_gather(s: Settings) -> str | None:
    if _get(s, "overlap_param_gather", False):
        if not (_get(s, "use_distributed_optimizer", False) or _get(s, "use_megatron_fsdp", False)):
            return "--overlap-param-gather needs the distributed optimizer or Megatron-FSDP"
        if not _get(s, "overlap_grad_reduce", False):
            return "--overlap-param-gather needs --overlap-grad-reduce"
    return None


def _tp_comm_overlap(s: Settings) -> str | None:
    if _get(s, "tp_comm_overlap", False) and not _get(s, "sequence_parallel", False):
        return "--tp-comm-overlap needs --sequence-parallel"
    return None


def _torch_fsdp2(s: Settings) -> str | None:
    if not _get(s, "use_torch_fsdp2", False):
        return None
    if int(_get(s, "pipeline_model_parallel_size", 1)) > 1 or int(_get(s, "expert_model_parallel_size", 1)) > 1:
        return "torch FSDP2 refuses pipeline and expert parallelism"
    if _get(s, "use_distributed_optimizer", False):
        return "torch FSDP2 refuses the distributed optimizer"
    return None


def _cuda_graph_recompute(s: Settings) -> str | None:
    impl = _get(s, "cuda_graph_impl", "none")
    if impl not in ("none", "full_iteration") and _get(s, "recompute_granularity") == "full":
        return "per-layer CUDA graphs refuse full recompute (only full-iteration graphs allow it)"
    return None


def _fp8_fp4(s: Settings) -> str | None:
    if _get(s, "fp8") and _get(s, "fp4"):
        return "FP8 and FP4 recipes exclude each other"
    return None


def _fp8_param_gather(s: Settings) -> str | None:
    if not _get(s, "fp8_param_gather", False):
        return None
    if not (_get(s, "use_distributed_optimizer", False) or _get(s, "use_torch_fsdp2", False)
            or _get(s, "use_megatron_fsdp", False)):
        return "--fp8-param-gather needs the distributed optimizer, torch FSDP2 or Megatron-FSDP"
    if not (_get(s, "fp8") or _get(s, "fp8_format")):   # argparse dest 'fp8'; an emitted argv reads as fp8_format
        return ("--fp8-param-gather needs an FP8 recipe (transformer_config.py:1566: 'fp8_param must be used "
                "together with fp8 mode')")
    return None


_TC = f"{MEGATRON_LM} megatron/core/transformer/transformer_config.py"
_ARGS = f"{MEGATRON_LM} megatron/training/arguments.py"
_SCHED = f"{MEGATRON_LM} megatron/core/pipeline_parallel"

MEGATRON_RULES: tuple[LauncherRule, ...] = (
    LauncherRule("ep_overlap_fsdp_interleaved", f"{_SCHED}/combined_1f1b.py:210", _fsdp_vpp),
    LauncherRule("ep_overlap_partial_checkpoints", f"{_SCHED}/combined_1f1b.py:343", _ep_overlap_partial_ckpt),
    LauncherRule("ep_overlap_pp_needs_vpp", f"{_TC}:3007", _ep_overlap_pp),
    LauncherRule("ep_overlap_needs_ep", f"{_TC}:3013", _ep_overlap_ep),
    LauncherRule("ep_overlap_recompute", f"{_TC}:3021", _ep_overlap_recompute),
    LauncherRule("ep_overlap_half_precision", f"{_TC}:3035", _ep_overlap_precision),
    LauncherRule("ep_overlap_mtp", f"{_TC}:3042", _ep_overlap_mtp),
    LauncherRule("interleaved_pp2_p2p_overlap", f"{_ARGS}:1005", _interleaved_pp2),
    LauncherRule("overlap_param_gather", f"{_ARGS}:1024", _param_gather),
    LauncherRule("tp_comm_overlap_sp", f"{_ARGS}:1441", _tp_comm_overlap),
    LauncherRule("torch_fsdp2", f"{_ARGS}:1031", _torch_fsdp2),
    LauncherRule("cuda_graphs_full_recompute", f"{_TC}:2855", _cuda_graph_recompute),
    LauncherRule("fp8_fp4", f"{_ARGS}:1100", _fp8_fp4),
    LauncherRule("fp8_param_gather", f"{_ARGS}:1095", _fp8_param_gather),
)

# the subset that decides whether --overlap-moe-expert-parallel-comm may be emitted for a layout
EP_OVERLAP_RULES = tuple(r for r in MEGATRON_RULES if r.name.startswith("ep_overlap"))


def megatron_settings(argv: list[str]) -> dict[str, object]:
    """Megatron's argparse destinations from an emitted argv, the way its parser stores them: ``--a-b v`` ->
    ``a_b = v`` (a value that reads as an integer becomes one; several values a list), a bare ``--a-b`` -> True,
    ``--no-a-b`` -> ``a_b = False``. Enough for :data:`MEGATRON_RULES`; the suite checks the same rules on the
    namespace of Megatron's real parser."""
    out: dict[str, object] = {}
    i = 0
    while i < len(argv):
        flag = argv[i]
        i += 1
        if not flag.startswith("--"):
            continue
        values = []
        while i < len(argv) and not argv[i].startswith("--"):
            values.append(int(argv[i]) if argv[i].lstrip("-").isdigit() else argv[i])
            i += 1
        key = flag[2:].replace("-", "_")
        if not values:
            if key.startswith("no_"):
                out[key[3:]] = False
            else:
                out[key] = True
        else:
            out[key] = values[0] if len(values) == 1 else values
    return out


def megatron_problems(settings: Settings, rules: tuple[LauncherRule, ...] = MEGATRON_RULES) -> list[str]:
    """Every run-time rule of Megatron-LM the settings break, each with its upstream line (empty = it runs)."""
    return [msg for rule in rules if (msg := rule(settings)) is not None]


# ---- Megatron-Bridge: the model config class of each recipe family ------------------------------------------
# Megatron-Bridge's Llama 2/3 recipes (src/megatron/bridge/recipes/llama/h100/llama2.py and llama3.py:
# ``cfg.model = AutoBridge.from_hf_pretrained(...).get_model_config()``) build ``BridgeGPTModelConfig``
# (src/megatron/bridge/models/gpt/model_config.py), which keeps the Megatron-Core TransformerConfig under
# ``model.transformer``: a ``model.X`` override of a TransformerConfig field is rejected there (6 of the 19 model
# overrides autopar used to print) and run_recipe.py stops. Every other recipe family builds a provider
# (``to_megatron_provider``) that takes each field as ``model.X``. At 067f987df03b: src/megatron/bridge/recipes/llama/
# h100/llama3.py:52 (get_model_config) and src/megatron/bridge/models/gpt/model_config.py:27 (BridgeGPTModelConfig).
# The fields BridgeGPTModelConfig itself declares (Megatron-LM 2a75ac12c54b megatron/training/models/gpt.py:154-187,
# GPTModelConfig, and its ModelConfig base): these stay model.X; every other model key is model.transformer.X.
# tests/emit/test_launch_ready.py checks this list against the fixture generated from the pinned sources.
BRIDGE_GPT_CONFIG_FIELDS = frozenset({
    "vocab_size", "make_vocab_size_divisible_by", "should_pad_vocab", "seq_length", "fp16_lm_cross_entropy",
    "logit_dtype", "parallel_output", "share_embeddings_and_output_weights", "position_embedding_type",
    "rotary_percent", "rotary_base", "rope_scaling", "rope_scaling_factor", "scatter_embedding_sequence_parallel",
    "seq_len_interpolation_factor", "tp_comm_overlap_cfg", "use_arbitrary_attention_mask", "transformer",
    "transformer_layer_spec", "restore_modelopt_state", "pre_wrap_hooks", "post_wrap_hooks",
    "extra_checkpoint_metadata"})


def bridge_recipe_family(model) -> str:
    """Which kind of model config the model's Megatron-Bridge recipe builds: "llama_nested" for Llama 2 / 3 (zoo
    llama2_* / llama3_*, or a Hugging Face config of model_type llama), "hybrid" for HybridModelProvider recipes,
    else "provider"."""
    if model.is_hybrid:
        return "hybrid"
    if re.match(r"(meta-)?llama[-_ .]?[23]", model.name.lower()) or "(model_type llama)" in (model.source or ""):
        return "llama_nested"
    return "provider"


def bridge_model_key(field: str, family: str) -> str:
    """The override key of one model field for a recipe family (see :func:`bridge_recipe_family`)."""
    if family == "llama_nested" and field not in BRIDGE_GPT_CONFIG_FIELDS:
        return f"model.transformer.{field}"
    return f"model.{field}"


# ---- torchtitan: ParallelDims and Trainer.Config ---------------------------------------------------------------
def _tt_world(s: Settings) -> str | None:
    n = (int(_get(s, "data_parallel_replicate_degree", 1)) * int(_get(s, "data_parallel_shard_degree", 1))
         * int(_get(s, "context_parallel_degree", 1)) * int(_get(s, "tensor_parallel_degree", 1))
         * int(_get(s, "pipeline_parallel_degree", 1)))
    world = int(_get(s, "world_size", n))
    if n != world:
        return f"dp_replicate·dp_shard·cp·tp·pp = {n} != WORLD_SIZE ({world})"
    return None


def _tt_ep(s: Settings) -> str | None:
    ep = int(_get(s, "expert_parallel_degree", 1))
    borrow = (int(_get(s, "data_parallel_shard_degree", 1)) * int(_get(s, "context_parallel_degree", 1))
              * int(_get(s, "tensor_parallel_degree", 1)))
    if ep > 1 and borrow % ep:
        return f"ep ({ep}) must divide dp_shard·cp·tp = {borrow} (the efsdp mesh is dp_shard·cp·tp / ep)"
    return None


def _tt_microbatch(s: Settings) -> str | None:
    if int(_get(s, "pipeline_parallel_degree", 1)) > 1:
        local, mb = int(_get(s, "local_batch_size", 1)), int(_get(s, "pipeline_parallel_microbatch_size", 1))
        if local % mb:
            return f"local_batch_size ({local}) is not a multiple of pipeline_parallel_microbatch_size ({mb})"
    return None


def _tt_cuda_graphs(s: Settings) -> str | None:
    if _get(s, "disable_cuda_graphs", False):
        return None
    if int(_get(s, "pipeline_parallel_degree", 1)) > 1:
        return "CUDA graphs (on by default) refuse pipeline parallelism: set training.disable_cuda_graphs"
    if int(_get(s, "expert_parallel_degree", 1)) > 1:
        return ("CUDA graphs (on by default) refuse EP unless the model's dispatcher is HybridEP with "
                "non_blocking_capacity_factor or MinimalAsyncEP: set training.disable_cuda_graphs")
    return None


_PD = f"{TORCHTITAN} torchtitan/distributed/parallel_dims.py"
TORCHTITAN_RULES: tuple[LauncherRule, ...] = (
    LauncherRule("world_size", f"{_PD}:186", _tt_world),
    LauncherRule("ep_borrows_dp_shard_cp_tp", f"{_PD}:401", _tt_ep),
    LauncherRule("pp_microbatches", f"{TORCHTITAN} torchtitan/trainer.py:130 (Trainer.Config.__post_init__)",
                 _tt_microbatch),
    LauncherRule("cuda_graphs", f"{TORCHTITAN} torchtitan/trainer.py:180-203 (_validate_cuda_graphs)", _tt_cuda_graphs),
)


def torchtitan_problems(settings: Settings) -> list[str]:
    """Every torchtitan ParallelDims / Trainer.Config rule the settings (parallelism and training fields, plus
    ``world_size``) break, each with its upstream line."""
    return megatron_problems(settings, TORCHTITAN_RULES)
