"""The search fills its tables by calling the cost model's term functions with numpy arrays over meshes and knobs
(Space.layout_grid): every element must equal the scalar call on that one layout."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.cost import Estimator
from autopar.cost.estimator import step_seconds
from autopar.cost.memory import (activation_bytes, activation_elems_per_token, buffer_bytes, linear_input_scale,
                                 model_state_bytes, stage_params)
from autopar.cost.pipeline import p2p_time
from autopar.search import SearchOptions
from autopar.search.space import build_space
from autopar.specs import ModelSpec, MoESpec, TrainingSpec
from autopar.specs.loaders import load_hardware


def _model(moe: bool, layers: int, kv: int, mtp: int) -> ModelSpec:
    return ModelSpec(name="m", num_layers=layers, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16,
                     num_kv_heads=kv, vocab_size=32000, mtp_layers=mtp,
                     moe=MoESpec(num_experts=16, top_k=2, expert_ffn_hidden_size=1024) if moe else None)


@settings(max_examples=6, deadline=None)
@given(moe=st.booleans(), layers=st.sampled_from([6, 8, 13]), kv=st.sampled_from([2, 16]), mtp=st.sampled_from([0, 1]),
       gpus=st.sampled_from([8, 16]), gb=st.sampled_from([8, 64, 96]),
       precision=st.sampled_from(["bf16", "fp8"]), offload=st.sampled_from([0.0, 0.5]))
def test_memory_terms_over_arrays_equal_the_scalar_calls(moe, layers, kv, mtp, gpus, gb, precision, offload):
    model, hw = _model(moe, layers, kv, mtp), load_hardware("h100_sxm")
    tr = TrainingSpec(seq_len=2048, global_batch=gb, precision=precision)
    space = build_space(model, hw, tr, gpus, SearchOptions(offload_activations=offload))
    est = Estimator(model, hw, tr, gpus)
    prof = est.profile
    mbs, vpp, zero = np.array(space.mbs), np.array(space.vpp), np.array(space.zero)
    for pp in sorted({m[2] for m in space.meshes if space.splits.get(m[2])}):
        meshes = [i for i, m in enumerate(space.meshes) if m[2] == pp]
        G = len(meshes)
        by_zero = space.layout_grid(meshes, (G, 1), "none", zero=zero[None, :])
        by_zero_mbs = space.layout_grid(meshes, (G, 1, 1), "none", micro_batch=mbs[None, None, :],
                                        zero=zero[None, :, None])
        for rc in space.recompute:
            by_mbs_vpp = space.layout_grid(meshes, (G, 1, 1), rc, micro_batch=mbs[None, :, None],
                                           vpp=vpp[None, None, :])
            for st_ in est.stages(space.layout(meshes[0], 1, "none", 1, 0).stage_layers):
                states = sum(model_state_bytes(prof, st_, by_zero, tr))
                buf = buffer_bytes(prof, st_, by_zero_mbs, tr)
                dense, expert = stage_params(prof, st_, by_zero)
                act = activation_bytes(prof, st_, by_mbs_vpp, tr)
                for g, mi in enumerate(meshes):
                    for z_i, z in enumerate(space.zero):
                        L = space.layout(mi, 1, rc, 1, z)
                        assert np.broadcast_to(states, (G, len(zero)))[g, z_i] == pytest.approx(
                            sum(model_state_bytes(prof, st_, L, tr)), rel=1e-12)
                        assert (np.broadcast_to(dense, (G, 1))[g, 0], np.broadcast_to(expert, (G, 1))[g, 0]) == \
                            pytest.approx(stage_params(prof, st_, L), rel=1e-12)
                        for j, b in enumerate(space.mbs):
                            L = space.layout(mi, b, rc, 1, z)
                            assert np.broadcast_to(buf, (G, len(zero), len(mbs)))[g, z_i, j] == pytest.approx(
                                buffer_bytes(prof, st_, L, tr), rel=1e-12)
                    for j, b in enumerate(space.mbs):
                        for k, v in enumerate(space.vpp):
                            L = space.layout(mi, b, rc, v, 0)
                            assert np.broadcast_to(act, (G, len(mbs), len(vpp)))[g, j, k] == pytest.approx(
                                activation_bytes(prof, st_, L, tr), rel=1e-12)


@settings(max_examples=5, deadline=None)
@given(moe=st.booleans(), layers=st.sampled_from([8, 13]), gpus=st.sampled_from([8, 32]), gb=st.sampled_from([16, 96]),
       fsdp2=st.booleans())
def test_time_terms_over_knob_arrays_equal_the_scalar_calls(moe, layers, gpus, gb, fsdp2):
    model, hw = _model(moe, layers, 4, 0), load_hardware("h100_sxm")
    torch_dp = {"dp_impl": "fsdp2", "optimizer_impl": "foreach"} if fsdp2 else {}   # torchtitan's DP and optimizer
    tr = TrainingSpec(seq_len=2048, global_batch=gb, **torch_dp)
    space = build_space(model, hw, tr, gpus, SearchOptions())
    est = Estimator(model, hw, tr, gpus)
    mbs, vpp, zero = np.array(space.mbs), np.array(space.vpp), np.array(space.zero)
    t_fwd = np.array([0.01, 0.02, 0.04])[: len(mbs)]
    for mi, mesh in enumerate(space.meshes):
        if space.splits.get(mesh[2]) is None:
            continue
        p2p = p2p_time(space.layout_grid([mi], None, "none", micro_batch=mbs[:, None], vpp=vpp[None, :]), tr,
                       est.profile.hidden, hw, est.net)
        grid = space.layout_grid([mi], None, "none", micro_batch=mbs[None, :], zero=zero[:, None])
        for st_ in est.stages(space.layout(mi, 1, "none", 1, 0).stage_layers):
            dp_t, opt_t = est.stage_tail(grid, st_, t_fwd[None, :])
            for z_i, z in enumerate(space.zero):
                for j, b in enumerate(space.mbs):
                    L = space.layout(mi, b, "none", 1, z)
                    want = est.stage_tail(L, st_, float(t_fwd[j]))
                    got = (np.broadcast_to(dp_t, (len(zero), len(mbs)))[z_i, j],
                           np.broadcast_to(opt_t, (len(zero), len(mbs)))[z_i, j])
                    assert got == pytest.approx(want, rel=1e-12, abs=1e-15)
        for j, b in enumerate(space.mbs):
            for k, v in enumerate(space.vpp):
                L = space.layout(mi, b, "none", v, 1)
                assert np.broadcast_to(p2p, (len(mbs), len(vpp)))[j, k] == pytest.approx(
                    p2p_time(L, tr, est.profile.hidden, hw, est.net), rel=1e-12)


def test_step_seconds_is_the_estimate_step_time():
    """The search sums its tables with step_seconds; it must equal the sum of estimate()'s terms."""
    model, hw = _model(True, 8, 4, 1), load_hardware("h100_sxm")
    tr = TrainingSpec(seq_len=2048, global_batch=64)
    space = build_space(model, hw, tr, 16, SearchOptions())
    est = Estimator(model, hw, tr, 16)
    checked = 0
    for mi, mesh in enumerate(space.meshes):
        if space.splits.get(mesh[2]) is None:
            continue
        for v in space.vpp:
            L = space.layout(mi, 2, "selective", v, 1)
            e = est.estimate(L, resolved=True)
            ts = e.time_s
            t_mb = (ts.compute + ts.tp + ts.cp + ts.ep + ts.offload) / L.grad_accum
            got = step_seconds(L, t_mb, ts.pp_p2p, ts.dp + ts.optimizer)
            assert got == pytest.approx(e.step_time_s, rel=1e-12)
            checked += 1
    assert checked > 10


