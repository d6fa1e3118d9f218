"""The term tables alone (autopar/search/tables.py): dp, the micro-batches per step and the batch and interleaving
validity are the layouts' own and the layout rules' own, and each composed candidate is that layout's estimate."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.cost import Estimator
from autopar.search import SearchOptions
from autopar.search.space import build_space
from autopar.search.tables import SCALE_M, SCALE_T, Tables, mesh_validity
from autopar.specs import ModelSpec, MoESpec, TrainingSpec
from autopar.specs.layout import Layout, check_layout_groups
from autopar.specs.loaders import load_hardware

HW = load_hardware("h100_sxm")


def _problem(moe: bool, layers: int, gpus: int, gb: int):
    model = ModelSpec(name="m", num_layers=layers, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16,
                      num_kv_heads=4, vocab_size=32000,
                      moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1024) if moe else None)
    tr = TrainingSpec(seq_len=2048, global_batch=gb)
    space = build_space(model, HW, tr, gpus, SearchOptions(mbs=[1, 2, 3], vpp=[1, 2, 4], zero=[1, 3],
                                                         recompute=["none", "full"]))
    meshes, _, _ = mesh_validity(space)
    return model, tr, space, Tables(space, Estimator(model, HW, tr, gpus), meshes)


def test_layout_names_its_dense_and_expert_ranks():
    L = Layout(tp=2, cp=2, pp=4, ep=8, etp=1, dp=2)
    assert L.dense_ranks == 16 and L.expert_ranks == 32 and L.world == L.dp * L.dense_ranks
    assert L.edp * L.expert_ranks == L.world


@settings(max_examples=6, deadline=None)
@given(moe=st.booleans(), layers=st.sampled_from([6, 8, 12]), gpus=st.sampled_from([8, 16]),
       gb=st.sampled_from([12, 16, 48]))
def test_dp_batch_and_interleaving_are_the_layout_rules_own(moe, layers, gpus, gb):
    """Against Space.layout (dp, grad_accum) and check_layout_groups' 'batch' and 'interleaving' groups, layout by
    layout: a table that re-derived these rules and drifted from them would be caught here."""
    model, tr, space, t = _problem(moe, layers, gpus, gb)
    for pos in range(len(t.meshes)):
        t.fill_memory([pos])
    for pos, mi in enumerate(t.meshes):
        for j, mbs in enumerate(space.mbs):
            L1 = space.layout(mi, mbs, "none", 1, 1)
            assert (t.dp[pos], t.M[pos, j]) == (L1.dp, L1.grad_accum)
            for k, vpp in enumerate(space.vpp):
                groups = {g for g, _ in check_layout_groups(space.layout(mi, mbs, "none", vpp, 1), model, tr, gpus)}
                assert t.batch_ok[pos, j] == ("batch" not in groups)
                if t.batch_ok[pos, j]:   # the rules report interleaving only once the batch divides
                    assert t.inter_ok[pos, j, k] == ("interleaving" not in groups), (mi, mbs, vpp)


def test_each_composed_candidate_is_its_layouts_estimate():
    model, tr, space, t = _problem(True, 8, 8, 32)
    est = t.est
    for pos in range(len(t.meshes)):
        t.fill(pos)
    step_us, mem_mib, b_bad, i_bad = t.compose(np.arange(len(t.meshes)))
    J, R, K, Z = (len(space.mbs), len(space.recompute), len(space.vpp), len(space.zero))
    checked = 0
    for pos, mi in enumerate(t.meshes):
        for idx in np.nonzero(~b_bad[pos] & ~i_bad[pos])[0][::5]:
            j, r, k, z = np.unravel_index(idx, (J, R, K, Z))
            L = space.layout(mi, space.mbs[j], space.recompute[r], space.vpp[k], space.zero[z])
            e = est.estimate(L, resolved=True)
            assert step_us[pos, idx] == pytest.approx(e.step_time_s * SCALE_T, abs=1)
            # the tables hold the modelled bytes; the estimate adds the reserve and the fragmentation on top
            mem = (e.memory_gib.total - HW.reserve_gib) / (1 + HW.fragmentation) * SCALE_M
            assert mem_mib[pos, idx] == pytest.approx(mem, rel=1e-6, abs=1)
            checked += 1
    assert checked > 10
