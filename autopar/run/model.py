"""The transformer that `autopar profile` trains: built from a ModelSpec, optionally scaled down.

What is built (names follow torchtitan, so the tensor-parallel plan reads like torchtitan's):

- ``tok_embeddings`` (+ ``pos_embeddings`` for a learned position table), ``layers`` (a ModuleDict keyed by
  the GLOBAL layer index, so a pipeline stage holding layers 4..7 has the same parameter names as the full
  model), ``norm`` and ``output``.
- Each block: ``attention_norm`` -> ``attention`` (wq, wk, wv, wo, rotary embedding, GQA) -> residual;
  ``ffn_norm`` -> ``feed_forward`` (gated SwiGLU or plain GELU MLP) or ``moe`` (top-k router, routed experts
  stored as stacked [E, ...] weights and run as grouped GEMMs on CUDA, optional shared experts) -> residual.
- Core attention is its own module (``attention.core``) so context parallelism can replace it with ring
  attention and selective recomputation can checkpoint exactly it.

Under tensor parallelism with fewer KV heads than tp, the model is built with tp KV heads: each of the g
heads copied tp/g times (initial values equal, gradients summed by tensor_parallel.py), as Megatron-LM does.

Approximations (reported by the runner as "notes"):
- MLA is run as standard multi-head attention with the same head count, Q/K head dim d_nope + d_rope and
  V head dim d_v (no low-rank down/up projections).
- Sliding-window layers run full causal attention; MTP modules are not built; MoE has no auxiliary
  load-balancing loss and no capacity limit (dropless).

Initialisation is deterministic and independent of how the model is later split: every parameter is drawn
from its own generator seeded by (seed, parameter name), so a pipeline stage, a tensor-parallel shard or an
expert-parallel slice starts from exactly the values the single-process model has.
"""

from __future__ import annotations

import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

from autopar.run._scale import scale_model  # noqa: F401  (torch-free; re-exported here)
from autopar.run.mixers import build_token_mixer, check_buildable, is_attention_layer
from autopar.specs.model import ModelSpec


# ---- building blocks -------------------------------------------------------------------------------------
def make_norm(spec: ModelSpec) -> nn.Module:
    return nn.RMSNorm(spec.hidden_size, eps=1e-5) if spec.norm == "rmsnorm" else nn.LayerNorm(spec.hidden_size)


