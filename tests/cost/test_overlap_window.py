"""Overlap priced from its window (issue 20): exposed communication is what the compute that can hide it leaves
over, only where the run overlaps at all (TrainingSpec.*_comm_overlap), and never more than all of it."""

from __future__ import annotations

import pytest

from autopar.cost import Estimator
from autopar.cost.compute import hiding_windows
from autopar.cost.cp import cp_ring_seconds
from autopar.cost.dp import dp_time_per_step
from autopar.cost.ep import ep_comm_seconds, ep_overlap_blockers
from autopar.cost.overlap import overlap_cost
from autopar.cost.tp import tp_comm_seconds
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_model
from autopar.specs.training import TrainingSpec

H100 = load_hardware("h100_sxm")
ON = TrainingSpec(seq_len=4096, global_batch=1024)
OFF = ON.model_copy(update={**{f"{k}_comm_overlap": False for k in ("tp", "dp", "ep", "cp")},
                            "tp_dgrad_overlap": False})


def _times(model: str, gpus: int, training: TrainingSpec, **lay):
    est = Estimator(load_model(model), H100, training, gpus)
    L = est.resolve(Layout(**lay))
    st = est.stages(L.stage_layers)[0]
    return est, L, st, est.stage_times(L, st), est.stage_tail(L, st)


@pytest.mark.parametrize("model,gpus,lay", [
    ("llama3_70b", 64, dict(tp=8, pp=2)),
    ("llama3_70b", 256, dict(tp=4, fsdp=True, micro_batch=2)),
    ("llama3_8b", 16, dict(tp=2, cp=2)),
    ("qwen3_30b_a3b", 64, dict(tp=2, ep=8)),
])
def test_overlap_on_exposes_at_most_what_off_exposes(model, gpus, lay):
    *_, t_on, tail_on = _times(model, gpus, ON, **lay)
    *_, t_off, tail_off = _times(model, gpus, OFF, **lay)
    for term in ("tp", "cp", "ep"):
        assert 0.0 <= getattr(t_on, term) <= getattr(t_off, term) + 1e-15, term
    assert 0.0 <= tail_on[0] <= tail_off[0] + 1e-15


def test_tp_overlap_leaves_one_chunk_and_what_the_gemms_cannot_cover():
    est, L, st, t, _ = _times("llama3_70b", 64, ON, tp=8, pp=2)
    comm = tp_comm_seconds(est.profile, st, L, ON, est.net)
    gemm, _ = hiding_windows(est.profile, st, L, ON, est.kernels)
    exposed = comm / 8 + max(0.0, comm * 7 / 8 - gemm)
    hidden = comm - exposed
    # what hides slows the GEMMs it hides under: the all-gathers' half on the copy engines, the reduce-scatters' on SMs
    assert hidden > 0
    assert t.tp == pytest.approx(exposed + overlap_cost(hidden / 2, H100, "copy_engine")
                                 + overlap_cost(hidden / 2, H100, "sm"))
    assert t.tp > exposed
    assert _times("llama3_70b", 64, OFF, tp=8, pp=2)[3].tp == pytest.approx(comm)


def test_tp_overlap_off_still_hides_each_input_gradient_reduce_scatter_behind_its_weight_gradient_gemm():
    # Transformer Engine / Megatron-Core with userbuffers off: one BF16 reduce-scatter per block and backward pass is
    # issued async after the column-parallel dgrad GEMM and waited on after the wgrad GEMM (autopar/cost/tp.py)
    dgrad_only = OFF.model_copy(update={"tp_dgrad_overlap": True})
    est, L, st, t, _ = _times("llama3_70b", 64, dgrad_only, tp=8, pp=2)
    comm = tp_comm_seconds(est.profile, st, L, dgrad_only, est.net)
    gemm, _ = hiding_windows(est.profile, st, L, dgrad_only, est.kernels)
    blocks = st.sum(est.profile, "tp_blocks")
    rs = blocks * est.net.time("reduce_scatter", L.micro_batch * 4096 * 8192 * 2, 8, 1)
    hidden = min(rs, gemm / 6)
    assert 0 < hidden == pytest.approx(rs)           # the wgrad GEMMs are long enough to cover it
    assert t.tp == pytest.approx(comm - hidden + overlap_cost(hidden, H100, "sm"))
    assert t.tp < _times("llama3_70b", 64, OFF, tp=8, pp=2)[3].tp


def test_ep_overlap_only_where_megatron_runs_combined_1f1b():
    m = load_model("deepseek_v3")
    assert m.mtp_layers == 1 and ep_overlap_blockers(Layout(tp=1, pp=1, ep=8), m) == []
    assert any("full recompute" in w for w in ep_overlap_blockers(Layout(ep=8, recompute="full"), m))
    assert any("virtual pipeline" in w for w in ep_overlap_blockers(Layout(ep=8, pp=4, vpp=1), m))
    # qwen3_30b_a3b: no MTP; EP 8, PP 1: overlap allowed -> much less exposed than with full recompute's blocker
    est, L, st, t, _ = _times("qwen3_30b_a3b", 64, ON, ep=8, micro_batch=1)
    comm = ep_comm_seconds(est.profile, st, L, ON, est.net) * est.imbalance
    assert t.ep < comm
    assert t.ep >= comm / L.grad_accum - 1e-15            # the unpaired micro-batch stays exposed
    est_f, L_f, st_f, t_full, _ = _times("qwen3_30b_a3b", 64, ON, ep=8, micro_batch=1, recompute="full")
    assert t_full.ep == pytest.approx(ep_comm_seconds(est_f.profile, st_f, L_f, ON, est_f.net) * est_f.imbalance)


