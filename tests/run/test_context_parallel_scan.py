"""Context parallelism for linear-attention / SSM mixers (autopar/run/context_parallel.py, StatePassingScan):

- one process: every scan continued from a non-zero initial state equals its recurrent reference, and the chunk
  summaries (transition T, state, Q) composed in sequence order give the full-sequence scan (values, gradients);
- gloo, 2 and 4 ranks: each rank's zig-zag slice of the output, and its inputs' gradients, equal the single-rank
  full-sequence scan's, for every mixer kind (float64);
- (slow) hybrid models under CP2, CP4, CP2·TP2 and CP2·PP2 train to the single-process losses.
"""

from __future__ import annotations

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from autopar.run.mixers import (ChunkScan, LinearMixer, advance, chunk_decay_attention,  # noqa: E402
                                chunk_gated_delta_rule, chunk_selective_scan, recurrent_decay_attention,
                                recurrent_gated_delta_rule, recurrent_selective_scan)
from autopar.specs import ModelSpec, TrainingSpec  # noqa: E402
from autopar.specs.mixers import MixerSpec  # noqa: E402
from _equivalence import assert_losses_match  # noqa: E402  (tests/run/_equivalence.py)

KINDS = ["gla", "lightning", "mamba2", "gated_deltanet", "mamba1"]
MIXERS = {
    "gla": dict(kind="gla", num_heads=4, head_dim=16, output_gate=True, chunk_size=4),
    "gdn": dict(kind="gated_deltanet", num_heads=2, num_value_heads=4, head_dim=16, output_gate=True, chunk_size=4),
    "lit": dict(kind="lightning", num_heads=4, head_dim=16, output_gate=True, chunk_size=4),
    "mam": dict(kind="mamba2", num_heads=4, head_dim=16, state_size=8, n_groups=2, chunk_size=4),
    "kda": dict(kind="kda", num_heads=4, head_dim=16, chunk_size=4),
    "m1": dict(kind="mamba1", inner_size=128, state_size=8, dt_rank=8, conv_kernel=4, bc_norms=True, chunk_size=4),
}


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _inputs(kind: str, s: int, seed: int = 0) -> tuple[list[torch.Tensor], callable]:
    """Leaf tensors of one scan (float64, requires_grad) and a function mapping them to ChunkScan's arguments
    (the gates pass through logsigmoid / softplus / sigmoid as in LinearMixer)."""
    b, H, dk, dv, d, N = 2, 3, 5, 4, 3, 4
    if kind == "mamba1":
        leaves = [_rand(b, d, s, seed=seed), _rand(b, d, s, seed=seed + 1), _rand(d, N, seed=seed + 2),
                  _rand(b, s, N, seed=seed + 3), _rand(b, s, N, seed=seed + 4), _rand(d, seed=seed + 5)]

        def args(x, dt_logit, A_log, B, C, D):
            return x, F.softplus(dt_logit), -A_log.exp(), (B, C), D
    else:
        gate_shape = (b, H, s, dk) if kind == "gla" else (b, H, s)
        leaves = [_rand(b, H, s, dk, seed=seed), _rand(b, H, s, dk, seed=seed + 1), _rand(b, H, s, dv, seed=seed + 2),
                  _rand(*gate_shape, seed=seed + 3)]
        if kind == "gated_deltanet":
            leaves.append(_rand(b, H, s, seed=seed + 4))

        def args(q, k, v, gate, beta_logit=None):
            if kind == "gated_deltanet":
                return q, F.normalize(k, dim=-1), v, F.logsigmoid(gate), beta_logit.sigmoid()
            return q, k, v, F.logsigmoid(gate) * (4.0 if kind == "mamba2" else 1.0)   # mamba2: faster decays
    for t in leaves:
        t.requires_grad_(True)
    return leaves, args