def test_elements_per_token_accept_degree_arrays():
    """activation_elems_per_token is called per (tp, cp) by the search; the memory terms around it take arrays."""
    model, hw = _model(False, 8, 4, 0), load_hardware("h100_sxm")
    tr = TrainingSpec(seq_len=2048, global_batch=64)
    space = build_space(model, hw, tr, 8, SearchOptions())
    est = Estimator(model, hw, tr, 8)
    st_ = est.stages(space.layout(0, 1, "none", 1, 0).stage_layers)[0]
    kept, working = activation_elems_per_token(est.profile, st_, space.layout(0, 1, "full", 1, 0),
                                                linear_input_scale(tr))
    assert kept > 0 and working > 0


def test_ep_exposure_and_traffic_over_arrays_equal_the_scalar_calls():
    """The step-time floors (``Bounds._ep_floor``) call ``ep_comm_seconds`` over the micro-batches and
    ``ep_time_per_microbatch`` over meshes, micro-batches and stages at once: each element is the scalar call's,
    with and without virtual stages (the overlap's rules) and at windows from none to beyond the traffic."""
    from autopar.cost.ep import ep_comm_seconds, ep_time_per_microbatch
    model, hw = _model(True, 8, 2, 0), load_hardware("h100_sxm")
    tr = TrainingSpec(seq_len=2048, global_batch=64, ep_comm_overlap=True)
    space = build_space(model, hw, tr, 16, SearchOptions(mbs=[1, 2, 4]))
    est = Estimator(model, hw, tr, 16)
    mbs = np.array(space.mbs)
    seen = 0
    for mi, (tp, cp, pp, ep, etp) in enumerate(space.meshes):
        if ep * etp == 1 or not space.splits.get(pp):
            continue
        st_ = est.stages(space.stage_layers(pp))[0]
        for rc in ("none", "full"):
            grid = space.layout_grid([mi], None, rc, micro_batch=mbs)
            total = np.asarray(ep_comm_seconds(est.profile, st_, grid, tr, est.net)) * est.imbalance
            window = total[:, None] * np.array([0.0, 0.5, 2.0, np.inf])[None, :]            # (J, 4)
            for vpp in (1, 2):
                M = grid.grad_accum
                Lv = space.layout_grid([mi], None, rc, micro_batch=mbs, vpp=vpp, grad_accum=M[:, None])
                arr = ep_time_per_microbatch(est.profile, st_, Lv, tr, hw, est.net, est.imbalance, window,
                                             total[:, None] * np.ones(4))
                for j, b in enumerate(space.mbs):
                    L = space.layout(mi, b, rc, vpp, 0)
                    t = ep_comm_seconds(est.profile, st_, L, tr, est.net) * est.imbalance
                    assert t == total[j]
                    for w in range(4):
                        assert np.broadcast_to(arr, (len(mbs), 4))[j, w] == ep_time_per_microbatch(
                            est.profile, st_, L, tr, hw, est.net, est.imbalance, float(window[j, w]), t)
                seen += 1
    assert seen


