"""The linear mixers' scan part (autopar/cost/compute.py layer_parts, autopar/blocks/_recurrent.py): BF16 under every
FP8 recipe, a roofline of its FLOPs and its kernels' HBM bytes, re-run by full recompute only, one pre-norm and one
residual for parallel mixers."""

from __future__ import annotations

import pytest

from autopar.cost import Estimator
from autopar.cost import compute as C
from autopar.cost.shapes import layer_kind
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_model
from autopar.specs.training import TrainingSpec

NANO = load_model("nemotron3_nano_30b_a3b")
MAMBA_LAYER = 0          # layer_pattern[0] = mamba, mlp_pattern[0] = none


def _scan(hw: str, precision: str, tp: int = 1, recompute: str = "none"):
    tr = TrainingSpec(seq_len=8192, global_batch=64, precision=precision)
    est = Estimator(NANO, load_hardware(hw), tr, 8)
    L = est.resolve(Layout(tp=tp, ep=8 // tp, recompute=recompute))
    j = est.profile.kind_of[MAMBA_LAYER]
    return est, L, tr, j, C.layer_parts(est.kernels, est.profile.kinds[j], L, tr, C.gpu_tokens(L, tr), 1.0)


def test_the_scan_is_priced_in_bf16_under_fp8_recipes():
    """Only the projections are Transformer Engine GEMMs; the Triton scan costs the same whatever the recipe."""
    *_, bf16 = _scan("gb300_nvl72", "bf16")
    *_, mx = _scan("gb300_nvl72", "mxfp8")
    assert mx["ssm_scan"] == pytest.approx(bf16["ssm_scan"])
    assert mx["attn"][0] < bf16["attn"][0]                     # the in/out projections do get faster


def test_nano_scan_is_memory_bound_at_its_kernels_bytes():
    """At Nano's shapes the scan's part is its bytes over the sustained HBM rate, split by TP with the heads."""
    for tp in (1, 2):
        est, L, tr, j, parts = _scan("h100_sxm", "fp8", tp=tp)
        block = NANO.mixer_blocks(MAMBA_LAYER)[0]
        fwd_b, bwd_b = block.scan_bytes()
        bw = est.kernels.hbm_bytes_per_s
        tokens = C.gpu_tokens(L, tr)
        scale = tr.activation_bytes * tokens / tp / bw
        assert parts["ssm_scan"] == pytest.approx((fwd_b * scale, bwd_b * scale))


def test_only_full_recompute_reruns_the_scan_and_selective_keeps_its_activations():
    """Megatron-Core's MambaLayer checkpoints no sub-module: selective core_attn neither re-runs the scan nor drops
    what it stores; full recompute does both."""
    est, L, tr, j, parts = _scan("h100_sxm", "fp8")
    sel = L.model_copy(update={"recompute": "selective", "recompute_modules": ("core_attn",)})
    assert "ssm_scan" not in C.recompute_shares(sel, tr, parts)
    full = L.model_copy(update={"recompute": "full"})
    assert C.recompute_shares(full, tr, parts)["ssm_scan"] == 1.0
    block = NANO.mixer_blocks(MAMBA_LAYER)[0]
    assert set(block.stored()) == {"qkv"} and block.stored()["qkv"] == sum(block.stored_io())


def test_parallel_mixers_share_one_pre_norm_and_residual():
    """Falcon-H1 runs attention and Mamba-2 side by side on one normed input: one norm, one residual add for both."""
    m = load_model("falcon_h1_7b")
    att, mamba = m.mixer_blocks(0)
    kind = layer_kind(m, 0, 4096)
    mlp = m.channel_block(0).membound()
    assert kind.membound["norm"][0] == max(att.membound()["norm"][0], mamba.membound()["norm"][0]) + mlp["norm"][0]
    assert kind.membound["ssm_scan"] == mamba.scan_bytes()


def test_batch_major_copies_only_with_several_sequences_per_micro_batch():
    tr = TrainingSpec(seq_len=8192, global_batch=64)
    est = Estimator(NANO, load_hardware("h100_sxm"), tr, 8)
    j = est.profile.kind_of[MAMBA_LAYER]
    block = NANO.mixer_blocks(MAMBA_LAYER)[0]
    one = C.layer_parts(est.kernels, est.profile.kinds[j], est.resolve(Layout(ep=8, micro_batch=1)), tr, 8192.0, 1.0)
    assert "batch_major" not in one
    L4 = est.resolve(Layout(ep=8, micro_batch=4))
    four = C.layer_parts(est.kernels, est.profile.kinds[j], L4, tr, C.gpu_tokens(L4, tr), 1.0)
    copy = 2.0 * (block.in_width() + block.d_inner) * tr.activation_bytes * 4 * 8192 / est.kernels.hbm_bytes_per_s
    assert four["batch_major"] == pytest.approx((copy, copy))