# ---- one process ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["gla", "lightning", "gated_deltanet", "mamba1"])
def test_chunked_scan_from_an_initial_state_equals_the_recurrence(kind):
    s = 19
    leaves, args = _inputs(kind, s, seed=3)
    a = args(*leaves)
    if kind == "mamba1":
        h0 = _rand(2, 3, 4, seed=9)
        ref = recurrent_selective_scan(*a[:3], *a[3], a[4], initial_state=h0, output_final_state=True)
        got = chunk_selective_scan(*a[:3], *a[3], a[4], chunk=8, initial_state=h0, output_final_state=True)
    elif kind == "gated_deltanet":
        S0 = _rand(2, 3, 5, 4, seed=9)
        ref = recurrent_gated_delta_rule(*a, initial_state=S0, output_final_state=True)
        got = chunk_gated_delta_rule(*a, chunk=8, initial_state=S0, output_final_state=True)
    else:
        S0 = _rand(2, 3, 5, 4, seed=9)
        ref = recurrent_decay_attention(*a, initial_state=S0, output_final_state=True)
        got = chunk_decay_attention(*a, chunk=8, initial_state=S0, output_final_state=True)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("s, pieces", [(32, 2), (32, 4), (24, 8)])
def test_chunk_summaries_composed_in_order_give_the_full_scan(kind, s, pieces):
    """The algebra state passing relies on, without communication: final = T·S0 + state, output = out + Q·S0."""
    scan = ChunkScan("gated_deltanet" if kind == "gated_deltanet" else kind, chunk=4)
    leaves, args = _inputs(kind, s)
    full = scan(*args(*leaves))
    outs, S = [], None
    for summary in scan.summaries(*args(*leaves), pieces=pieces):
        S = torch.zeros_like(summary.state) if S is None else S
        outs.append(summary.output(S))
        S = advance(summary.transition, summary.state, S)
    got = torch.cat(outs, dim=scan.seq_dim)
    torch.testing.assert_close(got, full, rtol=1e-10, atol=1e-11)
    cot = _rand(*full.shape, seed=42)
    g_full = torch.autograd.grad((full * cot).sum(), leaves)
    g_got = torch.autograd.grad((got * cot).sum(), leaves)
    for a, b in zip(g_got, g_full):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_a_wrong_transition_is_caught():
    """The composition test can fail: dropping the transition (each chunk from zero) changes the output."""
    scan = ChunkScan("gla", chunk=4)
    leaves, args = _inputs("gla", 16)
    full = scan(*args(*leaves))
    got = torch.cat([s.out for s in scan.summaries(*args(*leaves), pieces=2)], dim=2)
    assert (got - full).abs().max() > 1e-3


def test_ring_attention_cannot_replace_a_linear_scan_but_wrappers_can():
    from autopar.run.context_parallel import RingAttention
    from autopar.run.recompute import Checkpointed
    spec = ModelSpec(name="t", num_layers=1, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                     vocab_size=128, mixers={"m": MIXERS["gla"]}, layer_pattern=["m"])
    mod = LinearMixer(spec, MixerSpec(**MIXERS["gla"]))
    with pytest.raises(ValueError, match="scan of a gla layer can be wrapped .* not replaced by RingAttention"):
        mod.core = RingAttention.__new__(RingAttention)      # what apply_context_parallel gives attention layers
    scan = mod.core
    mod.core = Checkpointed(Checkpointed(scan))             # wrappers of wrappers (StatePassingScan has .inner too)
    assert mod.core.inner.inner is scan


