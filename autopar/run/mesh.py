"""Device meshes of a layout: the dense mesh over (pp, dp, cp, tp) and the expert mesh over (pp, edp, ep, etp).

The rank grid is one line, TP innermost (Megatron-LM order tp-cp-dp-pp)::

    ranks = arange(world).view(pp, dp_replicate, dp_shard, cp, tp)      # dp = dp_replicate * dp_shard

dp is split in two only for HSDP (shard inside groups of ``hsdp_shard`` DP ranks, replicate across); otherwise
dp_replicate = 1. The expert mesh re-slices the same GPUs of each pipeline stage (Pangu Ultra MoE,
arXiv 2504.14960)::

    ranks = arange(world).view(pp, edp, ep, etp)                       # edp = dp·cp·tp / (ep·etp)

so an EP group is ep·etp consecutive ranks inside one stage, ETP innermost.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from autopar.specs.layout import Layout


@dataclass
class Meshes:
    """Every mesh and process group the techniques need. Sub-meshes of size 1 are still valid groups."""

    world: DeviceMesh     # (pp, dp_rep, dp_shard, cp, tp)
    expert: DeviceMesh    # (pp, edp, ep, etp)
    dp_cp: DeviceMesh     # gradients of dense parameters are averaged over dp x cp (flattened)
    fsdp: DeviceMesh      # 1-D (dp·cp) for FSDP, or 2-D (dp_rep, dp_shard·cp) for HSDP
    ep_etp: DeviceMesh    # the all-to-all group of expert parallelism (flattened ep x etp)

    def size(self, axis: str) -> int:
        if axis in ("ep", "etp", "edp"):
            return self.expert[axis].size()
        if axis == "dp":
            return self.world["dp_rep"].size() * self.world["dp_shard"].size()
        return self.world[axis].size()

    def local_rank(self, axis: str) -> int:
        if axis in ("ep", "etp", "edp"):
            return self.expert[axis].get_local_rank()
        if axis == "dp":
            return self.world["dp_rep"].get_local_rank() * self.world["dp_shard"].size() \
                + self.world["dp_shard"].get_local_rank()
        return self.world[axis].get_local_rank()

    def group(self, axis: str) -> dist.ProcessGroup:
        if axis in ("ep", "etp", "edp"):
            return self.expert[axis].get_group()
        return self.world[axis].get_group()


def build_meshes(layout: Layout, device_type: str) -> Meshes:
    """Create both meshes for a resolved layout. Every rank must call this, in the same order."""
    world = dist.get_world_size()
    pp, dp, cp, tp = layout.pp, layout.dp, layout.cp, layout.tp
    if pp * dp * cp * tp != world:
        raise ValueError(f"pp·dp·cp·tp = {pp}·{dp}·{cp}·{tp} = {pp * dp * cp * tp} != world size ({world})")
    dp_shard = layout.hsdp_shard or dp
    grid = torch.arange(world).view(pp, dp // dp_shard, dp_shard, cp, tp)
    mesh = DeviceMesh(device_type, grid, mesh_dim_names=("pp", "dp_rep", "dp_shard", "cp", "tp"))
    ep, etp = layout.ep, layout.etp
    edp = dp * cp * tp // (ep * etp)
    expert = DeviceMesh(device_type, torch.arange(world).view(pp, edp, ep, etp),
                        mesh_dim_names=("pp", "edp", "ep", "etp"))
    dp_cp = mesh["dp_rep", "dp_shard", "cp"]._flatten("dp_cp")
    if layout.hsdp_shard:
        mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
        fsdp = mesh["dp_rep", "dp_shard_cp"]
    else:
        fsdp = dp_cp
    ep_etp = expert["ep", "etp"]._flatten("ep_etp")
    return Meshes(world=mesh, expert=expert, dp_cp=dp_cp, fsdp=fsdp, ep_etp=ep_etp)


def applied_sizes(m: Meshes) -> dict:
    """Group sizes read back from the process groups (not from the layout)."""
    dp = dist.get_world_size(m.world["dp_rep"].get_group()) * dist.get_world_size(m.world["dp_shard"].get_group())
    return {"tp": dist.get_world_size(m.group("tp")), "pp": dist.get_world_size(m.group("pp")), "dp": dp,
            **{axis: dist.get_world_size(m.group(axis)) for axis in ("cp", "ep", "etp", "edp")}}


def local_grad(p: torch.nn.Parameter) -> torch.Tensor:
    """The local tensor of ``p.grad``, laid out like ``p`` (zeros if no gradient), for hand-written gradient
    reductions. A DTensor gradient may come back in another placement than its parameter (the embedding's
    is gathered); it is redistributed to the parameter's placement first."""
    if p.grad is None:
        p.grad = torch.zeros_like(p)
    g = p.grad
    if hasattr(g, "placements") and g.placements != p.placements:
        g = p.grad = g.redistribute(p.device_mesh, p.placements)
    return g._local_tensor if hasattr(g, "_local_tensor") else g
