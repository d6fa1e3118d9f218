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

Linear-attention and SSM layers (autopar/run/mixers.py) keep no K/V; their scan is a recurrence that must see
chunks 0..2cp-1 in order, while the zig-zag split (kept, since the attention layers of a hybrid model need it)
gives rank r chunks r and 2cp-1-r. :class:`StatePassingScan`: each rank scans its two chunks from a zero state and
summarises each by its transition T and zero-state final state (``mixers.ChunkSummary``: every scan is linear in
its initial state S0, final = T·S0 + state, output = out + Q·S0; T is diagonal, d_k per head, for GLA, Lightning,
Mamba-2 and Mamba-1, and d_k x d_k per head for the delta rule of Gated DeltaNet / KDA). One differentiable
all-gather over the CP group (:class:`_AllGather`: its backward reduce-scatters, summing every rank's gradient of a
summary back to the rank that made it) hands every rank all 2·cp summaries; each rank runs the recurrence over
the chunk summaries in sequence order, S0(j+1) = T_j·S0(j) + state_j from S0(0) = 0, and adds Q·S0 to its
chunks' outputs.

Why one all-gather and not LASP's ring of states (arXiv 2404.02882 sec. 3, what autopar/cost/cp.py prices): under
the zig-zag split the chain of chunks visits ranks 0, 1, .., cp-1, cp-1, .., 0, so a ring would be 2(cp-1)
dependent hops, each waiting for the previous rank; the all-gather is one collective, and the fold over 2·cp small
summaries is cheap. It moves more bytes: each rank receives (cp-1) x 2 chunks x (state + T) per pass, against
the (cp-1) states of LASP's chain. T is H (scalar decay: Lightning, Mamba-2) or H·d_k (GLA) elements, small
next to the H·d_k·d_v state, so about 2x the bytes; H·d_k² for the delta rule and d·N for Mamba-1, as large as
the state, so about 4x. The short convolutions of these mixers are not built by the runner
(mixers.py), so no halo of K-1 inputs is exchanged.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from autopar.run.mixers import ChunkScan, ChunkSummary, LinearMixer, advance
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


class _AllGather(torch.autograd.Function):
    """[n] -> [cp, n], every rank's ``flat`` in CP-rank order; backward: reduce-scatter of the [cp, n] gradient.
    Not ``torch.distributed.nn.functional.all_gather``: in torch 2.13 its gloo backward emulates reduce-scatter
    with ``dist.scatter(src=<group rank>)``, which takes a global rank, so it fails for a CP group that is not
    global ranks 0..cp-1 (any layout with tp > 1; the same mix-up as pytorch/pytorch#130515 for broadcast).
    Gloo and NCCL both have ``reduce_scatter_tensor``."""

    @staticmethod
    def forward(ctx, flat, group):
        ctx.group = group
        out = flat.new_empty(dist.get_world_size(group) * flat.numel())    # gloo wants it flat
        dist.all_gather_into_tensor(out, flat.contiguous(), group=group)
        return out.view(-1, flat.numel())

    @staticmethod
    def backward(ctx, grad):
        mine = grad.new_empty(grad.shape[1])
        dist.reduce_scatter_tensor(mine, grad.contiguous().view(-1), group=ctx.group)
        return mine, None


def chunk_starts(mine: list[ChunkSummary], group: dist.ProcessGroup, rank: int, size: int) -> list[torch.Tensor]:
    """The true initial states of this rank's two zig-zag chunks (r and 2cp-1-r), from every rank's summaries."""
    parts = [t for s in mine for t in (s.transition, s.state)]
    flat = torch.cat([t.reshape(-1) for t in parts])                 # one collective per layer
    gathered = _AllGather.apply(flat, group)
    chunks = [None] * (2 * size)
    for j, buf in enumerate(gathered):
        T0, S0, T1, S1 = (t.view_as(p) for t, p in zip(buf.split([p.numel() for p in parts]), parts))
        chunks[j], chunks[2 * size - 1 - j] = (T0, S0), (T1, S1)
    state, starts = torch.zeros_like(mine[0].state), {}
    for j in range(2 * size - rank):           # chunks 0 .. 2cp-1-r, in sequence order
        starts[j] = state
        if j < 2 * size - 1 - rank:
            state = advance(*chunks[j], state)
    return [starts[rank], starts[2 * size - 1 - rank]]


class StatePassingScan(nn.Module):
    """Drop-in replacement of a linear/SSM mixer's ``ChunkScan`` over a CP group (same arguments, this rank's
    two zig-zag chunks concatenated along the sequence)."""

    def __init__(self, inner: ChunkScan, cp_mesh: DeviceMesh):
        super().__init__()
        self.inner = inner
        self.group, self.rank, self.size = cp_mesh.get_group(), cp_mesh.get_local_rank(), cp_mesh.size()

    def forward(self, *args):
        mine = self.inner.summaries(*args, pieces=2)
        starts = chunk_starts(mine, self.group, self.rank, self.size)
        return torch.cat([s.output(s0) for s, s0 in zip(mine, starts)], dim=self.inner.seq_dim)


def apply_context_parallel(model: Transformer, cp_mesh: DeviceMesh, seq_len: int) -> None:
    """Give the stage the zig-zag positions of this CP rank, ring attention in every softmax-attention mixer and
    state passing in every linear-attention / SSM mixer (parallel mixers of a block included)."""
    if cp_mesh.size() == 1:
        return
    idx = zigzag_indices(seq_len, cp_mesh.size(), cp_mesh.get_local_rank())
    model.positions = idx.to(model.positions.device)
    for block in model.layers.values():
        for mixer in [block.attention, *(block.parallel or ())]:
            linear = isinstance(mixer, LinearMixer)
            mixer.core = StatePassingScan(mixer.core, cp_mesh) if linear else RingAttention(cp_mesh)


def shard_sequence(x: torch.Tensor, cp_mesh: DeviceMesh) -> torch.Tensor:
    """This CP rank's zig-zag slice of a [batch, seq] tensor (inputs and labels alike)."""
    if cp_mesh.size() == 1:
        return x
    return x[:, zigzag_indices(x.shape[1], cp_mesh.size(), cp_mesh.get_local_rank()).to(x.device)]
