"""Linear-attention and state-space token mixers for the runner, in plain torch (issue 12).

Each mixer has two forms of the same recurrence: a **chunked** form (what the runner trains with: matmuls over
chunks of C tokens plus a d_k x d_v state carried from chunk to chunk, as FLA's and Mamba-2's kernels compute)
and a **recurrent** reference (one token at a time, the definition), which the tests compare on CPU.

- Linear attention with decay (GLA, arXiv 2312.06635 eq. 3: S_t = diag(α_t)·S_{t-1} + k_t^T v_t, o_t = q_t S_t;
  Lightning / Mamba-2 use a scalar α_t per head): :func:`chunk_decay_attention`, :func:`recurrent_decay_attention`.
  Chunked form (GLA sec. 4.1, "chunkwise parallel form"): with B_t the cumulative log-decay inside a chunk,
  o = (Q̃ K̃^T ⊙ M) V + Q̃ S and S' = diag(exp B_C) S + (K ⊙ exp(B_C − B))^T V, Q̃ = Q ⊙ exp B, K̃ = K ⊙ exp(−B).
  A scalar decay uses the C x C matrix exp(B_i − B_j) instead (Mamba-2's "segsum", arXiv 2405.21060 sec. 6),
  which stays finite for fast decays.
- Gated delta rule (Gated DeltaNet, arXiv 2412.06464 eq. 10: S_t = α_t (I − β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T):
  :func:`chunk_gated_delta_rule`, :func:`recurrent_gated_delta_rule`. Chunked form (sec. 3.3, the UT transform):
  T = (I + tril(diag(β) K K^T ⊙ Γ, −1))^{-1}, U = T·(β V), W = T·(β K ⊙ exp G), then per chunk
  v' = U − W S, o = (Q ⊙ exp G) S + (Q K^T ⊙ Γ ⊙ M) v', S' = exp(G_C) S + (K ⊙ exp(G_C − G))^T v'.

- Mamba-1 selective scan (Gu & Dao 2023, arXiv 2312.00752 Alg. 2; HF ``JambaMambaMixer.slow_forward``:
  h_t = exp(Δ_t·A) ⊙ h_{t-1} + (Δ_t·x_t) B_t per channel, y_t = C_t·h_t + D·x_t): :func:`chunk_selective_scan`,
  :func:`recurrent_selective_scan`. Its decay is per channel and per state (d x N), so there is no small matmul form;
  the chunked form runs a parallel prefix scan inside each chunk (Hillis & Steele 1986: log2(C) doubling steps of
  (a, u) ∘ (a', u') = (a·a', a'·u + u'), in log space for a, so every factor is exp of a sum of log-decays <= 0 and
  stays finite; the fused mamba_ssm kernel uses a parallel scan too, sec. 3.3.2) and carries h from chunk to chunk.

The :class:`LinearMixer` module packs its projections so the runner's tensor-parallel plan (wq, wk, wv column-
parallel, wo row-parallel) splits it by heads: every per-head quantity (gates, β, Δt) sits in wv next to that
head's values, every per-group one (Mamba-2's B, C) in wq/wk. Approximations, reported by :func:`approximations`:
no short convolutions; KDA's per-channel decay runs as a per-head one; decays are data-dependent log-sigmoid / softplus gates of a learned projection (Lightning's
fixed per-head decays and Mamba-2's learned A are folded into that projection's bias); per-head RMSNorm without a
learned scale on the output; no Mamba-2 D skip. :class:`Mamba1Mixer` keeps Mamba-1's own projections (in_proj,
x_proj row-parallel, dt_proj, out_proj), its A and D, and Jamba's Δ/B/C RMSNorms without learned scales, and
leaves out the convolution. The work the cost model prices (projections and the chunked scan)
is what runs.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from autopar.specs.mixers import MixerSpec
from autopar.specs.model import ModelSpec


# ---- linear attention with decay ---------------------------------------------------------------------------
def recurrent_decay_attention(q, k, v, log_decay):
    """Reference, one token at a time. q, k: [b, H, s, dk]; v: [b, H, s, dv]; log_decay: [b, H, s, dk] (per channel)
    or [b, H, s] (scalar per head), <= 0. Returns o [b, H, s, dv]."""
    b, H, s, dk = q.shape
    if log_decay.dim() == 3:
        log_decay = log_decay[..., None].expand(b, H, s, dk)
    S = q.new_zeros(b, H, dk, v.shape[-1])
    out = []
    for t in range(s):
        S = S * log_decay[:, :, t, :, None].exp() + k[:, :, t, :, None] * v[:, :, t, None, :]
        out.append((q[:, :, t, None, :] @ S).squeeze(-2))
    return torch.stack(out, dim=2)


def chunk_decay_attention(q, k, v, log_decay, chunk: int = 64):
    """Chunked form of :func:`recurrent_decay_attention` (same arguments; s is padded to a multiple of chunk)."""
    b, H, s, dk = q.shape
    dv = v.shape[-1]
    pad = (-s) % chunk
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        log_decay = F.pad(log_decay, (0, 0, 0, pad) if log_decay.dim() == 4 else (0, pad))
    n = (s + pad) // chunk
    q, k, v = (t.reshape(b, H, n, chunk, -1) for t in (q, k, v))
    scalar = log_decay.dim() == 3
    B = log_decay.reshape(b, H, n, chunk, *(() if scalar else (dk,))).cumsum(3)      # cumulative inside chunks
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    if scalar:
        seg = (B[..., :, None] - B[..., None, :]).masked_fill(~causal, float("-inf")).exp()   # exp(B_i - B_j), i >= j
        intra = ((q @ k.transpose(-1, -2)) * seg) @ v
        q_in, k_out, last = q * B[..., None].exp(), k * (B[..., -1:, None] - B[..., None]).exp(), B[..., -1, None, None]
    else:
        qt, kt = q * B.exp(), k * (-B).exp()
        intra = ((qt @ kt.transpose(-1, -2)) * causal) @ v
        q_in, k_out, last = qt, k * (B[..., -1:, :] - B).exp(), B[..., -1, :, None]
    S = q.new_zeros(b, H, dk, dv)
    outs = []
    for i in range(n):
        outs.append(intra[:, :, i] + q_in[:, :, i] @ S)
        S = S * last[:, :, i].exp() + k_out[:, :, i].transpose(-1, -2) @ v[:, :, i]
    return torch.stack(outs, dim=2).reshape(b, H, n * chunk, dv)[:, :, :s]


# ---- gated delta rule --------------------------------------------------------------------------------------
def recurrent_gated_delta_rule(q, k, v, beta, log_alpha):
    """Reference. q, k: [b, H, s, dk] (k L2-normalised by the caller); v: [b, H, s, dv]; beta, log_alpha: [b, H, s]."""
    b, H, s, dk = q.shape
    S = q.new_zeros(b, H, dk, v.shape[-1])
    out = []
    for t in range(s):
        S = S * log_alpha[:, :, t, None, None].exp()
        kt, vt, bt = k[:, :, t], v[:, :, t], beta[:, :, t, None]
        pred = (kt[..., None, :] @ S).squeeze(-2)                        # S^T k_t
        S = S + kt[..., :, None] * (bt * (vt - pred))[..., None, :]
        out.append((q[:, :, t, None, :] @ S).squeeze(-2))
    return torch.stack(out, dim=2)


def chunk_gated_delta_rule(q, k, v, beta, log_alpha, chunk: int = 64):
    """Chunked (UT-transform) form of :func:`recurrent_gated_delta_rule`, same arguments."""
    b, H, s, dk = q.shape
    dv = v.shape[-1]
    pad = (-s) % chunk
    if pad:   # padded tokens have beta 0 and decay 1: they leave the state as it is
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        beta, log_alpha = F.pad(beta, (0, pad)), F.pad(log_alpha, (0, pad))
    n = (s + pad) // chunk
    q, k, v = (t.reshape(b, H, n, chunk, -1) for t in (q, k, v))
    beta = beta.reshape(b, H, n, chunk)
    G = log_alpha.reshape(b, H, n, chunk).cumsum(-1)
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    gamma = (G[..., :, None] - G[..., None, :]).masked_fill(~lower, float("-inf")).exp()   # exp(G_i - G_j), i >= j
    kb = k * beta[..., None]
    A = ((kb @ k.transpose(-1, -2)) * gamma).tril(-1)
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    T = torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False)
    U = T @ (v * beta[..., None])
    W = T @ (kb * G[..., None].exp())
    qk = (q @ k.transpose(-1, -2)) * gamma
    S = q.new_zeros(b, H, dk, dv)
    outs = []
    for i in range(n):
        v_new = U[:, :, i] - W[:, :, i] @ S
        outs.append((q[:, :, i] * G[:, :, i, :, None].exp()) @ S + qk[:, :, i] @ v_new)
        g_last = G[:, :, i, -1, None, None]
        S = S * g_last.exp() + (k[:, :, i] * (g_last[..., 0] - G[:, :, i])[..., None].exp()).transpose(-1, -2) @ v_new
    return torch.stack(outs, dim=2).reshape(b, H, n * chunk, dv)[:, :, :s]


# ---- Mamba-1 selective scan -------------------------------------------------------------------------------
def recurrent_selective_scan(x, dt, A, B, C, D):
    """Reference, one token at a time. x, dt: [b, d, s] (dt > 0); A: [d, N] (< 0); B, C: [b, s, N]; D: [d].
    Returns y [b, d, s]."""
    b, d, s = x.shape
    h = x.new_zeros(b, d, A.shape[-1])
    out = []
    for t in range(s):
        h = (dt[:, :, t, None] * A).exp() * h + (dt[:, :, t] * x[:, :, t])[..., None] * B[:, None, t, :]
        out.append((h * C[:, None, t, :]).sum(-1) + D * x[:, :, t])
    return torch.stack(out, dim=-1)


def chunk_selective_scan(x, dt, A, B, C, D, chunk: int = 64):
    """Chunked form of :func:`recurrent_selective_scan` (same arguments): a prefix scan inside each chunk of
    ``chunk`` tokens, the state h [b, d, N] carried across chunks."""
    b, d, s = x.shape
    h = x.new_zeros(b, d, A.shape[-1])
    outs = []
    for start in range(0, s, chunk):
        xs, ds = x[:, :, start:start + chunk], dt[:, :, start:start + chunk]
        la = ds[..., None] * A[:, None, :]                          # [b, d, c, N] log-decays, <= 0
        u = (ds * xs)[..., None] * B[:, None, start:start + chunk, :]   # [b, d, c, N] inputs
        c, step = xs.shape[-1], 1
        while step < c:        # after this loop u_t = sum_{j<=t} exp(la_{j+1} + ... + la_t) u_j, la_t = la_1 + ... + la_t
            u = u + F.pad((la[:, :, step:].exp() * u[:, :, :-step]), (0, 0, step, 0))
            la = la + F.pad(la[:, :, :-step], (0, 0, step, 0))
            step *= 2
        hs = u + la.exp() * h[:, :, None, :]                        # states after each token of the chunk
        outs.append((hs * C[:, None, start:start + chunk, :]).sum(-1) + D[:, None] * xs)
        h = hs[:, :, -1]
    return torch.cat(outs, dim=-1)


# ---- the module the runner builds --------------------------------------------------------------------------
class ChunkScan(nn.Module):
    """The scan of one mixer (its own module, so selective recomputation can checkpoint exactly it)."""

    def __init__(self, kind: str, chunk: int):
        super().__init__()
        self.kind, self.chunk = kind, chunk

    def forward(self, q, k, v, decay, beta=None):
        if self.kind == "mamba1":       # q, k, v, decay, beta = x, dt, A, (B, C), D
            return chunk_selective_scan(q, k, v, decay[0], decay[1], beta, self.chunk)
        if self.kind == "gated_deltanet":
            return chunk_gated_delta_rule(q, k, v, beta, decay, self.chunk)
        return chunk_decay_attention(q, k, v, decay, self.chunk)


class LinearMixer(nn.Module):
    """GLA, Gated DeltaNet, Lightning or Mamba-2 token mixer with the projections named like Attention's."""

    def __init__(self, spec: ModelSpec, mx: MixerSpec):
        super().__init__()
        h, self.kind = spec.hidden_size, mx.kind
        H, dk, dv = mx.num_heads, mx.dk, mx.dv
        if mx.kind == "gla":            # wq per head: [q, forget-gate logits]; wv per head: [v, output gate]
            self.split = ((dk, dk), (dk,), (dv, dv))
            shapes = (H * 2 * dk, H * dk, H * 2 * dv, H * dv)
        elif mx.kind in ("gated_deltanet", "kda"):   # wv per value head: [v, output gate z, beta logit, decay logit]
            Hv = mx.v_heads
            self.split = ((dk,), (dk,), (dv, dv, 1, 1))
            shapes = (H * dk, H * dk, Hv * (2 * dv + 2), Hv * dv)
        elif mx.kind == "lightning":    # wv per head: [v, output gate, decay logit]
            self.split = ((dk,), (dk,), (dv, dv, 1))
            shapes = (H * dk, H * dk, H * (2 * dv + 1), H * dv)
        elif mx.kind == "mamba2":       # wq per group: C; wk per group: B; wv per head: [x, z, dt]
            N, G, P = mx.state_size, mx.n_groups, mx.head_dim
            self.split = ((N,), (N,), (P, P, 1))
            shapes = (G * N, G * N, H * (2 * P + 1), H * P)
        else:
            raise ValueError(f"LinearMixer builds linear/SSM mixers, not {mx.kind}")
        self.heads_per_group = H // mx.n_groups if mx.kind == "mamba2" else 1
        self.wq = nn.Linear(h, shapes[0], bias=False)
        self.wk = nn.Linear(h, shapes[1], bias=False)
        self.wv = nn.Linear(h, shapes[2], bias=True)     # the bias holds the decay / Δt offsets per head
        self.wo = nn.Linear(shapes[3], h, bias=False)
        self.core = ChunkScan("gated_deltanet" if mx.kind == "kda" else mx.kind, mx.chunk_size)
        if mx.kind == "kda":
            self.kind = "gated_deltanet"   # KDA's per-channel decay is run as the per-head decay of the delta rule

    def __setattr__(self, name: str, value) -> None:
        # Context parallelism swaps every block's attention.core for ring attention; a linear/SSM scan needs a
        # state pass between CP ranks instead, which the runner does not implement: say so instead of failing later.
        if name == "core" and "core" in self._modules and not (
                isinstance(value, ChunkScan) or isinstance(getattr(value, "inner", None), ChunkScan)):
            raise ValueError(f"the runner has no context parallelism for {self.kind} layers (their scan passes a "
                             "state between CP ranks, not implemented here); run hybrid models with cp = 1")
        super().__setattr__(name, value)

    def _heads(self, t: torch.Tensor, widths: tuple[int, ...]) -> list[torch.Tensor]:
        """[b, s, heads·sum(widths)] -> per-part tensors [b, heads, s, width] (local heads under TP)."""
        b, s = t.shape[:2]
        parts = t.view(b, s, -1, sum(widths)).split(list(widths), dim=-1)
        return [p.transpose(1, 2) for p in parts]

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None = None, sin: torch.Tensor | None = None):
        b, s = x.shape[:2]
        qs, ks, vs = (self._heads(w(x), sp) for w, sp in zip((self.wq, self.wk, self.wv), self.split))
        if self.kind == "gla":
            (q, gate_logit), (k,), (v, og) = qs, ks, vs
            decay = F.logsigmoid(gate_logit) / 16.0          # FLA GLA's gate_logit_normalizer = 16
            o = self.core(q * q.shape[-1] ** -0.5, k, v, decay)
        elif self.kind == "gated_deltanet":
            (q,), (k,), (v, og, beta_logit, a_logit) = qs, ks, vs
            rep = v.shape[1] // q.shape[1]                   # value heads per query/key head
            q, k = (F.normalize(t, dim=-1).repeat_interleave(rep, dim=1) for t in (q, k))
            o = self.core(q * q.shape[-1] ** -0.5, k, v, F.logsigmoid(a_logit[..., 0]), beta_logit[..., 0].sigmoid())
        elif self.kind == "lightning":
            (q,), (k,), (v, og, d_logit) = qs, ks, vs
            o = self.core(F.silu(q), F.silu(k), v, F.logsigmoid(d_logit[..., 0]))
        else:   # mamba2: q = C, k = Δt·B (groups broadcast over their heads), v = x, decay = −Δt (A = −1)
            (c,), (bm,), (xv, og, dt) = qs, ks, vs
            dt = F.softplus(dt[..., 0])
            c, bm = (t.repeat_interleave(self.heads_per_group, dim=1) for t in (c, bm))
            o = self.core(c, bm * dt[..., None], xv, -dt)
        o = F.rms_norm(o, (o.shape[-1],)) * F.silu(og)        # per-head norm, gated by the output gate
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class Mamba1Mixer(LinearMixer):
    """Mamba-1 (HF ``JambaMambaMixer`` without the convolution): in_proj h -> [x, z] per channel (interleaved, so a
    column-parallel split keeps each channel's pair), x_proj d -> [Δ rank R, B, C] (row-parallel: the TP ranks'
    partial sums are all-reduced, as vLLM's MambaMixer does), dt_proj R -> d (+ bias), ``ssm`` holds A_log as its
    weight [d, N] and D as its bias [d] (column-parallel, so both split by channel), out_proj d -> h."""

    def __init__(self, spec: ModelSpec, mx: MixerSpec):
        nn.Module.__init__(self)
        h, d, self.N, self.R = spec.hidden_size, mx.d_inner, mx.state_size, mx.dt_rank
        self.kind, self.bc_norms = "mamba1", mx.bc_norms
        self.in_proj = nn.Linear(h, 2 * d, bias=False)
        self.x_proj = nn.Linear(d, self.R + 2 * self.N, bias=False)
        self.dt_proj = nn.Linear(self.R, d, bias=True)
        self.ssm = nn.Linear(self.N, d, bias=True)       # weight: A_log, bias: D (never called)
        self.out_proj = nn.Linear(d, h, bias=False)
        self.core = ChunkScan("mamba1", mx.chunk_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None = None, sin: torch.Tensor | None = None):
        b, s = x.shape[:2]
        xz = self.in_proj(x).view(b, s, -1, 2)                    # local channels under TP
        u, z = F.silu(xz[..., 0]), xz[..., 1]                      # SiLU after the (omitted) convolution
        dt_in, B, C = self.x_proj(u).split([self.R, self.N, self.N], dim=-1)
        if self.bc_norms:                                          # Jamba's dt/b/c_layernorm, without scales
            dt_in, B, C = (F.rms_norm(t, (t.shape[-1],)) for t in (dt_in, B, C))
        dt = F.softplus(self.dt_proj(dt_in))
        mesh = getattr(self.ssm.weight, "device_mesh", None)
        if mesh is not None:
            # Under TP, B and C (replicated after x_proj's all-reduce) feed the scan of this rank's channels only, so
            # their gradients are partial sums: declared Partial, they are all-reduced on the way back (Megatron's
            # "copy to tensor-parallel region").
            from torch.distributed.tensor import DTensor, Partial, Replicate
            B, C = (DTensor.from_local(t, mesh, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])
                    for t in (B, C))
        A_log, D = (_local(p) for p in (self.ssm.weight, self.ssm.bias))
        y = self.core(u.transpose(1, 2), dt.transpose(1, 2), -A_log.float().exp().to(u.dtype), (B, C), D)
        return self.out_proj(y.transpose(1, 2) * F.silu(z))


