"""Expert parallelism (GShard, Lepikhin et al. 2020) and expert tensor parallelism over the expert mesh.

Each EP rank keeps E/ep routed experts; each ETP rank keeps an f/etp slice of their FFN width (w1/w3 by
columns, w2 by rows, so its output is a partial sum). A token goes, by one all-to-all over the ep·etp
group, to the etp ranks that hold slices of its expert; the partial outputs come back by the mirror
all-to-all and are summed. (Megatron-LM all-gathers the dispatched tokens inside the ETP group and
reduce-scatters the outputs instead; the arithmetic is the same, the collective differs.)

Dispatch, as in the tutorial's EP skeleton:
  1. sort the token copies (top-k) by expert; tokens per (destination rank, local expert) are exchanged
     first (a small all-to-all of counts);
  2. all-to-all the tokens (``all_to_all_single_autograd`` from torch's functional collectives:
     differentiable, its backward is the mirror all-to-all);
  3. regroup the received tokens by local expert, run the experts, undo the regrouping;
  4. all-to-all back, sum the etp partials, undo the sort, weight by the router and sum the k copies.

Routed-expert gradients are synchronised here, not by FSDP/DDP: summed over the expert-data-parallel group
(replicas of the same expert slice) and divided by dp·cp (the number of independent loss terms averaged in
the global loss). Their parameters are not sharded by FSDP (ZeRO over experts is not applied).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import all_to_all_single_autograd
import torch.nn as nn

from autopar.run.mesh import Meshes
from autopar.run.model import GroupedExperts, MoE, Transformer, combine, sort_by_expert


def _slice_param(p: nn.Parameter | None, index: tuple) -> nn.Parameter | None:
    return None if p is None else nn.Parameter(p.detach()[index].clone())


def apply_expert_parallel(model: Transformer, meshes: Meshes) -> None:
    """Keep this rank's experts (and FFN slice) in every MoE block and switch to all-to-all dispatch."""
    ep, etp = meshes.size("ep"), meshes.size("etp")
    if ep * etp == 1:
        return
    ep_rank, etp_rank = meshes.local_rank("ep"), meshes.local_rank("etp")
    group = meshes.ep_etp.get_group()
    for block in model.layers.values():
        if not hasattr(block, "moe"):
            continue
        ex: GroupedExperts = block.moe.experts
        E, f = ex.w1.shape[0], ex.w1.shape[2]
        el, fl = E // ep, f // etp
        e, c = slice(ep_rank * el, (ep_rank + 1) * el), slice(etp_rank * fl, (etp_rank + 1) * fl)
        ex.w1, ex.w3 = _slice_param(ex.w1, (e, slice(None), c)), _slice_param(ex.w3, (e, slice(None), c))
        ex.w2 = _slice_param(ex.w2, (e, c, slice(None)))
        ex.b1, ex.b3, ex.b2 = _slice_param(ex.b1, (e, c)), _slice_param(ex.b3, (e, c)), _slice_param(ex.b2, (e,))
        ex.add_out_bias = etp_rank == 0
        block.moe.dispatch = partial(all_to_all_dispatch, group=group, ep=ep, etp=etp)


def _all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    """Differentiable all_to_all_single (its backward is the mirror all-to-all), waited on at once."""
    y = all_to_all_single_autograd(x.contiguous(), out_splits, in_splits, group)
    return torch.ops._c10d_functional.wait_tensor(y)


def all_to_all_dispatch(moe: MoE, tokens: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, *,
                        group: dist.ProcessGroup, ep: int, etp: int) -> torch.Tensor:
    E = moe.num_experts
    el, ranks = E // ep, ep * etp
    x, order, counts = sort_by_expert(tokens, experts, E)
    # 1. tokens per (destination rank, local expert): each EP block goes to its etp ranks.
    per_ep = counts.view(ep, el)
    send_counts = per_ep.repeat_interleave(etp, dim=0)                      # [ranks, el]
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    in_splits, out_splits = send_counts.sum(1).tolist(), recv_counts.sum(1).tolist()
    blocks = torch.split(x, per_ep.sum(1).tolist())
    x_send = torch.cat([b for b in blocks for _ in range(etp)]) if etp > 1 else x
    # 2. dispatch
    x_recv = _all_to_all(x_send, out_splits, in_splits, group)
    # 3. received rows are ordered (source rank, local expert): regroup by local expert and compute
    local_ids = torch.arange(el, device=x.device).repeat(ranks)
    row_expert = torch.repeat_interleave(local_ids, recv_counts.flatten())
    perm = torch.argsort(row_expert, stable=True)
    y = moe.experts(x_recv[perm], recv_counts.sum(0))
    y = torch.empty_like(y).index_copy(0, perm, y)
    # 4. combine: mirror all-to-all, then sum the etp partial outputs of each EP block
    y_back = _all_to_all(y, in_splits, out_splits, group)
    if etp > 1:
        parts = torch.split(y_back, in_splits)
        y_back = torch.cat([sum(parts[r * etp:(r + 1) * etp]) for r in range(ep)])
    return combine(y_back, order, weights)


def expert_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for m in model.modules() if isinstance(m, GroupedExperts) for p in m.parameters()]


def sync_expert_grads(model: nn.Module, meshes: Meshes) -> None:
    """grad <- (Σ over expert-data-parallel replicas of grad) / (dp·cp)."""
    edp, denom = meshes.size("edp"), meshes.size("dp") * meshes.size("cp")
    for p in expert_parameters(model):
        if p.grad is None:  # every replica must join the all-reduce, even without routed tokens
            p.grad = torch.zeros_like(p)
        if edp > 1:
            dist.all_reduce(p.grad, group=meshes.group("edp"))
        if denom > 1:
            p.grad.div_(denom)