# ---- gloo, several ranks --------------------------------------------------------------------------------------
def _rank_main(rank: int, world: int, init_file: str, kind: str, s: int, out_dir: str) -> None:
    """One CP rank: scan its zig-zag slice with StatePassingScan; compare with the full-sequence scan it also runs
    (same seeds on every rank); write what it found."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from autopar.run.context_parallel import StatePassingScan, zigzag_indices
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        mesh = DeviceMesh("cpu", torch.arange(world), mesh_dim_names=("cp",))
        inner = ChunkScan(kind, chunk=4)
        leaves, args = _inputs(kind, s)
        full = inner(*args(*leaves))
        cot = _rand(*full.shape, seed=42)
        g_full = torch.autograd.grad((full * cot).sum(), leaves)

        idx = zigzag_indices(s, world, rank)
        seq_dim = {"mamba1": [2, 2, None, 1, 1, None]}.get(kind, [2] * len(leaves))
        mine = [(t.detach().index_select(d, idx) if d is not None else t.detach()).requires_grad_(True)
                for t, d in zip(leaves, seq_dim)]
        out = StatePassingScan(inner, mesh)(*args(*mine))
        ref = full.detach().index_select(inner.seq_dim % full.dim(), idx)
        grads = torch.autograd.grad((out * cot.index_select(inner.seq_dim % full.dim(), idx)).sum(), mine)
        errors = {"out": float((out - ref).abs().max())}
        for i, (g, gf, d) in enumerate(zip(grads, g_full, seq_dim)):
            if d is None:                       # a parameter shared by all chunks: the ranks' parts sum to it
                dist.all_reduce(g)
                errors[f"grad{i}"] = float((g - gf).abs().max())
            else:
                errors[f"grad{i}"] = float((g - gf.index_select(d, idx)).abs().max())
        with open(os.path.join(out_dir, f"{rank}.txt"), "w") as f:
            f.write(repr(errors))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_state_passing_over_gloo_ranks_equals_the_full_sequence_scan(kind, world):
    import torch.multiprocessing as tmp
    s = 12 * world           # CP chunks of 6 tokens, the scan's sub-chunks of 4: padding inside each CP chunk too
    with tempfile.TemporaryDirectory() as d:
        tmp.spawn(_rank_main, args=(world, os.path.join(d, "init"), kind, s, d), nprocs=world, join=True)
        found = [eval(open(os.path.join(d, f"{r}.txt")).read()) for r in range(world)]   # noqa: S307 (own file)
    for rank, errors in enumerate(found):
        for what, err in errors.items():
            assert err < 1e-9, f"rank {rank} {what}: {err}"


# ---- whole models, loss equivalence ---------------------------------------------------------------------------


def _tiny(name: str, pattern: list[str], **extra) -> ModelSpec:
    used = {m for p in pattern for m in p.split("+") if m != "attention"}
    return ModelSpec(name=name, num_layers=len(pattern), hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                     num_kv_heads=2, vocab_size=128, mixers={m: MIXERS[m] for m in used}, layer_pattern=pattern,
                     **extra)


MODELS = {
    "gla_attn": _tiny("tiny_gla", ["gla", "attention", "gla", "attention"]),
    "mamba2_attn": _tiny("tiny_mamba2", ["mam", "attention", "mam", "attention"]),
    "gdn_lit_kda": _tiny("tiny_delta", ["gdn", "lit", "attention", "kda"]),
    "jamba_like": _tiny("tiny_jamba", ["m1", "m1", "attention", "m1"], position_embedding="none",
                        moe=dict(num_experts=4, top_k=2, expert_ffn_hidden_size=64, moe_layer_interval=2)),
    "falcon_h1_like": _tiny("tiny_falcon", ["attention+mam"] * 2, head_dim=32),
}
CASES = [("gla_attn", 2, dict(cp=2)), ("mamba2_attn", 2, dict(cp=2)), ("gdn_lit_kda", 2, dict(cp=2)),
         ("jamba_like", 2, dict(cp=2)), ("falcon_h1_like", 2, dict(cp=2, recompute="selective")),
         ("gla_attn", 4, dict(cp=4)), ("mamba2_attn", 4, dict(cp=2, tp=2)), ("gdn_lit_kda", 4, dict(cp=2, pp=2))]


@pytest.mark.slow
@pytest.mark.parametrize("model, world, layout", CASES,
                         ids=[f"{m}-w{w}-" + "-".join(f"{k}{v}" for k, v in lay.items()) for m, w, lay in CASES])
def test_hybrid_losses_under_context_parallelism_match_the_single_process_run(model, world, layout):
    ref, got = assert_losses_match(MODELS[model], layout, world, TrainingSpec(seq_len=32, global_batch=4))
    assert got.applied["cp"] == layout["cp"]
    assert ref.losses[0] - min(ref.losses) > 1e-3 * ref.losses[0], "training must move the loss"
