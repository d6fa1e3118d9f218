"""Single-process checks of the runner's pieces: scaling, deterministic init across pipeline splits, stage
plans, the zig-zag split, the ring-attention block math, MoE dispatch, synthetic data, and that planning
imports stay torch-free."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from autopar.errors import AutoparInputError  # noqa: E402
from autopar.run import context_parallel as cpm  # noqa: E402
from autopar.run.model import (MoE, Transformer, init_weights, local_dispatch, scale_model,  # noqa: E402
                                   synthetic_batch)
from autopar.run.pipeline import stage_plans  # noqa: E402
from autopar.specs import Layout, ModelSpec  # noqa: E402
from autopar.specs.loaders import load_model  # noqa: E402

TINY = ModelSpec(name="tiny", num_layers=8, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                 num_kv_heads=2, vocab_size=128)
TINY_MOE = ModelSpec.model_validate(dict(TINY.model_dump(), name="tiny_moe", moe=dict(
    num_experts=4, top_k=2, expert_ffn_hidden_size=64, num_shared_experts=1, first_dense_layers=1)))


def test_planning_imports_stay_torch_free():
    code = ("import sys, autopar.run, autopar.run.launch, autopar.cli.profile, autopar.cli.main as m; "
            "m.build_parser(); autopar.run.scale_model; assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_scale_model_keeps_the_architecture():
    big = load_model("llama3_70b")
    small = scale_model(big, layers=4, hidden=64, heads=4, ffn=128, vocab=128)
    assert (small.num_layers, small.hidden_size, small.num_attention_heads, small.vocab_size) == (4, 64, 4, 128)
    assert small.gated_mlp == big.gated_mlp and small.norm == big.norm and small.head_dim is None
    assert small.kv_heads == 1          # llama3 70B's a/g = 8 kept as far as 4 heads allow
    with pytest.raises(AutoparInputError, match="not divisible by num_attention_heads"):
        scale_model(big, hidden=65)


def test_scale_model_moe_and_mla():
    ds = load_model("deepseek_v3")
    s = scale_model(ds, layers=4, hidden=64, heads=4, ffn=32, experts=8, vocab=128)
    assert s.moe.num_experts == 8 and s.moe.top_k == min(ds.moe.top_k, 8) and s.moe.expert_ffn_hidden_size == 32
    assert s.mla is not None and s.mtp_layers == 0 and s.num_moe_layers >= 1


@pytest.mark.parametrize("layout", [Layout(pp=2), Layout(pp=2, vpp=2), Layout(pp=2, stage_layers=(2, 6)),
                                    Layout(pp=4, vpp=2)])
def test_stages_cover_every_layer_once_and_start_from_the_full_models_weights(layout):
    full = Transformer(TINY, 16)
    init_weights(full, seed=3)
    ref = dict(full.named_parameters())
    seen = []
    for rank in range(layout.pp):
        for plan in stage_plans(layout, TINY.num_layers, rank):
            stage = Transformer(TINY, 16, plan.layer_ids, plan.first, plan.last)
            init_weights(stage, seed=3)
            for name, p in stage.named_parameters():
                assert torch.equal(p, ref[name]), name
            seen += plan.layer_ids
    assert sorted(seen) == list(range(TINY.num_layers))


def test_interleaved_stage_order():
    plans = stage_plans(Layout(pp=2, vpp=2), 8, 0)
    assert [(p.index, p.layer_ids, p.first, p.last) for p in plans] == [(0, [0, 1], True, False),
                                                                        (2, [4, 5], False, False)]
    plans = stage_plans(Layout(pp=2, vpp=2), 8, 1)
    assert [(p.index, p.layer_ids, p.last) for p in plans] == [(1, [2, 3], False), (3, [6, 7], True)]


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_zigzag_split_is_a_balanced_partition(cp):
    s = 32
    parts = [cpm.zigzag_indices(s, cp, r) for r in range(cp)]
    assert sorted(torch.cat(parts).tolist()) == list(range(s))
    # causal work (keys visible to each query) is equal on every rank
    work = [int((idx + 1).sum()) for idx in parts]
    assert len(set(work)) == 1


def test_ring_attention_block_math_matches_sdpa():
    """One block with the causal mask is plain attention: forward and the hand-written backward agree with
    torch's SDPA autograd (GQA: 4 query heads, 2 KV heads), taken in float64 as the exact reference. The block
    math runs in float32, as the runner does; every input comes from the seeded generator (the output gradient
    once came from the global one, so its draw depended on which tests ran before, and one near-zero element of a
    float32 SDPA reference differed by 1.01e-6, past a 1e-6 tolerance)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 8, 16, generator=g) for h in (4, 2, 2))
    dout = torch.randn(2, 4, 8, 16, generator=g)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=True, enable_gqa=True)
    ref.backward(dout.double())
    out, lse = cpm._block_forward(q, k, v, 16 ** -0.5, True)
    torch.testing.assert_close(out, ref.detach().float(), rtol=1e-5, atol=1e-5)
    delta = (dout * out).sum(-1)
    dq, dk, dv = cpm._block_backward(q, k, v, dout, lse, delta, 16 ** -0.5, True)
    for mine, theirs in ((dq, q64.grad), (dk, k64.grad), (dv, v64.grad)):
        torch.testing.assert_close(mine, theirs.float(), rtol=1e-5, atol=1e-5)