def rotary(positions: torch.Tensor, dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [s, dim] for the given (global) token positions (Su et al. 2021, RoFormer)."""
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim))
    ang = positions.float()[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [b, s, heads, d] (Llama's rotate-half convention) on the first cos.shape[-1] dims of each head."""
    r = cos.shape[-1]
    xr, rest = x[..., :r], x[..., r:]
    rot = torch.cat([-xr[..., r // 2:], xr[..., :r // 2]], dim=-1)
    out = xr * cos[None, :, None, :].to(x.dtype) + rot * sin[None, :, None, :].to(x.dtype)
    return torch.cat([out, rest], dim=-1) if rest.shape[-1] else out


class CoreAttention(nn.Module):
    """softmax(QK^T / sqrt(d) + causal mask) V on the local heads. q: [b, a, s, d], k/v: [b, g, s, d]."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, kv_heads: int):
        super().__init__()
        h, a = spec.hidden_size, spec.num_attention_heads
        self.qk_dim, self.v_dim = spec.qk_head_dim, spec.v_head_dim
        self.rope = spec.position_embedding == "rope"
        qkv_bias = spec.qkv_bias or spec.linear_bias
        self.wq = nn.Linear(h, a * self.qk_dim, bias=qkv_bias)
        self.wk = nn.Linear(h, kv_heads * self.qk_dim, bias=qkv_bias)
        self.wv = nn.Linear(h, kv_heads * self.v_dim, bias=qkv_bias)
        self.wo = nn.Linear(a * self.v_dim, h, bias=spec.linear_bias)
        self.core = CoreAttention()

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        # Under tensor parallelism wq/wk/wv return the LOCAL heads; -1 picks the local head count.
        q = self.wq(x).view(b, s, -1, self.qk_dim)
        k = self.wk(x).view(b, s, -1, self.qk_dim)
        v = self.wv(x).view(b, s, -1, self.v_dim)
        if self.rope:
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        o = self.core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class Activation(nn.Module):
    """silu(gate) * up for a gated MLP, gelu(x) otherwise (its own module so 'moe_act' can recompute it)."""

    def __init__(self, gated: bool):
        super().__init__()
        self.gated = gated

    def forward(self, a: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        return F.silu(a) * b if self.gated else F.gelu(a)


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec, ffn: int, bias: bool):
        super().__init__()
        h = spec.hidden_size
        self.w1 = nn.Linear(h, ffn, bias=bias)
        self.w3 = nn.Linear(h, ffn, bias=bias) if spec.gated_mlp else None
        self.w2 = nn.Linear(ffn, h, bias=bias)
        self.act = Activation(spec.gated_mlp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.act(self.w1(x), self.w3(x) if self.w3 is not None else None))


class GroupedExperts(nn.Module):
    """E routed experts as stacked weights (w1, w3: [E, h, f]; w2: [E, f, h]). Expert parallelism keeps a
    slice [E/ep] of dim 0; expert tensor parallelism a slice [f/etp] of the FFN dim.

    Two ways to run them, same arithmetic:
    - grouped GEMM (``torch.nn.functional.grouped_mm``, one kernel per weight for all experts, jagged token
      groups delimited by offsets on the device, so no host sync per expert), used on CUDA for bf16 weights
      whose rows are 16-byte aligned (h and f multiples of 8), as torchtitan's MoE does;
    - otherwise a loop over the experts on UNBOUND views of the stacked weights (``w.unbind(0)``): the backward
      of unbind stacks the per-expert gradients once, so each expert's backward writes only its own slice
      (indexing ``w[e]`` instead would write a full-size [E, ...] gradient per expert)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        m, h = spec.moe, spec.hidden_size
        E, f = m.num_experts, m.expert_ffn_hidden_size
        self.w1 = nn.Parameter(torch.empty(E, h, f))
        self.w3 = nn.Parameter(torch.empty(E, h, f)) if spec.gated_mlp else None
        self.w2 = nn.Parameter(torch.empty(E, f, h))
        bias = m.expert_bias or spec.linear_bias
        self.b1 = nn.Parameter(torch.empty(E, f)) if bias else None
        self.b3 = nn.Parameter(torch.empty(E, f)) if bias and spec.gated_mlp else None
        self.b2 = nn.Parameter(torch.empty(E, h)) if bias else None
        self.act = Activation(spec.gated_mlp)
        self.add_out_bias = True      # False on all but one expert-tensor-parallel rank (partial sums)

    def use_grouped_mm(self, x: torch.Tensor) -> bool:
        """Whether ``forward`` runs one grouped GEMM per weight (CUDA, bf16, 16-byte aligned rows)."""
        h, f = self.w1.shape[1], self.w1.shape[2]
        return (x.is_cuda and x.dtype == torch.bfloat16 and self.w1.dtype == torch.bfloat16
                and h % 8 == 0 and f % 8 == 0 and hasattr(F, "grouped_mm")
                and torch.cuda.get_device_capability(x.device) >= (8, 0))     # grouped_mm's docs: SM >= 80

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """x: tokens sorted by local expert, ``counts[e]`` (a tensor) tokens for local expert e. Returns the
        same order."""
        if self.use_grouped_mm(x):
            return self.forward_grouped(x, counts)
        return self.forward_loop(x, counts)

    def forward_grouped(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        offs = torch.cumsum(counts, 0).to(torch.int32)
        rows = None       # expert of each row, only for the biases (no host sync: output_size is known)
        if self.b1 is not None or self.b2 is not None:
            rows = torch.repeat_interleave(torch.arange(len(counts), device=x.device), counts,
                                           output_size=x.shape[0])
        a = F.grouped_mm(x, self.w1, offs=offs)
        a = a + self.b1[rows] if self.b1 is not None else a
        b = None
        if self.w3 is not None:
            b = F.grouped_mm(x, self.w3, offs=offs)
            b = b + self.b3[rows] if self.b3 is not None else b
        y = F.grouped_mm(self.act(a, b), self.w2, offs=offs)
        if self.b2 is not None and self.add_out_bias:
            y = y + self.b2[rows]
        return y

    def forward_loop(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        def views(p):
            return p.unbind(0) if p is not None else [None] * self.w1.shape[0]
        outs = []
        for xe, w1, w3, w2, b1, b3, b2 in zip(torch.split(x, counts.tolist()), *map(views, (
                self.w1, self.w3, self.w2, self.b1, self.b3, self.b2))):
            a = xe @ w1 + (b1 if b1 is not None else 0)
            b = xe @ w3 + (b3 if b3 is not None else 0) if w3 is not None else None
            y = self.act(a, b) @ w2
            if b2 is not None and self.add_out_bias:
                y = y + b2
            outs.append(y)
        return torch.cat(outs) if outs else x.new_zeros(0, self.w2.shape[-1])


class MoE(nn.Module):
    """Top-k routed experts (softmax router, top-k weights renormalised) + optional shared experts.
    ``dispatch`` is replaced by expert parallelism (expert_parallel.py) with an all-to-all version."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        m = spec.moe
        self.num_experts, self.top_k = m.num_experts, m.top_k
        self.router = nn.Linear(spec.hidden_size, m.num_experts, bias=False)
        self.experts = GroupedExperts(spec)
        self.shared = MLP(spec, m.num_shared_experts * m.shared_ffn, bias=spec.linear_bias) \
            if m.num_shared_experts else None
        self.dispatch = local_dispatch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = F.softmax(self.router(x).float(), dim=-1)                 # [b, s, E]
        weights, experts = torch.topk(scores, self.top_k, dim=-1)          # [b, s, k]
        if self.top_k > 1:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        tokens = x.reshape(-1, x.shape[-1])
        out = self.dispatch(self, tokens, experts.reshape(tokens.shape[0], -1),
                            weights.reshape(tokens.shape[0], -1).to(x.dtype))
        out = out.view_as(x)
        if self.shared is not None:
            out = out + self.shared(x)
        return out


def sort_by_expert(tokens: torch.Tensor, experts: torch.Tensor, num_experts: int):
    """Repeat each token once per chosen expert and sort the copies by expert.
    Returns (sorted copies [T*k, h], order [T*k] (copy i came from flat slot order[i]), counts [E])."""
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    return tokens[order // experts.shape[1]], order, counts


def combine(expert_out: torch.Tensor, order: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Undo sort_by_expert and sum the k expert outputs of each token, weighted by the router."""
    T, k = weights.shape
    unsorted = torch.empty_like(expert_out).index_copy(0, order, expert_out)   # differentiable scatter
    return (unsorted.view(T, k, -1) * weights[..., None]).sum(dim=1)


def local_dispatch(moe: MoE, tokens: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """All experts on this rank: sort the token copies by expert, run each expert, combine."""
    x, order, counts = sort_by_expert(tokens, experts, moe.num_experts)
    return combine(moe.experts(x, counts), order, weights)


class TransformerBlock(nn.Module):
    def __init__(self, spec: ModelSpec, layer_id: int, kv_heads: int):
        super().__init__()
        self.attention_norm = make_norm(spec)
        # hybrid models: linear-attention / SSM layers get their mixer from autopar/run/mixers.py; a layer with
        # parallel mixers (Falcon-H1) has its first (the softmax attention, if any) as ``attention`` and the others
        # in ``parallel``, all reading the same normed input, outputs summed
        check_buildable(spec, layer_id)
        built = [build_token_mixer(spec, mx) or Attention(spec, kv_heads) for mx in spec.mixers_of(layer_id)]
        self.attention = built[0]
        self.parallel = nn.ModuleList(built[1:]) if len(built) > 1 else None
        self.ffn_norm = make_norm(spec)
        if spec.is_moe_layer(layer_id):
            self.moe = MoE(spec)
        else:
            self.feed_forward = MLP(spec, spec.ffn_hidden_size, bias=spec.linear_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        normed = self.attention_norm(x)
        mixed = self.attention(normed, cos, sin)
        for mixer in self.parallel or ():
            mixed = mixed + mixer(normed, cos, sin)
        x = x + mixed
        ffn = self.moe if hasattr(self, "moe") else self.feed_forward
        return x + ffn(self.ffn_norm(x))


class Transformer(nn.Module):
    """The whole model, or one pipeline stage of it: ``layer_ids`` picks the blocks, ``first``/``last``
    whether the embeddings / the final norm and LM head live here."""

    def __init__(self, spec: ModelSpec, seq_len: int, layer_ids: list[int] | None = None,
                 first: bool = True, last: bool = True, kv_heads: int | None = None, tie: bool | None = None):
        super().__init__()
        self.spec = spec
        h = spec.hidden_size
        layer_ids = list(range(spec.num_layers)) if layer_ids is None else layer_ids
        self.tie = spec.tie_embeddings and first and last if tie is None else tie
        self.tok_embeddings = nn.Embedding(spec.vocab_size, h) if first else None
        self.pos_embeddings = None
        if first and spec.position_embedding == "learned":
            if seq_len > spec.max_position_embeddings:
                raise ValueError(f"seq_len ({seq_len}) > max_position_embeddings ({spec.max_position_embeddings})")
            self.pos_embeddings = nn.Embedding(spec.max_position_embeddings, h)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(spec, i, kv_heads or spec.kv_heads)
                                     for i in layer_ids})
        self.norm = make_norm(spec) if last else None
        self.output = nn.Linear(h, spec.vocab_size, bias=False) if last else None
        if self.tie:
            self.output.weight = self.tok_embeddings.weight
        # Global positions of the tokens this rank holds (context parallelism changes them).
        self.register_buffer("positions", torch.arange(seq_len), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_embeddings is not None:
            tokens = x
            x = self.tok_embeddings(tokens)
            if self.pos_embeddings is not None:
                x = x + self.pos_embeddings(self.positions[None, :].expand(tokens.shape[0], -1))
        cos, sin = rotary(self.positions, self.spec.qk_head_dim // 2 * 2)
        for block in self.layers.values():
            x = block(x, cos, sin)
        if self.norm is not None:
            x = self.output(self.norm(x))
        return x


# ---- deterministic init ----------------------------------------------------------------------------------
def _generator(seed: int, key: str) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(f"{seed}:{key}".encode()))


def _draw(spec: ModelSpec, name: str, shape: torch.Size, g: torch.Generator) -> torch.Tensor:
    """N(0, 1) values; K/V projections built with more heads than the spec (KV heads replicated to reach
    tp, as Megatron-LM does when g < tp) start as copies of the spec's heads."""
    if (".attention.wk." in name or ".attention.wv." in name) and is_attention_layer(spec, int(name.split(".")[1])):
        rows = spec.kv_heads * (spec.qk_head_dim if ".wk." in name else spec.v_head_dim)
        if shape[0] > rows:
            w = torch.randn((rows, *shape[1:]), generator=g)
            return w.view(spec.kv_heads, -1, *shape[1:]).repeat_interleave(shape[0] // rows, 0).reshape(shape)
    return torch.randn(shape, generator=g)


@torch.no_grad()
def init_weights(model: Transformer, seed: int) -> None:
    """Draw every parameter from its own generator keyed by (seed, name): norms 1, biases 0, matrices
    N(0, 0.02), output projections (wo, w2) N(0, 0.02/sqrt(2L)) as in GPT-2. Done on the CPU, then copied,
    so values do not depend on the device, the pipeline split or the shards taken later."""
    out_std = 0.02 / (2 * model.spec.num_layers) ** 0.5
    for name, p in model.named_parameters(remove_duplicate=True):
        leaf = name.rsplit(".", 1)[-1]
        if "norm" in name and leaf == "weight":
            p.fill_(1.0)
        elif leaf in ("bias", "b1", "b2", "b3"):
            p.zero_()
        else:
            std = out_std if (".wo." in name or name.endswith("w2") or ".w2." in name) else 0.02
            # An untied LM head on a later pipeline stage starts equal to the embedding when the spec ties them.
            key = "tok_embeddings.weight" if (name == "output.weight" and model.spec.tie_embeddings) else name
            p.copy_(_draw(model.spec, name, p.shape, _generator(seed, key)) * std)


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy (in fp32) over this rank's tokens."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


# ---- synthetic data --------------------------------------------------------------------------------------
ALPHABET = 256   # distinct tokens of the synthetic task (fewer when the vocabulary is smaller)


def synthetic_batch(step: int, global_batch: int, seq_len: int, vocab: int, seed: int) -> torch.Tensor:
    """[B, s+1] tokens of a learnable task: each sequence counts up, with a random stride in 1..4, through an
    alphabet of min(vocab, ALPHABET) tokens scattered over the vocabulary (a fixed random choice per seed), from
    a random start. The loss falls in stages a model of any size goes through within a few steps: from
    ln(vocab) to ln(alphabet) (which tokens occur), then towards ln 4 (the next token is one of 4 after the
    current one), then below (the stride can be read from the context)."""
    A = min(vocab, ALPHABET)
    alphabet = torch.randperm(vocab, generator=_generator(seed, "data:alphabet"))[:A]
    g = _generator(seed, f"data:{step}")
    start = torch.randint(0, A, (global_batch, 1), generator=g)
    stride = torch.randint(1, 5, (global_batch, 1), generator=g)
    return alphabet[(start + stride * torch.arange(seq_len + 1)[None, :]) % A]
