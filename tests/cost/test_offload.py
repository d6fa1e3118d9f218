"""Activation offloading: memory moves to the host, the copies cost what the host link cannot hide."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.cost import Estimator
from autopar.cost.memory import activation_elems_per_token, inflight_layer_microbatches, linear_input_scale
from autopar.errors import AutoparInputError
from autopar.specs import Layout, TrainingSpec
from autopar.specs.loaders import load_hardware, load_model

TR = TrainingSpec(seq_len=8192, global_batch=256)


def _est(hw="h100_sxm"):
    return Estimator(load_model("llama3_70b"), load_hardware(hw), TR, 64)


@settings(max_examples=20, deadline=None)
@given(f=st.sampled_from([0.25, 0.5, 1.0]), pp=st.sampled_from([1, 4]), mbs=st.sampled_from([1, 2]))
def test_offloading_moves_activations_to_the_host_and_never_speeds_up(f, pp, mbs):
    est = _est()
    base = est.estimate(Layout(tp=4, pp=pp, micro_batch=mbs))
    off = est.estimate(Layout(tp=4, pp=pp, micro_batch=mbs, offload_activations=f))
    assert off.memory_gib.activations < base.memory_gib.activations
    assert off.host_offload_gib > 0 and base.host_offload_gib == 0
    assert base.time_s.offload == 0 and off.time_s.offload >= 0
    assert off.step_time_s >= base.step_time_s - 1e-12


def test_offloaded_bytes_follow_the_formula():
    """Host bytes = f · b·s · e · kept · (in-flight − two resident layers), on the fullest stage."""
    est = _est()
    L = est.resolve(Layout(tp=4, pp=4, offload_activations=0.5))
    st = est.stages(L.stage_layers)[0]
    kept, _ = activation_elems_per_token(est.profile, st, L, linear_input_scale(TR))
    expect = 0.5 * TR.seq_len * TR.activation_bytes * kept * (inflight_layer_microbatches(st, L) - 2 / st.n_layers)
    assert est.estimate(L).host_offload_gib == pytest.approx(expect / 2 ** 30)


def test_a_slow_host_link_exposes_more_copy_time():
    fast, slow = load_hardware("gb200_nvl72"), load_hardware("h100_sxm")
    L = Layout(tp=4, pp=4, offload_activations=1.0)
    t_fast = Estimator(load_model("llama3_70b"), fast, TR, 64).estimate(L).time_s.offload
    t_slow = Estimator(load_model("llama3_70b"), slow, TR, 64).estimate(L).time_s.offload
    assert t_slow > t_fast


def test_offloading_needs_a_host_link_in_the_hardware_file():
    hw = load_hardware("h100_sxm").model_copy(update={"host_link_gbps": None})
    with pytest.raises(AutoparInputError, match="host_link_gbps"):
        Estimator(load_model("llama3_70b"), hw, TR, 64).estimate(Layout(tp=4, pp=4, offload_activations=1.0))
