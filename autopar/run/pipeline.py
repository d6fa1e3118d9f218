"""Pipeline parallelism with ``torch.distributed.pipelining`` (1F1B: Narayanan et al. 2021; interleaved
1F1B with vpp virtual stages per rank: the same paper, sec. 2.2).

Stages are built by hand (as torchtitan does), not traced: each stage is a ``Transformer`` holding only its
layers (keyed by global index, so names and initial values match the full model), the embeddings on the
first stage and the final norm and LM head on the last. ``Layout.stage_layers`` gives the layers per
pipeline rank; with vpp > 1 each rank's layers are split evenly into vpp virtual stages, and virtual stage
k = v·pp + rank holds chunk v of that rank (Megatron-LM's interleaved order).

Schedules: ``Schedule1F1B`` for vpp = 1 (GPipe, ``ScheduleGPipe``, when there are fewer micro-batches than
stages, which torch's 1F1B refuses), ``ScheduleInterleaved1F1B`` for vpp > 1. The schedule splits the
rank's batch into grad_accum micro-batches and scales gradients by 1/grad_accum.

Tied embeddings across stages (Megatron-LM's "embedding group"): the first stage's embedding and the last
stage's LM head are separate parameters with the same initial values; their gradients are summed over the
two ranks after backward, so they stay equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from autopar.run.mesh import local_grad
from autopar.run.model import loss_fn
from autopar.specs.layout import Layout


@dataclass(frozen=True)
class StagePlan:
    index: int            # virtual stage index in pipeline order, 0 .. pp·vpp-1
    layer_ids: list[int]  # global layer indices
    first: bool           # holds the embeddings
    last: bool            # holds the final norm and the LM head


def stage_plans(layout: Layout, num_layers: int, pp_rank: int) -> list[StagePlan]:
    """The (virtual) stages of one pipeline rank, in schedule order."""
    pp, vpp = layout.pp, layout.vpp
    per_rank = layout.layers_per_stage(num_layers)
    sizes = [per_rank[k % pp] // vpp for k in range(pp * vpp)]   # layers of virtual stage k
    starts = [sum(sizes[:k]) for k in range(pp * vpp)]
    plans = []
    for v in range(vpp):
        k = v * pp + pp_rank
        plans.append(StagePlan(k, list(range(starts[k], starts[k] + sizes[k])), k == 0, k == pp * vpp - 1))
    return plans


def schedule_name(layout: Layout) -> str:
    if layout.pp == 1:
        return "none"
    if layout.vpp > 1:
        return "Interleaved1F1B"
    return "1F1B" if layout.grad_accum >= layout.pp else "GPipe"


def build_schedule(modules: list[nn.Module], plans: list[StagePlan], layout: Layout, pp_mesh: DeviceMesh,
                   device: torch.device):
    stages = [PipelineStage(m, p.index, layout.pp * layout.vpp, device, group=pp_mesh.get_group())
              for m, p in zip(modules, plans)]
    n = layout.grad_accum
    name = schedule_name(layout)
    if name == "Interleaved1F1B":
        return ScheduleInterleaved1F1B(stages, n_microbatches=n, loss_fn=loss_fn)
    cls = Schedule1F1B if name == "1F1B" else ScheduleGPipe
    return cls(stages[0], n_microbatches=n, loss_fn=loss_fn)


def pipeline_step(schedule, plans: list[StagePlan], inputs: torch.Tensor, labels: torch.Tensor) -> float | None:
    """Forward and backward of all micro-batches; the mean micro-batch loss on the rank holding the last
    stage, None elsewhere."""
    first = any(p.first for p in plans)
    last = any(p.last for p in plans)
    args = (inputs,) if first else ()
    if last:
        losses: list[torch.Tensor] = []
        schedule.step(*args, target=labels, losses=losses)
        return torch.stack([x.detach().float() for x in losses]).mean().item()
    schedule.step(*args)
    return None


def tied_embedding_group(world_grid: torch.Tensor, tie: bool) -> dist.ProcessGroup | None:
    """{first-stage rank, last-stage rank} of this rank's pipeline, for a model with tied embeddings.
    ``world_grid``: the rank grid with pp first. Every rank creates every pair, in the same order."""
    if not tie or world_grid.shape[0] == 1:
        return None
    firsts, lasts = world_grid[0].flatten().tolist(), world_grid[-1].flatten().tolist()
    mine = None
    for a, b in zip(firsts, lasts):
        g = dist.new_group([a, b])
        if dist.get_rank() in (a, b):
            mine = g
    return mine


@torch.no_grad()
def sync_tied_embedding_grads(modules: list[nn.Module], group: dist.ProcessGroup | None) -> None:
    if group is None:
        return
    for m in modules:
        for layer in (m.tok_embeddings, m.output):
            if layer is not None:
                dist.all_reduce(local_grad(layer.weight), group=group)
