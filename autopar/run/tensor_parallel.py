"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) and sequence parallelism (Korthikanti et al. 2022)
with torch's DTensor styles, as torchtitan's ``apply_tp``.

- Attention: wq/wk/wv column-parallel (each rank keeps a/tp query heads and g/tp KV heads), wo row-parallel;
  linear / SSM mixers the same by heads, Mamba-1 by channels (``_mixer_plan``); parallel mixers each.
- MLP and shared experts: w1/w3 column-parallel, w2 row-parallel.
- Embeddings row-parallel over the vocabulary (and the learned position table over positions), LM head
  column-parallel with the logits gathered (no loss parallelism).
- With SP the norms run on sequence shards (``SequenceParallel``), the block inputs are all-gathered
  before attention / MLP and the row-parallel outputs reduce-scattered back to sequence shards; the
  residual stream between blocks (and between pipeline stages) is the local sequence shard.
- KV heads fewer than tp (g < tp, tp % g == 0): the model is built with tp KV heads, each of the g heads
  copied tp/g times (as Megatron-LM replicates them); the copies' gradients are summed over the tp/g ranks
  sharing a head (``sync_kv_replica_grads``), so the copies stay equal and the math is the g-head model's.
- MoE under SP: each TP rank routes its own sequence shard; the router is replicated (its gradient is
  summed over TP by DTensor), routed experts are left to expert_parallel.py. MoE with TP needs SP
  (as in Megatron-LM), otherwise the TP ranks would route the same tokens twice.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

from autopar.run.mesh import local_grad
from autopar.run.mixers import Mamba1Mixer
from autopar.run.model import Attention, Transformer


def _mlp_plan(prefix: str, sp: bool) -> dict:
    seq = Shard(1) if sp else Replicate()
    plan = {
        f"{prefix}.w1": ColwiseParallel(),
        f"{prefix}.w2": RowwiseParallel(output_layouts=seq),
    }
    if sp:
        plan[prefix] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return plan


def _mixer_plan(prefix: str, mixer: nn.Module, seq) -> dict:
    """Attention and the linear mixers: wq/wk/wv column-parallel, wo row-parallel. Mamba-1 (vLLM's MambaMixer
    split): in_proj, dt_proj and the per-channel A/D holder column-parallel, x_proj row-parallel (its R + 2N
    outputs all-reduced), out_proj row-parallel."""
    if isinstance(mixer, Mamba1Mixer):
        return {f"{prefix}.in_proj": ColwiseParallel(), f"{prefix}.x_proj": RowwiseParallel(),
                f"{prefix}.dt_proj": ColwiseParallel(), f"{prefix}.ssm": ColwiseParallel(),
                f"{prefix}.out_proj": RowwiseParallel(output_layouts=seq)}
    return {f"{prefix}.wq": ColwiseParallel(), f"{prefix}.wk": ColwiseParallel(), f"{prefix}.wv": ColwiseParallel(),
            f"{prefix}.wo": RowwiseParallel(output_layouts=seq)}


def apply_tensor_parallel(model: Transformer, tp_mesh: DeviceMesh, sp: bool) -> None:
    """Shard one pipeline stage (or the whole model) over the TP mesh, in place."""
    if tp_mesh.size() == 1:
        return
    seq = Shard(1) if sp else Replicate()
    top: dict = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if model.pos_embeddings is not None:
        top["pos_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if model.norm is not None:
        if sp:
            top["norm"] = SequenceParallel()
        top["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Replicate(), use_local_output=True)
    parallelize_module(model, tp_mesh, top)
    if model.tie:   # embedding rows and LM-head rows are both sharded over the vocabulary: share them again
        model.output.weight = model.tok_embeddings.weight

    for block in model.layers.values():
        plan: dict = {}
        mixers = [("attention", block.attention)] + [(f"parallel.{j}", m) for j, m in enumerate(block.parallel or ())]
        for prefix, mixer in mixers:
            plan.update(_mixer_plan(prefix, mixer, seq))
            if sp:
                plan[prefix] = PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                                  desired_input_layouts=(Replicate(), None, None))
        if sp:
            plan["attention_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
        if hasattr(block, "moe"):
            if not sp:
                raise ValueError("MoE with tp > 1 needs sequence parallelism (Megatron-LM requires it too)")
            plan["moe"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),),
                                             use_local_output=True)
            plan["moe.router"] = SequenceParallel(use_local_output=True)
            if block.moe.shared is not None:
                plan.update(_mlp_plan("moe.shared", sp))
                if block.moe.shared.w3 is not None:
                    plan["moe.shared.w3"] = ColwiseParallel()
        else:
            plan.update(_mlp_plan("feed_forward", sp))
            if block.feed_forward.w3 is not None:
                plan["feed_forward.w3"] = ColwiseParallel()
        parallelize_module(block, tp_mesh, plan)


def kv_replica_group(tp_mesh: DeviceMesh, kv_heads: int) -> dist.ProcessGroup | None:
    """The group of TP ranks holding copies of the same KV head (None when g >= tp). All ranks call it."""
    tp = tp_mesh.size()
    if kv_heads >= tp:
        return None
    return tp_mesh._unflatten(0, (kv_heads, tp // kv_heads), ("kv_head", "kv_copy"))["kv_copy"].get_group()


@torch.no_grad()
def sync_kv_replica_grads(model: nn.Module, group: dist.ProcessGroup | None) -> None:
    """Sum the gradients of replicated K/V projections over the ranks holding copies of the same head: softmax
    attention's only (a linear or SSM mixer's wk/wv are split by heads, never replicated)."""
    if group is None:
        return
    for mod in model.modules():          # the same order on every rank
        if isinstance(mod, Attention):
            for p in (*mod.wk.parameters(), *mod.wv.parameters()):
                dist.all_reduce(local_grad(p), group=group)
