"""FP8 primary weights (TrainingSpec.fp8_param_gather, Megatron --fp8-param-gather): what they physically change
(autopar/cost/memory.py, autopar/cost/dp.py)."""

import pytest

from autopar.cost import Estimator
from autopar.errors import AutoparInputError
from autopar.specs._base import build_spec
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_model
from autopar.specs.training import TrainingSpec


def estimate(fp8_param_gather: bool, layout: Layout, precision: str = "mxfp8", dp_overlap: bool = True):
    tr = TrainingSpec(seq_len=8192, global_batch=64, precision=precision, fp8_param_gather=fp8_param_gather,
                      dp_comm_overlap=dp_overlap)
    return Estimator(load_model("llama3_8b"), load_hardware("b200"), tr, 8).estimate(layout)


def test_memory_falls_by_the_bf16_weight_copy():
    # ZeRO-1, one stage: the weights term is the bf16 copy (2 B per local parameter); with FP8 primary weights the
    # FP8 row-/column-wise pair is the weight, so the separate 2 B/parameter FP8 copy leaves the buffers
    lay = Layout(tp=2, micro_batch=1, zero_stage=1, recompute="selective")
    off, on = estimate(False, lay), estimate(True, lay)
    assert on.memory_gib.weights == off.memory_gib.weights
    assert off.memory_gib.buffers - on.memory_gib.buffers == pytest.approx(off.memory_gib.weights, rel=1e-9)
    assert on.memory_gib.activations == off.memory_gib.activations
    assert on.memory_gib.total < off.memory_gib.total


def test_parameter_all_gather_moves_fp8_bytes():
    # DP overlap off: every byte is exposed. ZeRO-1's updated-weight all-gather goes from 2 B to 1 B per parameter;
    # the bf16 gradient reduce-scatter is unchanged, so the DP time falls, but by less than half
    lay = Layout(tp=1, micro_batch=1, zero_stage=1, recompute="full")
    off = estimate(False, lay, dp_overlap=False).time_s.dp
    on = estimate(True, lay, dp_overlap=False).time_s.dp
    assert 0.5 * off < on < 0.9 * off


def test_only_transformer_engine_fp8_precisions_take_it():
    for precision in ("bf16", "nvfp4"):
        with pytest.raises(AutoparInputError, match="fp8_param_gather"):
            build_spec(TrainingSpec, {"seq_len": 4096, "global_batch": 8, "precision": precision,
                                      "fp8_param_gather": True}, "training")
    with pytest.raises(AutoparInputError, match="fp8_param_gather"):   # torchao Float8 keeps bf16 weights
        build_spec(TrainingSpec, {"seq_len": 4096, "global_batch": 8, "precision": "fp8", "fp8_recipe": "rowwise",
                                  "fp8_param_gather": True}, "training")