def test_torch_ring_activation_bytes_over_arrays_equal_the_scalar_calls():
    """The torchtitan stack's terms (PyTorch's loss path, pipelining buffers, the all-gather ring attention's
    backward buffers under CP) over mesh arrays with CP > 1: each element is the scalar call's."""
    model, hw = _model(False, 8, 2, 0), load_hardware("h100_sxm")
    tr = TrainingSpec(seq_len=8192, global_batch=16, loss_runtime="torch", cp_ring="torch_allgather")
    space = build_space(model, hw, tr, 16, SearchOptions())
    est = Estimator(model, hw, tr, 16)
    mbs, vpp = np.array(space.mbs), np.array(space.vpp)
    checked = 0
    for pp in sorted({m[2] for m in space.meshes if space.splits.get(m[2])}):
        meshes = [i for i, m in enumerate(space.meshes) if m[2] == pp]
        G = len(meshes)
        for rc in space.recompute:
            grid = space.layout_grid(meshes, (G, 1, 1), rc, micro_batch=mbs[None, :, None], vpp=vpp[None, None, :])
            for st_ in est.stages(space.layout(meshes[0], 1, "none", 1, 0).stage_layers):
                act = np.broadcast_to(activation_bytes(est.profile, st_, grid, tr), (G, len(mbs), len(vpp)))
                for g, mi in enumerate(meshes):
                    for j, b in enumerate(space.mbs):
                        for k, v in enumerate(space.vpp):
                            L = space.layout(mi, b, rc, v, 0)
                            assert act[g, j, k] == pytest.approx(activation_bytes(est.profile, st_, L, tr), rel=1e-12)
                            checked += L.cp > 1
    assert checked > 0