def _local(p: torch.Tensor) -> torch.Tensor:
    """A parameter's local shard (tensor parallelism makes it a DTensor; the scan uses it directly)."""
    return p.to_local() if hasattr(p, "to_local") else p


def build_token_mixer(spec: ModelSpec, mx: MixerSpec) -> LinearMixer | None:
    """The runner's module for one token mixer when it is linear attention or an SSM (None: softmax attention,
    built by autopar.run.model)."""
    if not mx.is_linear:
        return None
    return Mamba1Mixer(spec, mx) if mx.kind == "mamba1" else LinearMixer(spec, mx)


def check_buildable(spec: ModelSpec, layer_id: int) -> None:
    """The runner builds blocks with at least one token mixer and a channel mixer."""
    if not spec.mixers_of(layer_id) or spec.channel_of(layer_id) == "none":
        raise ValueError(f"layer {layer_id} of {spec.name} has no token mixer or no channel mixer; "
                         "the runner builds blocks with both")


def is_attention_layer(spec: ModelSpec, layer_id: int) -> bool:
    """Layer has softmax attention (alone or next to parallel mixers; it is then the block's ``attention``)."""
    return spec.attention_part(layer_id) is not None


def approximations(spec: ModelSpec) -> list[str]:
    """What the runner's mixers leave out (see the module docstring)."""
    kinds = sorted({mx.kind for i in range(spec.num_layers) for mx in spec.mixers_of(i) if mx.is_linear})
    notes = []
    other = [k for k in kinds if k != "mamba1"]
    if other:
        notes.append(f"{', '.join(other)} mixers: chunked scan without short convolutions; decays from a learned "
                     "gate projection; output RMSNorm without a scale")
    if "mamba1" in kinds:
        notes.append("mamba1 mixers: no short convolution; Δ/B/C RMSNorms without learned scales")
    if any(len(spec.mixers_of(i)) > 1 for i in range(spec.num_layers)):
        notes.append("parallel mixers summed without Falcon-H1's µP multipliers")
    return notes
