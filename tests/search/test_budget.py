"""Time and cost to train, GPU-count ranges, and the global-batch check (autopar/search/budget.py)."""

from __future__ import annotations

import pytest

from autopar.cost import Estimator
from autopar.errors import AutoparInputError
from autopar.search.budget import batch_advice, gpu_counts, parse_gpu_range, parse_tokens, training_budget
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_model
from autopar.specs.training import TrainingSpec

LLAMA70 = load_model("llama3_70b")
H100 = load_hardware("h100_sxm")


@pytest.mark.parametrize("text, tokens", [("15T", 15e12), ("300B", 3e11), ("2.5e12", 2.5e12), ("1.5t", 1.5e12),
                                          ("40M", 4e7)])
def test_parse_tokens(text, tokens):
    assert parse_tokens(text) == pytest.approx(tokens)


@pytest.mark.parametrize("text", ["", "15X", "-3T", "0", "T"])
def test_parse_tokens_rejects(text):
    with pytest.raises(AutoparInputError, match="--tokens"):
        parse_tokens(text)


def test_gpu_ranges():
    assert parse_gpu_range("256") == (256, 256) and parse_gpu_range("256-2048") == (256, 2048)
    assert gpu_counts(256, 2048) == [256, 512, 1024, 2048]
    assert gpu_counts(256, 1000) == [256, 512, 1000]
    for bad in ("2048-256", "0-8", "a-b", "8-"):
        with pytest.raises(AutoparInputError, match="--gpus"):
            parse_gpu_range(bad)


def test_budget_arithmetic():
    e = Estimator(LLAMA70, H100, TrainingSpec(seq_len=4096, global_batch=1024), 64).estimate(Layout(tp=8, pp=4))
    b = training_budget(e, 15e12, gpu_hour_price=2.0)
    # seconds = tokens / (tokens/s/GPU · GPUs); GPU-hours = GPUs · seconds / 3600
    assert b.seconds == pytest.approx(15e12 / (e.tokens_per_s_per_gpu * 64))
    assert b.days == pytest.approx(b.seconds / 86400)
    assert b.gpu_hours == pytest.approx(64 * b.seconds / 3600) and b.cost == pytest.approx(2 * b.gpu_hours)
    assert training_budget(e, 15e12).cost is None


def test_batch_too_small_for_the_gpu_count_is_flagged_with_a_fix():
    tr = TrainingSpec(seq_len=4096, global_batch=32)
    e = Estimator(LLAMA70, H100, tr, 1024).estimate(Layout(tp=8, pp=4))           # GA 1, 128 tokens per GPU
    a = batch_advice(LLAMA70, H100, tr, 1024, e)
    assert a is not None and a.tokens_per_gpu == 128 and a.compute_share < 0.5
    assert a.suggested_batch > 32 and a.suggested_mfu > 2 * a.mfu and a.suggested_compute_share >= 0.5
    assert f"--global-batch {a.suggested_batch}" in a.message(4096, 1024)


def test_suitable_batch_is_not_flagged():
    tr = TrainingSpec(seq_len=4096, global_batch=1024)
    e = Estimator(LLAMA70, H100, tr, 64).estimate(Layout(tp=8, pp=4, vpp=2))
    assert batch_advice(LLAMA70, H100, tr, 64, e) is None
