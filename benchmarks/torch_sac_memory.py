"""Memory PyTorch's runtime holds for a torchtitan Llama block stack, measured on one GPU.

What is measured: the stored activations per layer under torchtitan's op-level selective AC, eager against
torch.compile'd blocks, and under full AC; the loss path's peak (bf16 logits upcast, cross entropy, ``del pred``,
backward); the caching allocator's reserved against allocated peak (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:
True``, as torchtitan's run script sets it).

    python benchmarks/torch_sac_memory.py            # on a CUDA machine, about 3 minutes on one H200
    python benchmarks/torch_sac_memory.py --fsdp     # the whole step with FSDP2 and AdamW, about 2 minutes
    python benchmarks/torch_sac_memory.py --compiled-loss   # compiled blocks, the loss compiled too (torchtitan
                                                             # from 2025-04), about 2 minutes; not yet run on a GPU
    python benchmarks/torch_sac_memory.py --smoke    # tiny shapes on the CPU, to check the script (no memory figures)

The blocks are written after torchtitan@9dec370 torchtitan/models/llama/model.py (RMSNorm with ``x.float()``, RoPE
through complex fp32, repeat_kv, SDPA, SwiGLU ``w2(silu(w1 x) * w3 x)``, pre-norm residuals); the op-SAC policy is
torchtitan@9dec370 torchtitan/parallelisms/parallelize_llama.py ``_save_list`` with its mm counter (every second mm
recomputed); the loss is train.py@9dec370's ``cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))``
followed by ``del pred``. One GPU, no FSDP, bf16 parameters: what differs between the variants is the activations.

Printed per variant (each in its own process, so that one's cached blocks do not serve another): bytes held after
the forward and loss above the parameters (the stored activations, the final norm's tensors and the fp32 log-softmax
output), the peak allocated and reserved bytes of the step above the parameters and gradients, and, from two layer
counts, the stored bytes per layer per token in units of h (elements of 2 B), to set beside the model's
``activation_elems_per_token`` (autopar/cost/memory.py): 7.75 h per layer for Llama 3.1 8B under op SAC, 1 h under
full AC.

Measured 2026-11-26 on one H200 (torch 2.11.0+cu130, expandable segments; GiB above the parameters, step 3):

    variant           layers  after fwd  peak allocated  reserved - allocated (peaks)  stored per layer
    eager op SAC         2/6  10.27/14.15   25.93/29.81      4.29/4.29                 7.766 h
    compiled op SAC      2/6  10.02/13.40   25.68/29.06      4.17/4.22                 6.766 h
    compiled full AC     2/6   8.58/9.08    24.23/24.73      4.24/4.24                 1.000 h
    eager full AC        2/6   8.58/9.08    24.23/24.73      4.04/4.17                 1.000 h

(2.10e9 logit elements: the 12 B loss peak is 23.5 GiB; the reserved excess is 2.07-2.19 B per logit element.)

With ``--fsdp`` (FSDP2 on one rank, fp32 parameters, AdamW(foreach), zero_grad to None, step 4), 6 layers: the step
starts at 26.43 GiB (fp32 parameters and Adam moments); peak allocated above that 32.17 (eager op SAC), 31.42
(compiled op SAC), 27.10 (compiled full AC), 2.36 GiB above the runs without FSDP2: the root's gathered embedding
and head (1.96) and the last block, not resharded after its forward (0.41); reserved minus allocated at the peaks
13.13, 13.12, 12.93 GiB: the loss path's 4.2 and 8.7-8.9 more, the size of the fp32 gradients (8.79 GiB), whose
blocks (and the foreach optimizer's temporaries of that size) stay cached when zero_grad frees them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

from isolated import free_port, result_line, run_isolated

GEOMETRY = dict(h=4096, f=14336, heads=32, kv=8, vocab=128256)      # Llama 3.1 8B (its config.json)
SMOKE = dict(h=64, f=192, heads=4, kv=2, vocab=512)


def run_variant(mode: str, ac: str, layers: int, mbs: int, seq: int, smoke: bool, fsdp: bool = False,
                compiled_loss: bool = False) -> dict:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    g = SMOKE if smoke else GEOMETRY
    dev = "cpu" if smoke else "cuda"
    h, f, nh, nkv, V = g["h"], g["f"], g["heads"], g["kv"], g["vocab"]
    hd = h // nh

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(h))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * self.weight

    def rope(xq, xk, freqs):
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        fr = freqs.view(1, xq_.shape[1], 1, xq_.shape[-1])
        return (torch.view_as_real(xq_ * fr).flatten(3).type_as(xq),
                torch.view_as_real(xk_ * fr).flatten(3).type_as(xk))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.ffn_norm = RMSNorm(), RMSNorm()
            self.wq, self.wk = nn.Linear(h, h, bias=False), nn.Linear(h, nkv * hd, bias=False)
            self.wv, self.wo = nn.Linear(h, nkv * hd, bias=False), nn.Linear(h, h, bias=False)
            self.w1, self.w3 = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False)
            self.w2 = nn.Linear(f, h, bias=False)

        def attention(self, x, freqs):
            b, s, _ = x.shape
            q, k, v = self.wq(x), self.wk(x), self.wv(x)
            q, k, v = q.view(b, s, -1, hd), k.view(b, s, -1, hd), v.view(b, s, -1, hd)
            q, k = rope(q, k, freqs)
            rep = nh // nkv
            k = k.unsqueeze(3).expand(b, s, nkv, rep, hd).reshape(b, s, nh, hd)
            v = v.unsqueeze(3).expand(b, s, nkv, rep, hd).reshape(b, s, nh, hd)
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            return self.wo(o.transpose(1, 2).contiguous().view(b, s, -1))

        def forward(self, x, freqs):
            hh = x + self.attention(self.attention_norm(x), freqs)
            y = self.ffn_norm(hh)
            return hh + self.w2(F.silu(self.w1(y)) * self.w3(y))

    save_list = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_efficient_attention.default,
                 torch.ops.aten._scaled_dot_product_flash_attention.default}

    def context_fn():
        meta = defaultdict(int)

        def policy(ctx, func, *args, **kwargs):
            key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
            if func == torch.ops.aten.mm.default:
                meta[key] += 1
            save = func in save_list and not (func == torch.ops.aten.mm.default and meta[key] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE
        return create_selective_checkpoint_contexts(policy)

    class Wrapped(nn.Module):
        def __init__(self, block):
            super().__init__()
            self.block = block

        def forward(self, x, freqs):
            if ac == "op":
                return checkpoint(self.block, x, freqs, use_reentrant=False, context_fn=context_fn,
                                  preserve_rng_state=False)
            return checkpoint(self.block, x, freqs, use_reentrant=False, preserve_rng_state=False)

    torch.manual_seed(0)
    blocks = nn.ModuleList([Wrapped(Block()) for _ in range(layers)])
    emb, norm, out = nn.Embedding(V, h), RMSNorm(), nn.Linear(h, V, bias=False)
    # FSDP2 as torchtitan@9dec370 apply_fsdp runs it: fp32 parameters, bf16 compute, fp32 gradient reduction, each
    # block then the root sharded (one rank here, so the shards are whole), AdamW(foreach), zero_grad to None
    freqs = torch.polar(torch.ones(seq, hd // 2), torch.outer(
        torch.arange(seq).float(), 1.0 / (500000.0 ** (torch.arange(0, hd, 2).float() / hd)))).to(dev)
    class Root(nn.Module):     # torchtitan's Transformer: embedding, blocks, final norm, head
        def __init__(self):
            super().__init__()
            self.emb, self.blocks, self.norm, self.out = emb, blocks, norm, out

        def forward(self, tokens):
            x = self.emb(tokens)
            for blk in self.blocks:
                x = blk(x, freqs)
            return self.out(self.norm(x))

    model = Root().to(device=dev, dtype=torch.float32 if fsdp else torch.bfloat16)
    if mode == "compiled":
        for i, blk in enumerate(blocks):
            blocks[i] = torch.compile(blk, fullgraph=True)
    opt = None
    if fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for i, blk in enumerate(blocks):
            fully_shard(blk, mp_policy=mp, reshard_after_forward=i < layers - 1)
        fully_shard(model, mp_policy=mp)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    tokens = torch.randint(0, V, (mbs, seq), device=dev)
    labels = torch.randint(0, V, (mbs, seq), device=dev)

    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = [SDPBackend.MATH] if smoke else [SDPBackend.FLASH_ATTENTION]   # torch 2.5/2.6's H100 default (FA2)

    def step():
        with sdpa_kernel(backend):
            return _step()

    def loss_fn(pred, labels):   # torchtitan@e7c0cae torchtitan/components/loss.py cross_entropy_loss
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
    if compiled_loss:            # build_cross_entropy_loss under --training.compile (from bbb1b616e, 2025-04-02)
        loss_fn = torch.compile(loss_fn)

    def _step():
        pred = model(tokens)
        loss = loss_fn(pred, labels)
        del pred
        after_fwd = torch.cuda.memory_allocated() if not smoke else 0
        loss.backward()
        return after_fwd

    params = sum(p.numel() * p.element_size() for p in model.parameters())
    rec = dict(mode=mode, ac=ac, layers=layers, mbs=mbs, seq=seq, fsdp=fsdp, compiled_loss=compiled_loss,
               params_gib=params / 2**30)
    for i in range(4 if fsdp else 3):           # the last step is measured (compile and caches warm)
        for p in model.parameters():
            p.grad = None
        if smoke:
            step()
            if opt:
                opt.step()
            continue
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()    # parameters and optimizer state (grads freed above)
        torch.cuda.reset_peak_memory_stats()
        after_fwd = step()
        torch.cuda.synchronize()
        st = torch.cuda.memory_stats()
        rec.update(step=i, base_gib=base / 2**30, after_fwd_gib=(after_fwd - base) / 2**30,
                   peak_alloc_gib=(st["allocated_bytes.all.peak"] - base) / 2**30,
                   peak_reserved_gib=st["reserved_bytes.all.peak"] / 2**30,
                   peak_alloc_abs_gib=st["allocated_bytes.all.peak"] / 2**30,
                   grads_gib=sum(p.grad.numel() * p.grad.element_size() for p in model.parameters()
                                 if p.grad is not None) / 2**30)
        if opt:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            opt.step()
            torch.cuda.synchronize()
            st = torch.cuda.memory_stats()
            rec.update(step_peak_alloc_abs_gib=st["allocated_bytes.all.peak"] / 2**30,
                       step_peak_reserved_gib=st["reserved_bytes.all.peak"] / 2**30)
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (checks the script only)")
    ap.add_argument("--one", help=argparse.SUPPRESS)     # internal: mode,ac,layers as JSON
    ap.add_argument("--out", help="write the records as JSON here")
    ap.add_argument("--fsdp", action="store_true", help="the whole torchtitan step instead: FSDP2 on one rank, AdamW")
    ap.add_argument("--compiled-loss", action="store_true",
                    help="compiled blocks with the loss compiled too (torchtitan's build_cross_entropy_loss from "
                         "2025-04), eager loss beside it for comparison")
    a = ap.parse_args()
    mbs, seq = (1, 16) if a.smoke else (2, 8192)
    if a.one:
        mode, ac, layers, fsdp, compiled_loss = (json.loads(a.one) + [False])[:5]
        if fsdp:
            import torch.distributed as dist
            dist.init_process_group("gloo" if a.smoke else "nccl", rank=0, world_size=1)
        print(result_line(run_variant(mode, ac, layers, mbs, seq, a.smoke, fsdp, compiled_loss)),
              flush=True)
        return 0
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=free_port())
    recs = []
    variants = [(m, ac, n, False, False) for m, ac in (("eager", "op"), ("compiled", "op"), ("compiled", "full"),
                                                        ("eager", "full")) for n in (2, 6)]
    if a.fsdp:
        variants = [("eager", "op", 6, True, False), ("compiled", "op", 6, True, False),
                    ("compiled", "full", 6, True, False)]
    if a.compiled_loss:
        variants = [("compiled", "op", n, a.fsdp, cl) for cl in (False, True) for n in (2, 6)]
    for mode, ac, layers, fsdp, compiled_loss in variants:
        if True:
            cmd = [sys.executable, __file__, "--one", json.dumps([mode, ac, layers, fsdp, compiled_loss])] + (
                ["--smoke"] if a.smoke else [])
            print(f"{mode:8s} {ac:4s} AC, {layers} layers{', FSDP2 + AdamW' if fsdp else ''}"
                  f"{', compiled loss' if compiled_loss else ''} ...", flush=True)
            rec = run_isolated(cmd, env, timeout=240)
            if rec is None:
                continue
            recs.append(rec)
            print("  " + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items()))
    if not a.smoke:
        g, tokens = GEOMETRY, mbs * seq
        for mode, ac, cl in {(r["mode"], r["ac"], r.get("compiled_loss", False)) for r in recs}:
            two = {r["layers"]: r for r in recs if (r["mode"], r["ac"], r.get("compiled_loss", False)) == (mode, ac, cl)}
            if 2 in two and 6 in two:
                per = (two[6]["after_fwd_gib"] - two[2]["after_fwd_gib"]) * 2**30 / 4
                excess = [r["peak_reserved_gib"] - r["peak_alloc_abs_gib"] for r in two.values()]
                print(f"{mode} {ac} AC{', compiled loss' if cl else ''}: stored per layer {per / 2**20:.1f} MiB = "
                      f"{per / (tokens * g['h'] * 2):.3f} h elements of 2 B per token; loss-path share after the "
                      f"forward {two[2]['after_fwd_gib'] - 2 * per / 2**30:.2f} GiB "
                      f"({(two[2]['after_fwd_gib'] * 2**30 - 2 * per) / (tokens * g['vocab']):.2f} B per logit "
                      f"element); reserved - allocated at the peaks {min(excess):.2f}-{max(excess):.2f} GiB "
                      f"({min(excess) * 2**30 / (tokens * g['vocab']):.2f}-"
                      f"{max(excess) * 2**30 / (tokens * g['vocab']):.2f} B per logit element)")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(recs, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
