"""Estimator.stage_times: a named record whose micro-batch sum is the step time's t_mb."""

from __future__ import annotations

from autopar.cost import Estimator
from autopar.cost.estimator import StageTimes, microbatch_seconds
from autopar.specs import TrainingSpec
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_model


def test_stage_times_is_named_and_sums_to_the_microbatch_time():
    model, hw, tr = load_model("mixtral_8x7b"), load_hardware("h100_sxm"), TrainingSpec(seq_len=4096, global_batch=64)
    est = Estimator(model, hw, tr, 16)
    L = est.resolve(Layout(tp=2, pp=2, ep=4, offload_activations=0.5))
    for st in est.stages(L.stage_layers):
        t = est.stage_times(L, st)
        assert isinstance(t, StageTimes) and t._fields == ("compute", "tp", "cp", "ep", "forward", "offload")
        assert microbatch_seconds(t) == t.compute + t.tp + t.cp + t.ep + t.offload
        assert 0 < t.forward < t.compute and t.tp > 0 and t.ep > 0
        assert est.stage_overhead_s(st) >= 0
    e = est.estimate(L, resolved=True)
    slowest = max((est.stage_times(L, st) for st in est.stages(L.stage_layers)), key=microbatch_seconds)
    assert e.time_s.compute == L.grad_accum * slowest.compute and e.time_s.offload == L.grad_accum * slowest.offload


def test_interleaved_pair_is_stage_times_of_each_layout():
    """The search prices a MoE mesh with and without virtual stages at once (``stage_times_interleaved``): each of
    the pair is exactly ``stage_times`` of its own layout, and with EP overlap on they differ only in the EP term
    (the overlap needs vpp when pp > 1: autopar.cost.ep)."""
    model, hw = load_model("mixtral_8x7b"), load_hardware("h100_sxm")
    tr = TrainingSpec(seq_len=4096, global_batch=64, ep_comm_overlap=True)
    est = Estimator(model, hw, tr, 16)
    L = est.resolve(Layout(tp=2, pp=2, ep=4))
    L_v = est.resolve(Layout(tp=2, pp=2, vpp=2, ep=4))
    for st in est.stages(L.stage_layers):
        one, inter = est.stage_times_interleaved(L, L_v, st)
        assert one == est.stage_times(L, st) and inter == est.stage_times(L_v, st)
        assert inter._replace(ep=one.ep) == one and inter.ep < one.ep
