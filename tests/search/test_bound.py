"""The branch and bound's parts alone (autopar/search/bound.py): exact pruning on hand-made tables, and the bounds of
a real mesh never above its layouts' step times."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.cost import Estimator
from autopar.search import SearchOptions
from autopar.search.bound import Bounds, prune
from autopar.search.space import build_space
from autopar.search.tables import SCALE_T, Tables, cap_mib, mesh_validity
from autopar.specs import ModelSpec, MoESpec, TrainingSpec
from autopar.specs.loaders import load_hardware


def test_prune_keeps_the_top_k_that_fit_and_the_smallest_that_does_not_per_status():
    step = np.array([[5, 1, 3, 2, 4, 6, 7]])
    mem = np.array([[10, 200, 10, 10, 300, 150, 10]])
    b_bad = np.array([[False] * 6 + [True]])          # the last one is alone in its status: kept
    i_bad = np.zeros_like(b_bad)
    keep = prune(step, mem, b_bad, i_bad, top_k=2, cap=100)
    assert np.flatnonzero(keep[0]).tolist() == [2, 3, 5, 6]   # 2 and 3 fastest that fit; 5 smallest over the cap


def test_a_mesh_bound_is_below_every_layout_of_it_and_refines_upwards():
    model = ModelSpec(name="m", num_layers=8, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=16,
                      num_kv_heads=4, vocab_size=32000)
    hw, tr = load_hardware("h100_sxm"), TrainingSpec(seq_len=4096, global_batch=64)
    space = build_space(model, hw, tr, 16, SearchOptions(mbs=[1, 2], vpp=[1, 2], zero=[1, 3],
                                                         recompute=["none", "full"]))
    meshes, _, _ = mesh_validity(space)
    t = Tables(space, Estimator(model, hw, tr, 16), meshes)
    b = Bounds(t)
    fit = t.fit_pairs(cap_mib(space))
    fitting = [p for p in range(len(meshes)) if fit[p].any()]
    b.start_bounds(fitting, fit[fitting])
    J, R, K, Z = (len(space.mbs), len(space.recompute), len(space.vpp), len(space.zero))
    for pos in fitting:
        t.fill_time(pos)
        step_us, mem_mib, b_bad, i_bad = t.compose(np.array([pos]))
        ok = (~b_bad & ~i_bad & (mem_mib <= cap_mib(space))).reshape(J, R, K, Z)
        for j in np.nonzero(ok.any(axis=(1, 2, 3)))[0]:
            best = step_us.reshape(J, R, K, Z)[j][ok[j]].min()
            levels = [b.lb_by_mbs[pos][j]]                   # the floor, then the bound, then bound + tail
            while b._level[pos][j] < 2:
                b.refine(pos, int(j))
                levels.append(b.lb_by_mbs[pos][j])
            assert len(levels) == 3 and levels == sorted(levels)           # raised, never lowered
            assert np.rint(levels[-1] * SCALE_T) <= best + 1                # never above a layout that fits


@pytest.mark.parametrize("selective_ac", ["modules", "op"])
def test_the_ep_floor_is_below_the_ep_term_and_raises_the_floor(selective_ac):
    """The floors' EP part (``Bounds._ep_floor``: the cost model's own exposure with the layer kernels as the
    window) never exceeds the EP term ``stage_times`` gives each stage, with and without virtual stages, and on a
    MoE model with the all-to-all overlap on it lifts the floors of expert-parallel meshes (what lets the branch and
    bound skip them without timing them)."""
    model = ModelSpec(name="moe", num_layers=8, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=16,
                      num_kv_heads=4, vocab_size=32000,
                      moe=MoESpec(num_experts=16, top_k=2, expert_ffn_hidden_size=1024))
    hw = load_hardware("h100_sxm")
    tr = TrainingSpec(seq_len=4096, global_batch=64, ep_comm_overlap=True, selective_ac=selective_ac)
    space = build_space(model, hw, tr, 32, SearchOptions(mbs=[1, 2], vpp=[1, 2], zero=[1],
                                                         recompute=["none", "selective", "full"]))
    meshes, _, _ = mesh_validity(space)
    est = Estimator(model, hw, tr, 32)
    t = Tables(space, est, meshes)
    b = Bounds(t)
    lifted = 0
    for split in dict.fromkeys(t.splits):
        positions = [p for p in range(len(meshes)) if t.splits[p] == split]
        for r, rc in enumerate(space.recompute):
            layer_s = np.stack([b._layer_kernels(p, r) for p in positions])
            counts, _ = b._stage_kinds(positions[0])
            ep1, ep_v = b._ep_floor(positions, r, layer_s @ counts.T)
            for g, pos in enumerate(positions):
                for j, mbs in enumerate(space.mbs):
                    for c, vpp in enumerate((1, 2)):
                        L = space.layout(meshes[pos], mbs, rc, vpp if t.vpp_matters[pos] else 1, 1)
                        for s, st in enumerate(t.stages[pos]):
                            floor = (ep1, ep_v)[c][g, j, s]
                            assert 0 <= floor <= est.stage_times(L, st).ep * (1 + 1e-12), (pos, mbs, rc, vpp, s)
                            lifted += floor > 0
    assert lifted > 0


@pytest.mark.parametrize("cp_ring,overlap", [("te_p2p", True), ("te_p2p", False), ("torch_allgather", True)])
def test_floors_with_the_ends_and_the_cp_term_stay_below_the_bound(cp_ring, overlap):
    """The floors count the first and last stages' extra kernels (embedding gradient, LM head, the MTP layer and its
    head: ``Bounds._ends``) and the CP term (``Bounds._cp_floor``, ``Estimator.cp_seconds`` itself): on DeepSeek-V3
    (MTP, MoE) at a long sequence, where context-parallel meshes fit, every floor stays at or below the bound of its
    (micro-batch, recompute) pair, and the CP part is what stage_times adds for a cp > 1 stage."""
    from autopar.specs.loaders import load_model
    model, hw = load_model("deepseek_v3"), load_hardware("h100_sxm")
    tr = TrainingSpec(seq_len=32768, global_batch=256, cp_ring=cp_ring, cp_comm_overlap=overlap)
    space = build_space(model, hw, tr, 256, SearchOptions(mbs=[1], vpp=[1, 2], zero=[1, 3]))
    meshes, _, _ = mesh_validity(space)
    est = Estimator(model, hw, tr, 256)
    t = Tables(space, est, meshes)
    b = Bounds(t)
    fit = t.fit_pairs(cap_mib(space))
    fitting = [p for p in range(len(meshes)) if fit[p].any()]
    with_cp = [p for p in fitting if space.meshes[meshes[p]][1] > 1][::3]
    assert with_cp
    for r, rc in enumerate(space.recompute):
        rows = [p for p in with_cp[::2] + fitting[::11] if fit[p, :, r].any()]
        floors = b.floors(rows, r)
        for g, pos in enumerate(rows):
            for j in np.nonzero(fit[pos, :, r])[0]:
                assert 0 < floors[g, j] <= b.bound(pos, int(j), r), (space.meshes[meshes[pos]], rc)
        for pos in rows[:5]:
            cp_s = b._cp_floor([pos], r)[0]
            L = space.layout(meshes[pos], space.mbs[0], rc, 1, 1)
            for s, st in enumerate(t.stages[pos]):
                assert cp_s[0, s] == est.stage_times(L, st).cp
