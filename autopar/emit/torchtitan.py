"""torchtitan TOML sections (``[parallelism]``, ``[activation_checkpoint]``, ``[training]``) for a resolved Layout.

Key names were checked against pytorch/torchtitan ``torchtitan/config/job_config.py`` (the 2025 version
whose ``Parallelism`` dataclass has ``expert_tensor_parallel_degree``, ``module_fqns_per_model_part`` and
``pipeline_parallel_first/last_stage_less_layers``; ``ActivationCheckpoint.mode`` is
selective | full | memory_budget | none and ``selective_ac_option`` is "op" or an integer; ``Training`` has
``local_batch_size``, ``global_batch_size``, ``seq_len``).

How autopar's layout maps onto torchtitan's:

- DP: torchtitan shards with FSDP2 over ``data_parallel_shard_degree`` and replicates over
  ``data_parallel_replicate_degree``. fsdp / ZeRO-3 -> shard = dp; HSDP -> shard = hsdp_shard,
  replicate = dp/hsdp_shard; ZeRO-0 (DDP) -> replicate = dp. torchtitan has no ZeRO-1/2: they map to FSDP2
  with ``fsdp_reshard_after_forward = "never"`` (parameters stay gathered from forward to backward, the
  ZeRO-2-like trade-off) and a comment says so.
- PP: ``pipeline_parallel_schedule`` is "1F1B", or "Interleaved1F1B" when vpp > 1; the stage split is written
  out exactly as ``module_fqns_per_model_part`` (one list per virtual stage, model order, with the FQNs of
  torchtitan's llama3 / deepseek_v3 / qwen3 models: tok_embeddings, layers.i, norm, output), so torchtitan's
  own first/last-stage-lighter default does not re-split it.
- Batch: torchtitan splits ``local_batch_size`` into ``local_batch_size / pipeline_parallel_microbatch_size``
  pipeline micro-batches and accumulates ``global / (local·dp)`` steps. With PP, local = micro_batch·grad_accum
  (all of a step's micro-batches go through one pipeline schedule, as in Megatron); without PP,
  local = micro_batch and torchtitan accumulates grad_accum steps.
- SP is implied by TP in torchtitan; a layout with TP > 1 and SP off cannot be expressed (comment).
- Recompute: none | full map directly; Megatron's "selective" (core attention) and module lists map to
  torchtitan's op-level selective AC (``selective_ac_option = "op"``), the nearest it has (comment).

Degrees always multiply to the world: replicate·shard·tp·pp·cp = gpus; EP and ETP borrow from those axes.
"""

from __future__ import annotations

import json

from autopar.emit._common import require_resolved, virtual_chunks
from autopar.specs.layout import Layout
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

__all__ = ["model_parts", "torchtitan_config"]


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


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(type(value))


def _dp_axes(layout: Layout) -> tuple[int, int, str | None, list[str]]:
    """(replicate, shard, fsdp_reshard_after_forward or None, comments)."""
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


def _ep_warnings(layout: Layout, shard: int) -> list[str]:
    """torchtitan's EP constraints (Parallelism.expert_parallel_degree docstring): EP borrows from
    dp_shard·cp (etp = tp) or dp_shard·cp·tp (etp = 1)."""
    L, w = layout, []
    if L.ep == 1:
        return w
    if L.etp not in (1, L.tp):
        w.append(f"WARNING: torchtitan supports expert_tensor_parallel_degree 1 or = tensor_parallel_degree only "
                 f"(got etp {L.etp}, tp {L.tp})")
        return w
    inner = L.cp * (L.tp if L.etp == 1 else 1)
    if L.ep % inner or (shard * inner) % L.ep:
        w.append(f"WARNING: torchtitan needs expert_parallel_degree ({L.ep}) to be a multiple of {inner} and to "
                 f"divide data_parallel_shard_degree·{inner} = {shard * inner}")
    return w


def torchtitan_config(layout: Layout, model: ModelSpec, training: TrainingSpec) -> str:
    """The three TOML sections for a resolved layout (parse with tomllib)."""
    require_resolved(layout, model)
    L = layout
    replicate, shard, reshard, notes = _dp_axes(L)
    notes += _ep_warnings(L, shard)
    if L.tp > 1 and not L.sp:
        notes.append("NOTE: torchtitan always uses sequence parallel with TP; this layout has SP off")
    if L.offload_activations:
        notes.append(f"NOTE: this layout offloads {L.offload_activations:.0%} of the stored activations to host memory; "
                     "torchtitan has no setting for that (wrap the model's forward in "
                     "torch.autograd.graph.save_on_cpu) or the memory prediction does not hold")
    par: list[tuple[str, object]] = [
        ("data_parallel_replicate_degree", replicate),
        ("data_parallel_shard_degree", shard),
    ]
    if reshard is not None:
        par.append(("fsdp_reshard_after_forward", reshard))
    par += [
        ("tensor_parallel_degree", L.tp),
        ("enable_async_tensor_parallel", False),
        ("pipeline_parallel_degree", L.pp),
        ("pipeline_parallel_schedule", "Interleaved1F1B" if L.vpp > 1 else "1F1B"),
        ("pipeline_parallel_microbatch_size", L.micro_batch),
        ("context_parallel_degree", L.cp),
        ("expert_parallel_degree", L.ep),
        ("expert_tensor_parallel_degree", L.etp),
    ]
    if L.pp > 1:
        par.append(("module_fqns_per_model_part", model_parts(L, model)))

    if L.recompute in ("none", "full"):
        ac: list[tuple[str, object]] = [("mode", L.recompute)]
        ac_note = None
    else:
        ac = [("mode", "selective"), ("selective_ac_option", "op")]
        ac_note = (f"autopar recompute '{L.recompute}' (Megatron module-level) -> torchtitan op-level selective AC, "
                   "the nearest it has")

    local = L.micro_batch * L.grad_accum if L.pp > 1 else L.micro_batch
    train = [("local_batch_size", local), ("global_batch_size", training.global_batch),
             ("seq_len", training.seq_len)]

    out = [f"# autopar layout: {L.short()} on {L.world} GPUs ({model.name})",
           "# keys: pytorch/torchtitan torchtitan/config/job_config.py (Parallelism, ActivationCheckpoint, Training)",
           *(f"# {n}" for n in notes), "", "[parallelism]"]
    for key, value in par:
        if key == "module_fqns_per_model_part":
            out.append(f"{key} = [")
            out += [f"  {_toml(part)}," for part in value]
            out.append("]")
        else:
            out.append(f"{key} = {_toml(value)}")
    out += ["", "[activation_checkpoint]"]
    if ac_note:
        out.append(f"# {ac_note}")
    out += [f"{k} = {_toml(v)}" for k, v in ac]
    out += ["", "[training]"]
    if L.pp > 1:
        out.append(f"# one pipeline schedule per step: {L.grad_accum} micro-batches of {L.micro_batch}")
    out += [f"{k} = {_toml(v)}" for k, v in train]
    return "\n".join(out) + "\n"
