"""A recipe's kernel switches (TrainingSpec.bias_activation_fusion, bias_dropout_add_fusion, hidden_dropout) priced
as the bytes of the kernels that then run (autopar/blocks/mlp.py ACT_UNFUSED_EXTRA, autopar/cost/compute.py
bda_bytes), at the chip's streaming rate."""

from __future__ import annotations

import pytest

from autopar.cost import compute as C
from autopar.cost.kernels import Kernels
from autopar.cost.shapes import layer_kind
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_model
from autopar.specs.training import TrainingSpec

H100 = load_hardware("h100_sxm")
NEM8B = load_model("nemotron_8b")          # squared ReLU, no biases (NeMo NemotronConfig)
GPT5B = load_model("gpt3_5b")              # GELU with biases
T = 2 * 4096                               # tokens per GPU of the micro-batch
LAY = Layout(tp=2, sequence_parallel=True)


def parts(model, **switches):
    tr = TrainingSpec(seq_len=4096, global_batch=256, precision="fp8", **switches)
    kern = Kernels(H100, tr)
    return kern, C.layer_parts(kern, layer_kind(model, 0, 4096), LAY, tr, T, 1.0)


def test_fused_switches_add_nothing():
    _, p = parts(NEM8B)
    assert not {"mlp_act_unfused", "bda", "bda_bias"} & set(p)


def test_unfused_squared_relu_streams_its_relu_and_pow_passes():
    kern, p = parts(NEM8B, bias_activation_fusion=False)
    f, e = NEM8B.ffn_hidden_size, 2
    # relu then pow: 2 more elements forward, pow_backward's three kernels and threshold_backward 7 more backward,
    # per unit of the TP-split FFN width
    assert p["mlp_act_unfused"] == pytest.approx((kern.stream(2 * f * e * T / 2), kern.stream(7 * f * e * T / 2)))


def test_an_unfused_bias_dropout_add_without_bias_or_dropout_is_the_plain_residual_add():
    # Nemotron 8B's recipe: bias false, hidden_dropout 0.0, bias_dropout_add_fusion false: torch's dropout at p = 0
    # returns its input, so only the residual add runs, as fused
    _, fused = parts(NEM8B)
    _, unfused = parts(NEM8B, bias_dropout_add_fusion=False)
    assert unfused == fused


def test_dropout_writes_and_reads_its_mask():
    kern, p = parts(GPT5B, hidden_dropout=0.1)
    h, e = GPT5B.hidden_size, 2
    n_tok = 2 * h * T / 2                                    # two sub-blocks, sequence-parallel tokens
    assert p["bda"] == pytest.approx((kern.stream(1.0 * n_tok), kern.stream((2 * e + 1) * n_tok)))
    assert "bda_bias" not in p                               # the bias is read inside the fused kernel
    kern, q = parts(GPT5B, hidden_dropout=0.1, bias_dropout_add_fusion=False)
    assert q["bda"] == pytest.approx((kern.stream((2 * e + 1) * n_tok), kern.stream((2 * e + 1) * n_tok)))
    assert q["bda_bias"] == pytest.approx((kern.stream(2 * e * n_tok), 0.0))


def test_gelu_unfused_costs_what_fused_does_without_a_bias():
    # F.gelu and gelu_backward are one kernel each: only GPT-3's separate bias add is added (read, write f)
    kern, p = parts(GPT5B, bias_activation_fusion=False)
    f, e = GPT5B.ffn_hidden_size, 2
    assert p["mlp_act_unfused"] == pytest.approx((kern.stream(2 * f * e * T / 2), 0.0))


def test_a_compiled_stack_fuses_the_chain_and_an_eager_one_runs_it():
    _, compiled = parts(NEM8B, bias_activation_fusion=False, elementwise="compiled")
    _, eager = parts(NEM8B, elementwise="eager")
    assert "mlp_act_unfused" not in compiled and "mlp_act_unfused" in eager
