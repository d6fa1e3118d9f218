"""Data parallelism over dp x cp: ZeRO stages mapped onto torch's FSDP2 (``fully_shard``), or plain all-reduce.

What each ZeRO stage becomes (gradients are averaged over dp·cp: CP ranks hold different tokens of the
same sequences, so they reduce gradients like DP ranks, as in Megatron-LM and torchtitan):

- ZeRO-3 / ``fsdp`` (Rajbhandari et al. 2020; Zhao et al. 2023): ``fully_shard`` per block and on the
  stage root, ``reshard_after_forward=True``: parameters all-gathered in forward, freed, all-gathered again
  in backward; gradients reduce-scattered; optimizer state sharded.
- HSDP (``hsdp_shard``): the same over a 2-D mesh (replicate across groups, shard over
  hsdp_shard·cp ranks inside a group).
- ZeRO-1/2: ``fully_shard`` with ``reshard_after_forward=False``: parameters stay gathered from forward to
  backward (one all-gather per step instead of two), gradients reduce-scattered, optimizer state sharded.
  Between steps the parameters are sharded, which ZeRO-1/2 do not do: memory at rest is that of ZeRO-3,
  peak memory and communication volume those of ZeRO-2.
- ZeRO-0 (DDP): every gradient all-reduced (sum, then / dp·cp) after the last micro-batch; no bucketing
  and no overlap with backward.

Routed-expert parameters are left out (``ignored_params``): expert_parallel.py synchronises them over the
expert-data-parallel group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from autopar.run.expert_parallel import expert_parameters
from autopar.run.mesh import Meshes, local_grad
from autopar.specs.layout import Layout


def describe(layout: Layout, meshes: Meshes) -> str:
    if meshes.dp_cp.size() == 1:
        return "none (dp·cp = 1)"
    if layout.hsdp_shard:
        return f"HSDP: FSDP2 fully_shard over 2-D mesh {tuple(meshes.fsdp.shape)} (replicate, shard)"
    if layout.zero_stage == 3:
        return "ZeRO-3: FSDP2 fully_shard, reshard_after_forward=True"
    if layout.zero_stage in (1, 2):
        return (f"ZeRO-{layout.zero_stage} approximated by FSDP2 fully_shard, reshard_after_forward=False "
                "(params gathered once per step, grads reduce-scattered, optimizer state sharded)")
    return "ZeRO-0: gradients all-reduced over dp·cp after backward (DDP without bucketing)"


def applies(meshes: Meshes, layout: Layout) -> bool:
    """Whether the dense parameters become FSDP2 parameters (ZeRO >= 1 over more than one dp·cp rank)."""
    return meshes.dp_cp.size() > 1 and layout.zero_stage > 0


def apply_data_parallel(model: nn.Module, meshes: Meshes, layout: Layout,
                        mp: MixedPrecisionPolicy | None = None) -> bool:
    """Wrap one stage with FSDP2 for ZeRO >= 1. Returns whether it did (False: use ``allreduce_grads``).
    ``mp``: FSDP2's mixed precision (the parameters stay fp32 shards, gathered in ``mp.param_dtype``)."""
    if not applies(meshes, layout):
        return False
    reshard = layout.zero_stage == 3
    experts = set(expert_parameters(model))
    kw = {"mp_policy": mp} if mp is not None else {}
    for block in model.layers.values():
        fully_shard(block, mesh=meshes.fsdp, reshard_after_forward=reshard,
                    ignored_params=experts & set(block.parameters()) or None, **kw)
    fully_shard(model, mesh=meshes.fsdp, reshard_after_forward=reshard, ignored_params=experts or None, **kw)
    return True


@torch.no_grad()
def allreduce_grads(model: nn.Module, meshes: Meshes) -> None:
    """ZeRO-0: average the gradients of the dense parameters over dp·cp."""
    n = meshes.dp_cp.size()
    if n == 1:
        return
    experts = {id(p) for p in expert_parameters(model)}
    for p in model.parameters():
        if id(p) in experts:
            continue
        g = local_grad(p)
        dist.all_reduce(g, group=meshes.dp_cp.get_group())
        g.div_(n)
