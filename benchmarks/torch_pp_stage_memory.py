"""One pipeline rank of torchtitan's Llama 3.1 405B runs (Dec 2024 tables), emulated on one GPU: what the caching
allocator holds under 1F1B and under interleaved 1F1B, beside autopar's prediction for that rank.

Why: torchtitan@b5bcd76c benchmarks/llama3_h100_202412_torchtitan.md Table 5 (FSDP 8 x TP 8 x PP 8, 8 micro-batches
of 4 x 8192, full AC) prints 82.5 GiB for 1F1B and 72.7 for interleaved 1F1B; autopar predicts the fullest rank at
66.7 and 75.4 allocator GiB (``autopar validate --memory``): 1F1B 16 GiB short, and the interleaved run measures 10 GiB
*less* where the model (and the tensors alive at the peak) say more. tests/measure/test_published_memory.py lists
these rows as known under-predictions. This script tests, on one GPU, the hypothesis that needs no second one: that
the allocator's reserved peak exceeds the tensors alive at the peak by an amount the schedule's allocation order sets
(blocks freed in one order and requested in another, and blocks cached per stream).

    python benchmarks/torch_pp_stage_memory.py                 # on a CUDA machine: ~70 GiB, so an H200 (or a
                                                               # 96 GB H100); about 3 minutes
    python benchmarks/torch_pp_stage_memory.py --layers 4      # fewer layers (scales the stored activations)
    python benchmarks/torch_pp_stage_memory.py --smoke         # tiny shapes on the CPU, to check the script only

Emulated, rank 0 (the first stage, 15 of 126 layers under both schedules: 1F1B splits 15/16x6/15, interleaved 7 and
8 in its two chunks; torchtitan@9dec370 pipelining_utils.generate_split_points), as autopar/cost/memory.py reads
torchtitan@9dec370 and torch's FSDP2 / pipelining of that release:
- blocks at TP-8 shard shapes (torchtitan models/llama/model.py: RMSNorm on x.float(), RoPE in complex fp32,
  repeat_kv, SDPA, SwiGLU): hidden 16384, sequence-sharded between blocks (SP); 16 of 128 query heads, 1 of 8 KV
  heads (repeated to 16), FFN 6656 of 53248. SP's all-gather is emulated by concatenating 8 copies of the shard, the
  reduce-scatter by a copied 1/8 slice: the allocation sizes DTensor's collectives make, no NCCL;
- full AC per block (torch.utils.checkpoint, non-reentrant), bf16 GEMMs (the runs' Float8 linears and Float8
  all-gather are not emulated: they would lower the gathered weights to 1 B per parameter);
- FSDP2 under PP (reshard_after_forward=False; pipelining's backward_maybe_with_nosync): bf16 unsharded parameters
  kept all step; unsharded fp32 gradient accumulation (FSDPParam.to_accumulated_grad_if_needed /
  accumulate_unsharded_grad_if_needed, emulated per parameter with post-accumulate-grad hooks); after the last
  micro-batch, per block, a fp32 reduce-scatter input (4 B per parameter, kept until the next block's) and its 1/8
  output allocated on a side stream (the reduce-scatter stream), the parameters freed (reshard after backward);
  AdamW(foreach) on the fp32 1/8 master shard; zero_grad to None; the next step's all-gather as a flat bf16 buffer
  on another side stream (the copy-in stream), copied out per parameter and kept until the next block's copy-out;
- the embedding (vocab-parallel, 16032 of 128256 rows; its partial output reduce-scattered to the sequence shard);
- pipelining (torch/distributed/pipelining/stage.py): every micro-batch's stage output kept to the step's end
  (output_chunks), a gradient-receive buffer per micro-batch and chunk, an activation-receive buffer per micro-batch
  for the second chunk (allocated once, kept across steps);
- the schedule's order on rank 0 with M = 8 = PP: 1F1B runs F0..F7 then B0..B7 (warm-up = PP degree - stage
  index); interleaved runs every chunk forward (chunk 0 of micro-batches 0-7, then chunk 1) before the first
  backward (warm-up (v-1)·PP + 2·(PP-1-rank) = 22 >= 16 ops), then chunk 1's backwards, then chunk 0's.
Not emulated: NCCL's own buffers (outside the allocator's figure), the async-TP symmetric memory, torch.compile.

Printed per schedule (each in its own process, steps 1-3, the last measured): the peak allocated and the peak
reserved bytes (GiB) and their difference, and autopar's prediction for the same rank (the published row's
stage-0 memory less the chip's reserve_gib, as ``validate --memory`` compares) with the measured figure.
Not yet run on a GPU (no device was lent to the session that wrote it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

from isolated import result_line, run_isolated

ROOT = Path(__file__).resolve().parents[1]
# Llama 3.1 405B (its config.json) on one rank of TP 8: local heads, KV heads, FFN and vocab rows
GEOMETRY = dict(h=16384, heads=16, kv=1, hd=128, f=6656, vocab=16032, tp=8, mbs=4, seq=8192)
SMOKE = dict(h=64, heads=2, kv=1, hd=16, f=96, vocab=128, tp=2, mbs=1, seq=16)
ROWS = {"1f1b": "tt2412-l31-405b-h100gt-512-1f1b", "interleaved": "tt2412-l31-405b-h100gt-512-interleaved"}
M = 8              # micro-batches (torchtitan@9dec370: pipeline_parallel_microbatches defaults to the PP degree)
DP = 8             # FSDP shards


def run(schedule: str, layers: int, smoke: bool) -> dict:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    g = SMOKE if smoke else GEOMETRY
    dev = "cpu" if smoke else "cuda"
    bf16 = torch.bfloat16
    h, nh, nkv, hd, f, V, tp = g["h"], g["heads"], g["kv"], g["hd"], g["f"], g["vocab"], g["tp"]
    b, s = g["mbs"], g["seq"]

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(h, device=dev, dtype=bf16))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * self.weight

    def lin(i, o):
        return nn.Linear(i, o, bias=False, device=dev, dtype=bf16)

    def gather(x):        # SP all-gather along the sequence: a new [b, s, h] tensor (funcol's output)
        return torch.cat([x] * tp, dim=1)

    def scatter(y):       # reduce-scatter to the sequence shard: a new [b, s/tp, h] tensor
        return y[:, : y.shape[1] // tp].contiguous()

    freqs = torch.polar(torch.ones(s, hd // 2), torch.outer(
        torch.arange(s).float(), 1.0 / (500000.0 ** (torch.arange(0, hd, 2).float() / hd)))).to(dev)

    def rope(x):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs.view(1, s, 1, -1)).flatten(3).type_as(x)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.ffn_norm = RMSNorm(), RMSNorm()
            self.wq, self.wk, self.wv, self.wo = lin(h, nh * hd), lin(h, nkv * hd), lin(h, nkv * hd), lin(nh * hd, h)
            self.w1, self.w3, self.w2 = lin(h, f), lin(h, f), lin(f, h)

        def inner(self, x):
            y = gather(self.attention_norm(x))
            q = rope(self.wq(y).view(b, s, nh, hd))
            k = rope(self.wk(y).view(b, s, nkv, hd))
            v = self.wv(y).view(b, s, nkv, hd)
            k = k.unsqueeze(3).expand(b, s, nkv, nh // nkv, hd).reshape(b, s, nh, hd)
            v = v.unsqueeze(3).expand(b, s, nkv, nh // nkv, hd).reshape(b, s, nh, hd)
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True)
            x = x + scatter(self.wo(o.transpose(1, 2).reshape(b, s, nh * hd)))
            z = gather(self.ffn_norm(x))
            return x + scatter(self.w2(F.silu(self.w1(z)) * self.w3(z)))

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False, preserve_rng_state=False)

    torch.manual_seed(0)
    emb = nn.Embedding(V, h, device=dev, dtype=bf16)
    chunks = [[Block() for _ in range(layers)]] if schedule == "1f1b" else \
        [[Block() for _ in range(layers // 2)], [Block() for _ in range(layers - layers // 2)]]
    units = [emb] + [blk for c in chunks for blk in c]            # FSDP2 units: the root's embedding, each block
    params = [[p for p in u.parameters()] for u in units]
    numel = [sum(p.numel() for p in ps) for ps in params]
    shapes = [[p.shape for p in ps] for ps in params]

    # FSDP2's state: the fp32 master shard and AdamW's moments (the optimizer), per unit, 1/DP of its parameters
    master = [torch.zeros((n + DP - 1) // DP, device=dev) for n in numel]
    for m in master:
        m.requires_grad_(True)
    opt = torch.optim.AdamW(master, lr=1e-6, foreach=True)
    acc: dict[int, torch.Tensor] = {}                           # id(param) -> unsharded fp32 accumulated gradient

    def hook(p):          # FSDPParam.to_accumulated_grad_if_needed / accumulate_unsharded_grad_if_needed
        if id(p) in acc:
            acc[id(p)] += p.grad
        else:
            acc[id(p)] = p.grad.float()
        p.grad = None

    for ps in params:
        for p in ps:
            p.register_post_accumulate_grad_hook(hook)
    side = (torch.cuda.Stream(), torch.cuda.Stream()) if not smoke else (None, None)

    def on(stream):
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    def all_gather():     # the step's first forward: each unit's flat bf16 output on the copy-in stream, copied out
        kept = None
        for ps, n, shp in zip(params, numel, shapes):
            with on(side[0]):
                flat = torch.empty(n, device=dev, dtype=bf16)
            off = 0
            for p, sh in zip(ps, shp):
                k = sh.numel()
                p.data = flat[off: off + k].view(sh).clone()
                off += k
            kept = flat                                       # freed after the next unit's copy-out
        del kept

    def reduce_scatter_and_reshard():   # after the last micro-batch: per unit, fp32 input then 1/DP output
        prev = None
        for m, ps in zip(master, params):
            rs_in = torch.cat([acc.pop(id(p)).flatten() for p in ps if id(p) in acc]) if ps else None
            with on(side[1]):
                m.grad = rs_in[: m.numel()].clone() if rs_in is not None else torch.zeros_like(m)
            for p in ps:
                p.data = torch.empty(0, device=dev, dtype=bf16)
            prev = rs_in                                      # kept until the next unit's reduce-scatter
        del prev

    tokens = torch.randint(0, V, (b, s), device=dev)
    grad_recv = {(c, i): torch.empty(b, s // tp, h, device=dev, dtype=bf16)
                 for c in range(len(chunks)) for i in range(M)}
    act_recv = {i: torch.empty(b, s // tp, h, device=dev, dtype=bf16) for i in range(M)} if len(chunks) > 1 else {}

    def forward(c, i, fwd, outputs):
        if c == 0:
            x = scatter(emb(tokens))                           # vocab-parallel partial output, reduce-scattered
        else:
            x = act_recv[i].detach().normal_().requires_grad_(True)
        y = x
        for blk in chunks[c]:
            y = blk(y)
        fwd[(c, i)] = (x, y)
        outputs.append(y.detach())                            # output_chunks: kept to the step's end

    def backward(c, i, fwd):
        x, y = fwd.pop((c, i))
        torch.autograd.backward(y, grad_tensors=grad_recv[(c, i)].normal_())
        if x.requires_grad:
            x.grad = None                                     # sent to the previous rank

    order = ([("F", 0, i) for i in range(M)] + [("B", 0, i) for i in range(M)]) if schedule == "1f1b" else \
        ([("F", 0, i) for i in range(M)] + [("F", 1, i) for i in range(M)]
         + [("B", 1, i) for i in range(M)] + [("B", 0, i) for i in range(M)])
    all_gather()
    rec = dict(schedule=schedule, layers=layers, microbatches=M, mbs=b, seq=s)
    for step in range(3):
        if not smoke:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        fwd: dict = {}
        outputs: list = []
        for kind, c, i in order:
            if kind == "F":
                forward(c, i, fwd, outputs)
            else:
                backward(c, i, fwd)
        reduce_scatter_and_reshard()
        assert not acc and not fwd and all(m.grad is not None for m in master), "a gradient was not reduced"
        opt.step()
        opt.zero_grad(set_to_none=True)
        del outputs
        all_gather()                                          # the next step's first forward gathers again
        if not smoke:
            torch.cuda.synchronize()
            st = torch.cuda.memory_stats()
            rec.update(step=step, peak_allocated_gib=st["allocated_bytes.all.peak"] / 2**30,
                       peak_reserved_gib=st["reserved_bytes.all.peak"] / 2**30)
    rec["params_per_gpu"] = sum(numel)
    return rec


def predicted(schedule: str) -> tuple[float, float]:
    """autopar's stage-0 allocator GiB for the published row (the model less reserve_gib, as validate --memory
    compares) and the row's measured GiB (the maximum over all GPUs, not rank 0's alone)."""
    sys.path.insert(0, str(ROOT))
    from autopar.cost.estimator import Estimator
    from autopar.cost.memory import stage_memory
    from autopar.measure.validation import load_cases
    c = {c.row_id: c for c in load_cases()[0]}[ROWS[schedule]]
    est = Estimator(c.model, c.hardware, c.training, c.gpus)
    L = est.resolve(c.layout)
    m = stage_memory(est.profile, est.stages(L.stage_layers)[0], L, c.training, c.hardware)
    return m.total - c.hardware.reserve_gib, c.measured_mem_gib


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (checks the script only)")
    ap.add_argument("--layers", type=int, default=15, help="layers on the rank (default 15, as both schedules)")
    ap.add_argument("--one", help=argparse.SUPPRESS)     # internal: the schedule run in this process
    ap.add_argument("--out", help="write the records as JSON here")
    a = ap.parse_args()
    if not 2 <= a.layers <= 32:
        ap.error("--layers must be 2..32")
    if not a.smoke and not a.one:
        import torch
        if not torch.cuda.is_available():
            print("torch_pp_stage_memory: error: no CUDA device (--smoke runs tiny shapes on the CPU)", file=sys.stderr)
            return 2
    if a.one:
        print(result_line(run(a.one, a.layers, a.smoke)), flush=True)
        return 0
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")   # torchtitan's run script
    recs = []
    for schedule in ROWS:
        cmd = [sys.executable, __file__, "--one", schedule, "--layers", str(a.layers)] + (["--smoke"] if a.smoke
                                                                                            else [])
        print(f"{schedule}: rank 0, {a.layers} layers, {M} micro-batches ...", flush=True)
        rec = run_isolated(cmd, env, timeout=900)
        if rec is None:
            continue
        if not a.smoke:
            pred, meas = predicted(schedule)
            rec.update(predicted_gib=pred, published_gib=meas,
                       excess_gib=rec["peak_reserved_gib"] - rec["peak_allocated_gib"])
            print(f"  peak allocated {rec['peak_allocated_gib']:.2f} GiB, reserved {rec['peak_reserved_gib']:.2f} "
                  f"(excess {rec['excess_gib']:.2f})" + (f"; autopar's rank-0 prediction {pred:.2f} (its Float8 "
                  f"weights counted as bf16, as here; published maximum over all GPUs {meas})" if a.layers == 15
                                                          else ""))
        else:
            print(f"  ran: {rec}")
        recs.append(rec)
    if a.out:
        Path(a.out).write_text(json.dumps(recs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