def test_cp_ring_hides_behind_each_block_and_is_all_exposed_when_off():
    est, L, st, t_on, _ = _times("llama3_8b", 16, ON, tp=2, cp=2)
    *_, t_off, _ = _times("llama3_8b", 16, OFF, tp=2, cp=2)
    assert t_off.cp == pytest.approx(cp_ring_seconds(est.profile, st, L, ON, est.net, 3))
    assert t_on.cp < t_off.cp


def test_fsdp_exposes_more_as_the_data_parallel_group_grows_at_a_fixed_batch():
    """llama3_70b, global batch 1,024, TP 4: FSDP's per-layer gathers pay a ring latency that grows with the
    domains they span, so GA 1 over DP 512 exposes more than GA 8 over DP 64 per micro-batch of work."""
    share = {}
    for gpus in (256, 2048):
        est, L, st, t, (dp, _) = _times("llama3_70b", gpus, ON, tp=4, fsdp=True, micro_batch=2)
        share[gpus] = dp / (L.grad_accum * t.compute)
    assert share[2048] > 2 * share[256]


def test_dp_buckets_one_exposed_and_each_collective_pays_its_latency():
    est, L, st, t, _ = _times("llama3_70b", 64, ON, tp=8, pp=2)
    dense, expert = 1e9, 0.0
    # no hiding window at all: everything exposed, whether overlapped or not
    on0, tot = dp_time_per_step(dense, expert, L, ON, H100, est.net, 0.0, 0.0)
    off0, tot_off = dp_time_per_step(dense, expert, L, OFF, H100, est.net, 0.0, 0.0)
    assert on0 == pytest.approx(tot) and off0 == pytest.approx(tot_off)
    assert tot > tot_off       # 1e9 / 40M = 25 buckets, each paying its latency, against one collective
    # an endless window: only the last gradient bucket and the first weight bucket stay exposed
    on_inf, tot = dp_time_per_step(dense, expert, L, ON, H100, est.net, 1e9, 1e9)
    assert on_inf == pytest.approx(tot * 40e6 / 1e9, rel=1e-6)


def test_the_backwards_recomputation_is_dp_hiding_time():
    """Full recomputation re-runs each layer's forward inside the backward while the gradient reduce-scatters and
    the prefetched gathers run on their own streams (Megatron-FSDP, cost/dp.py): the FSDP window is the micro-batch's
    whole compute, recomputation included, so it exposes less than the same layout without recomputation, and
    stage_tail prices exactly the backward window compute − forward."""
    lay = dict(tp=2, ep=8, fsdp=True, micro_batch=4)   # the model zoo's Qwen3 FSDP layout
    est, L, st, t_none, (dp_none, _) = _times("qwen3_235b_a22b", 256, ON, recompute="none", **lay)
    est, L_full, st, t_full, (dp_full, _) = _times("qwen3_235b_a22b", 256, ON, recompute="full", **lay)
    assert t_full.forward == pytest.approx(t_none.forward)     # the forward is the same: only the backward grew
    assert t_full.compute > t_none.compute
    assert 0.0 < dp_full < dp_none                               # traffic left over without it, hidden by it
    assert est.stage_tail(L_full, st) == pytest.approx(
        est.stage_tail(L_full, st, t_full.forward, t_full.compute - t_full.forward))
    # the window without recomputation, handed to the recompute layout, gives back the larger exposure
    assert est.stage_tail(L_full, st, t_none.forward, t_none.compute - t_none.forward)[0] == pytest.approx(dp_none)


def test_the_switches_come_from_the_cli_flag():
    from autopar.cli.common import overlap_fields, overlap_set
    import argparse
    assert overlap_set("none") == () and overlap_set("tp,dp") == ("tp", "dp")
    with pytest.raises(argparse.ArgumentTypeError, match="subset of tp,dp,ep,cp"):
        overlap_set("tp,pp")
    ns = argparse.Namespace(overlap=("dp",))
    assert overlap_fields(ns) == {"tp_comm_overlap": False, "dp_comm_overlap": True, "ep_comm_overlap": False,
                                  "cp_comm_overlap": False}
    assert ON.overlaps() == "tp,dp,ep,cp" and OFF.overlaps() == "none"


@pytest.mark.parametrize("selective_ac", ["modules", "op"])
def test_the_window_holds_the_recompute_the_step_pays(selective_ac):
    """The compute communication hides behind is the layers' forward, backward and recomputation as the step time
    prices them (compute.recompute_shares), also under torchtitan's op-level SAC, whose recompute re-runs shares of
    every module rather than whole modules."""
    from autopar.cost.compute import layer_seconds

    tr = ON.model_copy(update={"selective_ac": selective_ac})
    est = Estimator(load_model("llama3_8b"), H100, tr, 16)
    L = est.resolve(Layout(tp=2, fsdp=True, recompute="selective"))
    st = est.stages(L.stage_layers)[0]
    _, total = hiding_windows(est.profile, st, L, tr, est.kernels)
    layers = sum(n * layer_seconds(est.profile, j, L, tr, est.kernels)
                 for j, n in est.profile.kind_counts(st.first, st.last))
    assert total == pytest.approx(layers)
