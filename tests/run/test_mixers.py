"""The runner's linear-attention / SSM mixers (autopar/run/mixers.py): chunked == recurrent on CPU (values and
gradients), a hybrid model builds and splits over pipeline stages with the full model's weights, and (slow) its
loss under TP and PP equals the single-process loss."""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")

from autopar.run.mixers import (LinearMixer, Mamba1Mixer, approximations, chunk_decay_attention,  # noqa: E402
                                chunk_gated_delta_rule, chunk_selective_scan, recurrent_decay_attention,
                                recurrent_gated_delta_rule, recurrent_selective_scan)
from autopar.run.model import Transformer, init_weights  # noqa: E402
from autopar.run.pipeline import stage_plans  # noqa: E402
from autopar.specs import Layout, ModelSpec, TrainingSpec  # noqa: E402
from autopar.specs.mixers import MixerSpec  # noqa: E402
from _equivalence import assert_losses_match  # noqa: E402  (tests/run/_equivalence.py)

def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("scalar", [False, True])
@pytest.mark.parametrize("s, chunk", [(16, 4), (19, 8), (8, 16)])
def test_decay_attention_chunked_equals_recurrent(scalar, s, chunk):
    b, H, dk, dv = 2, 3, 5, 4
    q, k, v = _rand(b, H, s, dk, seed=1), _rand(b, H, s, dk, seed=2), _rand(b, H, s, dv, seed=3)
    logit = _rand(b, H, s, *(() if scalar else (dk,)), seed=4)
    for t in (q, k, v, logit):
        t.requires_grad_(True)
    def decay():
        return torch.nn.functional.logsigmoid(logit)
    ref = recurrent_decay_attention(q, k, v, decay())
    out = chunk_decay_attention(q, k, v, decay(), chunk)
    assert torch.allclose(out, ref, rtol=1e-9, atol=1e-10)
    g_ref = torch.autograd.grad(ref.square().sum(), (q, k, v, logit))
    g_out = torch.autograd.grad(out.square().sum(), (q, k, v, logit))
    for a, b_ in zip(g_out, g_ref):
        assert torch.allclose(a, b_, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("s, chunk", [(16, 4), (21, 8), (8, 16)])
def test_gated_delta_rule_chunked_equals_recurrent(s, chunk):
    b, H, dk, dv = 2, 2, 6, 5
    q = _rand(b, H, s, dk, seed=5)
    k = torch.nn.functional.normalize(_rand(b, H, s, dk, seed=6), dim=-1)
    v = _rand(b, H, s, dv, seed=7)
    beta_logit, a_logit = _rand(b, H, s, seed=8), _rand(b, H, s, seed=9)
    for t in (q, v, beta_logit, a_logit):
        t.requires_grad_(True)
    def args():
        return q, k, v, beta_logit.sigmoid(), torch.nn.functional.logsigmoid(a_logit)
    ref = recurrent_gated_delta_rule(*args())
    out = chunk_gated_delta_rule(*args(), chunk=chunk)
    assert torch.allclose(out, ref, rtol=1e-9, atol=1e-10)
    g_ref = torch.autograd.grad(ref.square().sum(), (q, v, beta_logit, a_logit))
    g_out = torch.autograd.grad(out.square().sum(), (q, v, beta_logit, a_logit))
    for a, b_ in zip(g_out, g_ref):
        assert torch.allclose(a, b_, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("s, chunk", [(16, 4), (19, 8), (8, 16), (37, 64)])
def test_selective_scan_chunked_equals_recurrent(s, chunk):
    """Mamba-1: the chunked prefix scan equals the token-by-token recurrence (values and gradients), also with
    fast decays (Δ·A down to about -40 per token) that would overflow an exp(-cumsum) factorisation."""
    b, d, N = 2, 3, 4
    x, dt_logit = _rand(b, d, s, seed=10), _rand(b, d, s, seed=11) * 2
    A_log, B, C, D = _rand(d, N, seed=12), _rand(b, s, N, seed=13), _rand(b, s, N, seed=14), _rand(d, seed=15)
    for t in (x, dt_logit, A_log, B, C, D):
        t.requires_grad_(True)
    def args():
        return x, torch.nn.functional.softplus(dt_logit), -A_log.exp(), B, C, D
    ref = recurrent_selective_scan(*args())
    out = chunk_selective_scan(*args(), chunk=chunk)
    assert torch.allclose(out, ref, rtol=1e-9, atol=1e-10)
    g_ref = torch.autograd.grad(ref.square().sum(), (x, dt_logit, A_log, B, C, D))
    g_out = torch.autograd.grad(out.square().sum(), (x, dt_logit, A_log, B, C, D))
    for a, b_ in zip(g_out, g_ref):
        assert torch.allclose(a, b_, rtol=1e-8, atol=1e-9)


MIXERS = {
    "gla": dict(kind="gla", num_heads=4, head_dim=16, gate_low_rank=8, output_gate=True, chunk_size=8),
    "gdn": dict(kind="gated_deltanet", num_heads=2, num_value_heads=4, head_dim=16, output_gate=True, chunk_size=8),
    "lit": dict(kind="lightning", num_heads=4, head_dim=16, output_gate=True, chunk_size=8),
    "kda": dict(kind="kda", num_heads=4, head_dim=16, chunk_size=8),
    "mam": dict(kind="mamba2", num_heads=4, head_dim=16, state_size=8, n_groups=2, chunk_size=8),
    "m1": dict(kind="mamba1", inner_size=128, state_size=8, dt_rank=8, conv_kernel=4, bc_norms=True, chunk_size=8),
}
HYBRID = ModelSpec(name="tiny_hybrid", num_layers=4, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                   num_kv_heads=2, vocab_size=128, mixers={"gla": MIXERS["gla"], "gdn": MIXERS["gdn"],
                                                           "mam": MIXERS["mam"]},
                   layer_pattern=["gla", "gdn", "attention", "mam"])


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_each_mixer_runs_forward_and_backward(name):
    spec = ModelSpec(name="t", num_layers=1, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                     vocab_size=128, mixers={"m": MIXERS[name]}, layer_pattern=["m"])
    mx = MixerSpec(**MIXERS[name])
    mod = Mamba1Mixer(spec, mx) if mx.kind == "mamba1" else LinearMixer(spec, mx)
    x = torch.randn(2, 19, 64, requires_grad=True)
    y = mod(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    y.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in mod.parameters())


def test_hybrid_model_splits_over_pipeline_stages_with_the_full_weights():
    full = Transformer(HYBRID, 16)
    init_weights(full, seed=3)
    ref = dict(full.named_parameters())
    assert isinstance(full.layers["0"].attention, LinearMixer) and not isinstance(full.layers["2"].attention,
                                                                                 LinearMixer)
    layout = Layout(pp=2, stage_layers=(1, 3))
    for rank in range(2):
        for plan in stage_plans(layout, HYBRID.num_layers, rank):
            stage = Transformer(HYBRID, 16, plan.layer_ids, plan.first, plan.last)
            init_weights(stage, seed=3)
            for n, p in stage.named_parameters():
                assert torch.equal(p, ref[n]), n
    logits = full(torch.randint(0, 128, (2, 16)))
    assert logits.shape == (2, 16, 128) and torch.isfinite(logits).all()


# Jamba-like (Mamba-1, attention, MoE every other layer) and Falcon-H1-like (attention + Mamba-2 in every layer).
JAMBA_LIKE = ModelSpec(name="tiny_jamba", num_layers=4, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                       num_kv_heads=2, vocab_size=128, position_embedding="none", mixers={"m1": MIXERS["m1"]},
                       layer_pattern=["m1", "m1", "attention", "m1"],
                       moe=dict(num_experts=4, top_k=2, expert_ffn_hidden_size=64, moe_layer_interval=2))
FALCON_LIKE = ModelSpec(name="tiny_falcon_h1", num_layers=4, hidden_size=64, ffn_hidden_size=128,
                        num_attention_heads=4, num_kv_heads=2, head_dim=32, vocab_size=128,
                        mixers={"mam": MIXERS["mam"]}, layer_pattern=["attention+mam"])


def test_falcon_like_block_sums_attention_and_mamba_on_the_same_input():
    model = Transformer(FALCON_LIKE, 16)
    init_weights(model, seed=1)
    block = model.layers["0"]
    assert not isinstance(block.attention, LinearMixer) and isinstance(block.parallel[0], LinearMixer)
    x = torch.randn(2, 16, 64)
    cos, sin = __import__("autopar.run.model", fromlist=["rotary"]).rotary(torch.arange(16), 32)
    n = block.attention_norm(x)
    mixed = block.attention(n, cos, sin) + block.parallel[0](n, cos, sin)
    ffn = block.feed_forward
    expect = x + mixed
    expect = expect + ffn(block.ffn_norm(expect))
    assert torch.allclose(block(x, cos, sin), expect)
    n_params = sum(p.numel() for p in block.parameters())
    assert n_params > sum(p.numel() for p in block.attention.parameters()) + sum(
        p.numel() for p in block.feed_forward.parameters())
    assert any("parallel mixers" in a for a in approximations(FALCON_LIKE))
    assert any("mamba1" in a for a in approximations(JAMBA_LIKE))


def test_jamba_like_model_runs_and_splits_over_stages():
    full = Transformer(JAMBA_LIKE, 16)
    init_weights(full, seed=2)
    assert isinstance(full.layers["0"].attention, Mamba1Mixer) and hasattr(full.layers["1"], "moe")
    ref = dict(full.named_parameters())
    for rank in range(2):
        for plan in stage_plans(Layout(pp=2), JAMBA_LIKE.num_layers, rank):
            stage = Transformer(JAMBA_LIKE, 16, plan.layer_ids, plan.first, plan.last)
            init_weights(stage, seed=2)
            for n, p in stage.named_parameters():
                assert torch.equal(p, ref[n]), n
    logits = full(torch.randint(0, 128, (2, 16)))
    logits.float().square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in full.parameters())


def test_replacing_a_linear_scan_is_refused_clearly():
    mod = LinearMixer(HYBRID, MixerSpec(**MIXERS["gla"]))
    with pytest.raises(ValueError, match="scan of a gla layer can be wrapped .* not replaced by Identity"):
        mod.core = torch.nn.Identity()
    from autopar.run.recompute import Checkpointed
    mod.core = Checkpointed(mod.core)     # selective recomputation's wrapper is fine


@pytest.mark.slow
@pytest.mark.parametrize("world, layout", [(2, dict(tp=2, sequence_parallel=False)), (2, dict(pp=2)),
                                           (4, dict(tp=2, pp=2))],
                         ids=["tp2", "pp2", "tp2-sp-pp2"])
def test_hybrid_losses_match_the_single_process_run(world, layout):
    assert_losses_match(HYBRID, layout, world, TrainingSpec(seq_len=32, global_batch=8))


@pytest.mark.slow
@pytest.mark.parametrize("spec", [JAMBA_LIKE, FALCON_LIKE], ids=["jamba_like", "falcon_h1_like"])
@pytest.mark.parametrize("world, layout", [(2, dict(tp=2)), (2, dict(pp=2))], ids=["tp2-sp", "pp2"])
def test_new_hybrid_losses_match_the_single_process_run(spec, world, layout):
    """TP splits Mamba-1 by channels (x_proj row-parallel) and runs both parallel mixers split; PP splits layers."""
    assert_losses_match(spec, layout, world, TrainingSpec(seq_len=32, global_batch=8))


@pytest.mark.slow
def test_replicated_kv_heads_sync_only_softmax_attention_grads():
    """kv_heads (1) < tp (2): the K/V copies of softmax attention sum their gradients over the ranks sharing a
    head; the linear mixers' own wk/wv (split by heads, not replicated) and a parallel Mamba's must not."""
    tr = TrainingSpec(seq_len=32, global_batch=8)
    for spec in (HYBRID, FALCON_LIKE):
        one_kv_head = spec.model_copy(update={"num_kv_heads": 1})
        assert_losses_match(one_kv_head, dict(tp=2, sequence_parallel=False), 2, tr)


LIGHTNING_KDA = ModelSpec(name="tiny_lightning_kda", num_layers=4, hidden_size=64, ffn_hidden_size=128,
                          num_attention_heads=4, num_kv_heads=2, vocab_size=128,
                          mixers={"lit": MIXERS["lit"], "kda": MIXERS["kda"]},
                          layer_pattern=["lit", "kda", "attention", "kda"])


@pytest.mark.slow
@pytest.mark.parametrize("world, layout", [(2, dict(tp=2)), (2, dict(pp=2))], ids=["tp2-sp", "pp2"])
def test_lightning_and_kda_losses_match_the_single_process_run(world, layout):
    """The two kinds the other hybrids leave out, split by heads under TP and by layers under PP."""
    assert_losses_match(LIGHTNING_KDA, layout, world, TrainingSpec(seq_len=32, global_batch=8))
