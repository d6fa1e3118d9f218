"""Context parallelism: ring attention (Liu et al. 2023, arXiv 2310.01889) with the load-balanced zig-zag split.

Each sequence is cut into 2·cp chunks; CP rank r keeps chunks r and 2cp-1-r (zig-zag, as Megatron-LM's CP
and Llama 3's long-context training), so every rank has the same amount of causal work. Queries stay put;
keys/values travel round the ring, one hop per step, sent with ``dist.batch_isend_irecv`` while the current
block is computed. Block results are merged with the online softmax (log-sum-exp merging, as
FlashAttention): out = Σ_j out_j · exp(lse_j - lse), lse = log Σ_j exp(lse_j).

Which block is needed, for the rank r holding queries and the K/V of rank j:
  j == r : both local chunks, causal mask inside;
  j <  r : all local queries x the first K/V chunk (chunk j precedes both query chunks; chunk 2cp-1-j
           follows both), no mask;
  j >  r : the second local query chunk x both K/V chunks, no mask (the first query chunk sees neither).

The backward pass is the ring again: dK/dV accumulate while travelling with their K/V and arrive back home
after cp hops. torch's own ``context_parallel`` needs CUDA; this one runs on gloo and NCCL alike.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from autopar.run.model import Transformer


def zigzag_indices(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """Global token positions held by CP rank ``rank``: chunks rank and 2cp-1-rank of 2cp equal chunks."""
    c = seq_len // (2 * cp)
    mirror = 2 * cp - 1 - rank
    return torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange(mirror * c, (mirror + 1) * c)])


def _ring_shift(tensors: list[torch.Tensor], group: dist.ProcessGroup, rank: int, size: int):
    """Post sends of each tensor to the next CP rank and receives from the previous one.
    Returns (receive buffers, requests to wait on)."""
    nxt = dist.get_global_rank(group, (rank + 1) % size)
    prv = dist.get_global_rank(group, (rank - 1) % size)
    recv = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    ops = [dist.P2POp(dist.isend, t.contiguous(), nxt, group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, r, prv, group) for r in recv]
    return recv, (dist.batch_isend_irecv(ops), ops)   # ops keep the send buffers alive until the wait


def _wait(pending) -> None:
    for r in pending[0]:
        r.wait()


def _block_forward(q, k, v, scale, causal):
    """Attention of q [b,a,sq,d] over k,v [b,g,sk,d] (GQA: k/v heads repeated). Returns out, lse [b,a,sq]."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return (torch.exp(s - lse[..., None]) @ v.float()), lse


def _block_backward(q, k, v, do, lse, delta, scale, causal):
    """Gradients of one block given the FINAL lse and delta = rowsum(dO * O) (FlashAttention-2 backward)."""
    b, g, sk, d = k.shape
    rep = q.shape[1] // g
    kr, vr = k.float().repeat_interleave(rep, dim=1), v.float().repeat_interleave(rep, dim=1)
    s = (q.float() @ kr.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.exp(s - lse[..., None])
    dv = p.transpose(-1, -2) @ do
    ds = p * (do @ vr.transpose(-1, -2) - delta[..., None])
    dq = (ds @ kr) * scale
    dk = (ds.transpose(-1, -2) @ q.float()) * scale
    fold = lambda t: t.view(b, g, rep, sk, t.shape[-1]).sum(2)  # noqa: E731  (sum the repeated KV heads)
    return dq, fold(dk), fold(dv)


def _blocks(r: int, j: int, half: int):
    """(query slice, key slice, causal) of the block between query rank r and K/V rank j."""
    every = slice(None)
    if j == r:
        return every, every, True
    if j < r:
        return every, slice(0, half), False
    return slice(half, None), every, False


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, rank, size):
        scale = q.shape[-1] ** -0.5
        half = q.shape[2] // 2
        out = lse = None
        kv = [k, v]
        for step in range(size):
            if step < size - 1:
                nxt, reqs = _ring_shift(kv, group, rank, size)
            j = (rank - step) % size
            qs, ks, causal = _blocks(rank, j, half)
            o_j, lse_j = _block_forward(q[:, :, qs], kv[0][:, :, ks], kv[1][:, :, ks], scale, causal)
            if out is None:
                out, lse = o_j, lse_j
            else:  # online-softmax merge on the rows this block touched
                new = torch.logaddexp(lse[:, :, qs], lse_j)
                out[:, :, qs] = out[:, :, qs] * torch.exp(lse[:, :, qs] - new)[..., None] \
                    + o_j * torch.exp(lse_j - new)[..., None]
                lse[:, :, qs] = new
            if step < size - 1:
                _wait(reqs)
                kv = nxt
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.rank, ctx.size = group, rank, size
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, rank, size = ctx.group, ctx.rank, ctx.size
        scale, half = q.shape[-1] ** -0.5, q.shape[2] // 2
        do = dout.float()
        delta = (do * out.float()).sum(-1)
        dq = torch.zeros_like(q, dtype=torch.float32)
        travel = [k, v, torch.zeros_like(k, dtype=torch.float32), torch.zeros_like(v, dtype=torch.float32)]
        for step in range(size):
            j = (rank - step) % size
            qs, ks, causal = _blocks(rank, j, half)
            kj, vj, dkj, dvj = travel
            dq_b, dk_b, dv_b = _block_backward(q[:, :, qs], kj[:, :, ks], vj[:, :, ks], do[:, :, qs],
                                               lse[:, :, qs], delta[:, :, qs], scale, causal)
            dq[:, :, qs] += dq_b
            dkj[:, :, ks] += dk_b
            dvj[:, :, ks] += dv_b
            # K/V (and their gradients so far) move one hop; after `size` hops dK/dV are back home.
            send = travel if step < size - 1 else [dkj, dvj]
            recv, reqs = _ring_shift(send, group, rank, size)
            _wait(reqs)
            travel = recv
        dk, dv = travel[-2:]
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


class RingAttention(nn.Module):
    """Drop-in replacement of ``CoreAttention`` over a CP group (q: [b, a, s/cp, d], k/v: [b, g, s/cp, d])."""

    def __init__(self, cp_mesh: DeviceMesh):
        super().__init__()
        self.group, self.rank, self.size = cp_mesh.get_group(), cp_mesh.get_local_rank(), cp_mesh.size()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _RingAttention.apply(q, k, v, self.group, self.rank, self.size)


def apply_context_parallel(model: Transformer, cp_mesh: DeviceMesh, seq_len: int) -> None:
    """Give the stage the zig-zag positions of this CP rank and ring attention in every block."""
    if cp_mesh.size() == 1:
        return
    idx = zigzag_indices(seq_len, cp_mesh.size(), cp_mesh.get_local_rank())
    model.positions = idx.to(model.positions.device)
    for block in model.layers.values():
        block.attention.core = RingAttention(cp_mesh)


def shard_sequence(x: torch.Tensor, cp_mesh: DeviceMesh) -> torch.Tensor:
    """This CP rank's zig-zag slice of a [batch, seq] tensor (inputs and labels alike)."""
    if cp_mesh.size() == 1:
        return x
    return x[:, zigzag_indices(x.shape[1], cp_mesh.size(), cp_mesh.get_local_rank()).to(x.device)]
