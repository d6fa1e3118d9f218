"""What torchtitan's cross entropy keeps for its backward, eager against torch.compile'd, measured on this machine.

The loss is torchtitan's (pytorch/torchtitan@e7c0cae torchtitan/components/loss.py ``cross_entropy_loss``:
``F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))``), wrapped in ``torch.compile`` by
``build_cross_entropy_loss`` when ``--training.compile`` is on (from bbb1b616e, 2025-04-02; at 9dec370, the Dec 2024
release, the compile is commented out in train.py:137-138; from 08b8b244f, 2025-08-20, ``compile.components``
defaults to ["model", "loss"]). The trainer drops its reference to the bf16 logits before the backward (``del pred``),
so what the loss keeps for its backward, and what its backward allocates, is what the last stage holds at the loss
backward's peak (autopar/cost/memory.py, PyTorch's loss path).

Four variants, each on bf16 logits [tokens, V] that require grad, with Llama 3's vocabulary (128,256: the row width
decides the reduction's code shape; the token count only scales every figure):

    eager    plain          ATen log_softmax + nll_loss
    compiled plain          the same under torch.compile (AOTAutograd's partition, Inductor's kernels)
    eager    loss_parallel  DTensor logits sharded on the vocabulary, under ``loss_parallel()`` (TP > 1)
    compiled loss_parallel  the same under torch.compile (its handlers traced into the graph)

(loss_parallel runs on a one-rank gloo mesh: the handlers and the graph are those of TP > 1, each collective over
one rank.) Printed per variant, in bytes per logit element:

* saved: the tensors autograd keeps for the loss's backward (``torch.autograd.graph.saved_tensors_hooks`` around the
  call), and whether they are the caller's bf16 logits (which then stay alive after ``del pred``);
* backward peak: the saved tensors plus the most the backward allocates at once above them (the CPU allocator's
  allocation events, ``torch.profiler`` with ``profile_memory``), the logits' gradient it returns included;
* forward peak: the logits plus the most the forward allocates above them.

What carries over to CUDA: the partition (which tensors are saved, in which dtype) is AOTAutograd's min-cut on the
joint graph and does not depend on the device. The backward's buffers are Inductor's: here the C++ backend's
kernels; the Triton backend fuses the same pointwise chain into one kernel too, but its allocations were not
measured: the backward's figure for CUDA is APPROXIMATE. The eager figures are ATen's on either device (the H200
measurement, benchmarks/torch_sac_memory.py, found the eager plain loss's 12 B at the peak). Neither counts what the
CUDA caching allocator keeps cached beside the live tensors (autopar/cost/memory.py, torch_loss_bytes).

    python benchmarks/torch_compiled_loss_memory.py               # 1024 tokens: about a minute, ~2 GiB
    python benchmarks/torch_compiled_loss_memory.py --tokens 256  # quicker

Measured 2026-11-26 on the CPU build machine (torch 2.13.0+cpu, Inductor's C++ backend), 1024 x 128256 logits:

    variant                  saved B/elt (of it the bf16 logits)   backward peak B/elt   forward peak B/elt
    eager    plain             4.00 (0.00)                           12.00                 10.00
    compiled plain             2.00 (2.00)                            4.00                  2.00
    eager    loss_parallel     4.00 (0.00)                           16.00                 14.00
    compiled loss_parallel     4.00 (0.00)                            6.00                 10.00

(Re-run 2026-11-26 on the same machine with --tokens 256: the same figures per element; compiled loss_parallel's
forward peak is 10.00, the figure autopar/cost/memory.py TORCH_LOSS_BYTES uses, where this table first read 6.00.)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sys

from isolated import free_port, result_line, run_isolated

VOCAB = 128256    # Llama 3 (meta-llama/Llama-3.1-8B config.json vocab_size)


def _alloc_peak(fn) -> float:
    """The most bytes ``fn`` has allocated at once above what was allocated when it started, from the CPU
    allocator's events (torch.profiler ``profile_memory``; frees are negative)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    now = peak = 0
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    for e in events:
        now += e.nbytes()
        peak = max(peak, now)
    return float(peak)