def test_ring_blocks_reassemble_causal_attention():
    """Merging the blocks each (query rank, K/V rank) pair computes, in ring order, with the online softmax,
    gives every rank's rows of full causal attention (no communication: all ranks simulated here)."""
    cp, s = 4, 32
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, s, 8, generator=g) for _ in range(3))
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    idx = [cpm.zigzag_indices(s, cp, r) for r in range(cp)]
    for r in range(cp):
        out = lse = None
        for step in range(cp):
            j = (r - step) % cp
            qs, ks, causal = cpm._blocks(r, j, len(idx[r]) // 2)
            o, l = cpm._block_forward(q[:, :, idx[r]][:, :, qs], k[:, :, idx[j]][:, :, ks],
                                      v[:, :, idx[j]][:, :, ks], 8 ** -0.5, causal)
            if out is None:
                out, lse = o, l
            else:
                new = torch.logaddexp(lse[:, :, qs], l)
                out[:, :, qs] = out[:, :, qs] * torch.exp(lse[:, :, qs] - new)[..., None] \
                    + o * torch.exp(l - new)[..., None]
                lse[:, :, qs] = new
        torch.testing.assert_close(out, full[:, :, idx[r]], rtol=1e-5, atol=1e-6)


def test_moe_dispatch_equals_per_token_experts():
    moe = MoE(TINY_MOE)
    g = torch.Generator().manual_seed(0)   # seeded: the draw must not depend on which tests ran before
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.1, generator=g)
    x = torch.randn(10, 64, generator=g)
    experts = torch.tensor([[i % 4, (i + 1) % 4] for i in range(10)])
    weights = torch.rand(10, 2, generator=g)
    out = local_dispatch(moe, x, experts, weights)
    ex = moe.experts
    ref = torch.stack([sum(w * (torch.nn.functional.silu(t @ ex.w1[e]) * (t @ ex.w3[e])) @ ex.w2[e]
                           for e, w in zip(experts[i].tolist(), weights[i])) for i, t in enumerate(x)])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_synthetic_data_is_seeded_and_in_range():
    a, b = synthetic_batch(2, 8, 32, 128, seed=0), synthetic_batch(2, 8, 32, 128, seed=0)
    assert torch.equal(a, b) and a.shape == (8, 33) and int(a.min()) >= 0 and int(a.max()) < 128
    assert not torch.equal(a, synthetic_batch(3, 8, 32, 128, seed=0))


def _experts_with_bias() -> "torch.nn.Module":
    from autopar.run.model import GroupedExperts
    spec = ModelSpec.model_validate(dict(TINY_MOE.model_dump(), linear_bias=True))
    ex = GroupedExperts(spec)
    for p in ex.parameters():
        torch.nn.init.normal_(p, std=0.1, generator=torch.Generator().manual_seed(1))
    return ex


def _graph_nodes(t: "torch.Tensor") -> set[str]:
    seen, todo = set(), [t.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        todo.extend(f for f, _ in fn.next_functions)
    return {type(fn).__name__ for fn in seen}


def test_expert_loop_takes_each_experts_gradient_from_an_unbound_view():
    """The CPU path: one UnbindBackward per weight (its gradient stacked once), no SelectBackward (w[e] would
    write a full [E, ...] gradient per expert)."""
    ex = _experts_with_bias()
    x, counts = torch.randn(12, 64), torch.tensor([3, 0, 5, 4])
    assert not ex.use_grouped_mm(x)
    nodes = _graph_nodes(ex(x, counts))
    assert "UnbindBackward0" in nodes and "SelectBackward0" not in nodes and "IndexBackward0" not in nodes


def test_grouped_gemm_equals_the_expert_loop_in_outputs_and_gradients():
    """The CUDA path's arithmetic (F.grouped_mm with device offsets, biases gathered per row) checked against
    the loop on the CPU, where grouped_mm runs in bf16; an empty expert included. Tolerance: bf16 rounding."""
    if not hasattr(torch.nn.functional, "grouped_mm"):
        pytest.skip("this torch has no grouped_mm")
    ex = _experts_with_bias().to(torch.bfloat16)
    x = torch.randn(20, 64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(2)).requires_grad_()
    counts = torch.tensor([5, 0, 9, 6])
    results = []
    for run in (ex.forward_grouped, ex.forward_loop):
        ex.zero_grad()
        x.grad = None
        y = run(x, counts)
        y.float().square().sum().backward()
        results.append((y.detach(), x.grad.clone(), {n: p.grad.clone() for n, p in ex.named_parameters()}))
    (y1, gx1, g1), (y2, gx2, g2) = results
    torch.testing.assert_close(y1, y2, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(gx1, gx2, rtol=2e-2, atol=2e-2)
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], rtol=2e-2, atol=1e-1, msg=name)
