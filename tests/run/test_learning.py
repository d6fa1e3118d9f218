"""The loss learns: 20 steps of the synthetic task (model.synthetic_batch) with the LR warm-up, for a dense and
an MoE model, in one process and under a TP+PP / EP+PP layout, and once with the GPU's memory scheme (bf16
weights, fp32 main weights; ``dtype="bf16"``) on the CPU.

Criterion: the mean loss of the last 4 steps is at least 0.5 nats below that of the first 4. The vocabulary
(512) is larger than the task's alphabet (256), so a model that learns which tokens occur already gains
ln 2 = 0.69 nats; observed drops are about 1.1 nats (6.2 -> 5.0).
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from autopar.run.launch import run_layout  # noqa: E402
from autopar.specs import Layout, ModelSpec, TrainingSpec  # noqa: E402

pytestmark = pytest.mark.slow

STEPS, LR, DROP = 20, 3e-3, 0.5
TRAINING = TrainingSpec(seq_len=32, global_batch=8)
DENSE = ModelSpec(name="tiny", num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                  num_kv_heads=2, vocab_size=512)
MOE = ModelSpec.model_validate(dict(DENSE.model_dump(), name="tiny_moe", moe=dict(
    num_experts=4, top_k=2, expert_ffn_hidden_size=64, first_dense_layers=0)))

CASES = [  # (model, world, layout, weights dtype)
    ("dense", 1, {}, "auto"),
    ("moe", 1, {}, "auto"),
    ("dense", 4, dict(tp=2, pp=2), "auto"),
    ("moe", 4, dict(ep=2, pp=2), "auto"),
    ("moe", 2, dict(ep=2, zero_stage=1), "bf16"),      # bf16 experts + fp32 FSDP2 shards gathered in bf16
]


@pytest.mark.parametrize("model, world, layout, dtype", CASES,
                         ids=[f"{m}-w{w}-" + "-".join(f"{k}{v}" for k, v in lay.items()) + f"-{d}"
                              for m, w, lay, d in CASES])
def test_the_loss_falls(model, world, layout, dtype):
    spec = {"dense": DENSE, "moe": MOE}[model]
    res = run_layout(spec, Layout(**layout), TRAINING, world=world, steps=STEPS, lr=LR, dtype=dtype, timeout_s=240)
    assert res.ok, (res.failure, res.log_path)
    losses = res.losses
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)
    assert losses[0] == pytest.approx(math.log(spec.vocab_size), abs=0.2)     # starts near uniform
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < first - DROP, f"loss did not fall: {losses}"
    assert res.applied["dtype"] == ("fp32" if dtype == "auto" else dtype)
    assert "warm-up" in res.applied["lr"] and res.applied["memory_scheme"]
    terms = res.memory_terms_gib[0]
    assert terms["weights"] > 0 and terms["grads"] > 0 and terms["optimizer"] > 0 and terms["fwd_bwd_peak"] is None