def run(compiled: bool, tp: bool, tokens: int, vocab: int) -> dict:
    import torch
    import torch.nn.functional as F

    def cross_entropy_loss(pred, labels):   # torchtitan@e7c0cae torchtitan/components/loss.py
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

    fn = torch.compile(cross_entropy_loss) if compiled else cross_entropy_loss
    torch.manual_seed(0)
    labels = torch.randint(0, vocab, (1, tokens))
    elems = tokens * vocab
    ctx = None
    if tp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor
        from torch.distributed.tensor.parallel import loss_parallel
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
        ctx = loss_parallel

    def make_pred():
        x = torch.randn(1, tokens, vocab, dtype=torch.bfloat16)
        if tp:
            x = distribute_tensor(x, mesh, [Shard(2)])
        return x.requires_grad_()

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    def step(record: bool):
        pred = make_pred()
        ptr = local(pred).untyped_storage().data_ptr()
        saved: dict[int, tuple[int, bool]] = {}   # storage -> (bytes, is the caller's logits): each counted once

        def pack(t):
            st = local(t).untyped_storage()
            saved[st.data_ptr()] = (st.nbytes(), st.data_ptr() == ptr)
            return t

        out = {}

        def forward():
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out["loss"] = fn(pred, labels)

        cm = ctx() if ctx else contextlib.nullcontext()
        with cm:
            out["fwd_peak"] = _alloc_peak(forward) if record else (forward() or 0.0)
            loss = out.pop("loss")
            keep = pred   # the leaf: its .grad is the logits' gradient
            del pred      # torchtitan's ``del pred``: only autograd's references remain
            out["bwd_peak"] = _alloc_peak(loss.backward) if record else (loss.backward() or 0.0)
        assert local(keep.grad).shape == (1, tokens, vocab)
        saved_b = sum(n for n, _ in saved.values())
        logits_b = sum(n for n, lg in saved.values() if lg)
        return dict(saved=saved_b / elems, saved_logits=logits_b / elems,
                    bwd_peak=(saved_b + out["bwd_peak"]) / elems,
                    fwd_peak=2.0 + out["fwd_peak"] / elems)

    step(record=False)             # compile and warm up
    return step(record=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024, help="logit rows (b*s), 1 to 65536, default 1024")
    ap.add_argument("--vocab", type=int, default=VOCAB, help=f"logit columns, 2 to 1048576, default {VOCAB} (Llama 3)")
    ap.add_argument("--one", help=argparse.SUPPRESS)     # internal: "compiled,tp" as 0/1 digits
    a = ap.parse_args()
    if not 1 <= a.tokens <= 65536 or not 2 <= a.vocab <= 1 << 20:
        print("torch_compiled_loss_memory: error: --tokens must be in [1, 65536] and --vocab in [2, 1048576]",
              file=sys.stderr)
        return 2
    if a.one:   # one variant in this process (Dynamo's cache for the shared loss function stays per variant)
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=0, world_size=1)
        compiled, tp = (x == "1" for x in a.one.split(","))
        try:
            print(result_line(run(compiled, tp, a.tokens, a.vocab)), flush=True)
        finally:
            dist.destroy_process_group()
        return 0
    import torch
    print(f"torch {torch.__version__}, {datetime.date.today().isoformat()}, CPU (Inductor C++ backend), "
          f"{a.tokens} x {a.vocab} bf16 logits; bytes per logit element")
    print(f"{'variant':24s} {'saved':>7s} {'(logits)':>9s} {'bwd peak':>9s} {'fwd peak':>9s}")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port())
    for tp in (False, True):
        for compiled in (False, True):
            name = f"{'compiled' if compiled else 'eager':8s} {'loss_parallel' if tp else 'plain'}"
            cmd = [sys.executable, __file__, "--one", f"{int(compiled)},{int(tp)}", "--tokens", str(a.tokens),
                   "--vocab", str(a.vocab)]
            print(f"{name:24s}", end=" ", flush=True)   # progress: the variant's name while it runs
            v = run_isolated(cmd, env, timeout=900)
            if v is None:
                continue
            print(f"{v['saved']:7.2f} {v['saved_logits']:9.2f} {v['bwd_peak']:9.2f} "
                  f"{v['fwd_peak']:9.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
