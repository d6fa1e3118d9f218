"""The Estimator's memos (stage_params, activation_elems_per_token and the vpp-free stage terms kept per stage, the
layer prices kept per Kernels) never change an answer: over layouts that differ in one field at a time, an estimate
from an Estimator that has priced every other layout first equals, to the last bit, the estimate of a fresh
Estimator. A memo keyed too loosely (a field a term reads but the key leaves out) would hand one layout another's
numbers and fail here."""

from __future__ import annotations

import itertools
import operator

import pytest

from autopar.cost import Estimator
from autopar.cost import memory
from autopar.cost.memory import activation_elems_per_token, stage_params
from autopar.errors import AutoparInputError
from autopar.specs import TrainingSpec
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_model

# (model, gpus, training, the fields varied): a dense model (TP, CP, SP, recompute, offload, ZeRO, batch), a MoE
# model (EP, ETP besides), a hybrid with state layers (their CP exchange), each with every overlap on
CASES = [
    ("llama3_8b", 16, dict(tp=(1, 2), pp=(1, 2), vpp=(1, 2), cp=(1, 2), micro_batch=(1, 2), zero_stage=(1, 3),
                           recompute=("none", "selective", "full"), offload_activations=(0.0, 0.5),
                           sequence_parallel=(None, False))),
    ("mixtral_8x7b", 16, dict(tp=(1, 2), pp=(1, 2), ep=(1, 2, 4), etp=(1, 2), micro_batch=(1, 2),
                              zero_stage=(0, 1), recompute=("none", "full", "moe_act"))),
    ("falcon_h1_7b", 16, dict(tp=(1, 2), pp=(1, 2), cp=(1, 2, 4), micro_batch=(1, 2), zero_stage=(1, 3),
                              recompute=("none", "full"))),
]
OVERLAPS = dict(tp_comm_overlap=True, dp_comm_overlap=True, ep_comm_overlap=True, cp_comm_overlap=True)


def _layouts(est: Estimator, axes: dict) -> list[Layout]:
    out = []
    for values in itertools.product(*axes.values()):
        try:
            out.append(est.resolve(Layout(**dict(zip(axes, values)))))
        except (AutoparInputError, ValueError):
            continue   # not a valid layout of this model on this many GPUs
    return out


@pytest.mark.parametrize("name,gpus,axes", CASES, ids=[c[0] for c in CASES])
def test_warm_estimates_equal_cold_ones(name, gpus, axes):
    model, hw = load_model(name), load_hardware("h100_sxm")
    tr = TrainingSpec(seq_len=8192, global_batch=64, **OVERLAPS)
    warm = Estimator(model, hw, tr, gpus)
    layouts = _layouts(warm, axes)
    assert len(layouts) >= 20, "the case should cover many layouts"
    for L in layouts + layouts[::-1]:     # every layout priced after the others have filled the memos
        warm.estimate(L, resolved=True)
    distinct = {warm.estimate(L, resolved=True).step_time_s for L in layouts}
    assert len(distinct) > len(layouts) // 4   # the layouts do price differently
    for L in layouts:
        assert warm.estimate(L, resolved=True) == Estimator(model, hw, tr, gpus).estimate(L, resolved=True), L.short()


def test_stage_params_memo_is_per_degrees():
    """The same stage at other TP / EP / ETP degrees gets its own entry, equal to the unmemoised price."""
    model, hw, tr = load_model("mixtral_8x7b"), load_hardware("h100_sxm"), TrainingSpec(seq_len=4096, global_batch=64)
    est = Estimator(model, hw, tr, 16)
    st = est.stages((32,))[0]
    seen = {}
    for tp, ep, etp in [(1, 1, 1), (2, 1, 1), (1, 4, 1), (1, 4, 2), (2, 4, 1)]:
        L = Layout(tp=tp, ep=ep, etp=etp)
        seen[(tp, ep, etp)] = stage_params(est.profile, st, L)
        bare = st.__class__(st.index, st.pp, st.first, st.last, st.sums)    # no memo: priced afresh
        assert seen[(tp, ep, etp)] == stage_params(est.profile, bare, L)
    assert len(set(seen.values())) == len(seen)


def test_with_hardware_does_not_reuse_the_other_hardwares_prices():
    model, tr = load_model("llama3_8b"), TrainingSpec(seq_len=4096, global_batch=64, **OVERLAPS)
    h100, b200 = load_hardware("h100_sxm"), load_hardware("b200")
    est = Estimator(model, h100, tr, 16)
    L = est.resolve(Layout(tp=2, pp=2, cp=2))
    on_h100 = est.estimate(L, resolved=True)
    on_b200 = est.with_hardware(b200).estimate(L, resolved=True)
    assert on_b200 == Estimator(model, b200, tr, 16).estimate(L, resolved=True)
    assert on_b200.step_time_s != on_h100.step_time_s
    assert est.estimate(L, resolved=True) == on_h100


def _act_elems_memo_mismatches(est: Estimator, model) -> int:
    """Price activation_elems_per_token over every ACT_ELEMS_FIELDS value and ``lin`` on one memoised stage, each
    layout after all the others; count results that differ from a memo-free stage's."""
    st = est.stages((model.num_layers,))[0]
    cases = [(Layout(tp=tp, cp=cp, sequence_parallel=sp, recompute=rc), lin)
             for tp in (1, 4) for cp in (1, 2) for sp in (False, True) if tp > 1 or not sp
             for rc in ("none", "selective", "full") for lin in (1.0, 0.5)]
    bare = st.__class__(st.index, st.pp, st.first, st.last, st.sums)    # no memo: priced afresh
    want = [activation_elems_per_token(est.profile, bare, L, lin) for L, lin in cases]
    assert len(set(want)) > len(cases) // 2    # the fields do change the price
    for L, lin in cases:
        activation_elems_per_token(est.profile, st, L, lin)
    return sum(activation_elems_per_token(est.profile, st, L, lin) != w for (L, lin), w in zip(cases, want))


def test_activation_elems_memo_is_keyed_by_every_field_it_reads(monkeypatch):
    """The stage's activation-elements memo returns the unmemoised price for every (tp, cp, sp, recompute, lin); with
    any one of ACT_ELEMS_FIELDS left out of its key the same check fails (the key is not too loose)."""
    model, hw, tr = load_model("llama3_8b"), load_hardware("h100_sxm"), TrainingSpec(seq_len=4096, global_batch=64)
    assert _act_elems_memo_mismatches(Estimator(model, hw, tr, 16), model) == 0
    for dropped in memory.ACT_ELEMS_FIELDS:
        kept = [f for f in memory.ACT_ELEMS_FIELDS if f != dropped]
        monkeypatch.setattr(memory, "_act_elems_key", operator.attrgetter(*kept, "pp"))   # pp: still a tuple
        assert _act_elems_memo_mismatches(Estimator(model, hw, tr, 16), model) > 0, dropped


def _state_memo_mismatches(est: Estimator, model, terms) -> int:
    """Price ``terms`` (memory functions kept in the stage's memo) over every BUFFER_FIELDS value (STATE_FIELDS and
    the micro-batch) on one memoised stage, each layout after all the others; count results that differ from a
    memo-free stage's."""
    st = est.stages((model.num_layers,))[0]
    cases = [Layout(tp=tp, ep=ep, etp=etp, dp=dp, cp=cp, hsdp_shard=hsdp, zero_stage=z, micro_batch=mb)
             for tp, ep, etp, dp, cp, hsdp, z, mb in itertools.product((1, 2), (1, 4), (1, 2), (2, 8), (1, 2),
                                                                      (None, 2), (0, 1, 2, 3), (1, 2))
             if dp * tp * cp % (ep * etp) == 0]   # a whole expert-data-parallel degree
    bare = st.__class__(st.index, st.pp, st.first, st.last, st.sums)    # no memo: priced afresh
    tr = est.training
    want = [tuple(f(est.profile, bare, L, tr) for f in terms) for L in cases]
    assert len(set(want)) > len(cases) // 8    # the fields do change the price
    for L in cases:
        for f in terms:
            f(est.profile, st, L, tr)
    return sum(tuple(f(est.profile, st, L, tr) for f in terms) != w for L, w in zip(cases, want))


@pytest.mark.parametrize("fields,key,terms", [
    ("STATE_FIELDS", "_state_key", ("model_state_bytes", "step_grad_copy_bytes")),
    ("BUFFER_FIELDS", "_buffer_key", ("buffer_bytes",))])
def test_memory_memos_are_keyed_by_every_field_they_read(monkeypatch, fields, key, terms):
    """The stage's memory memos (weights, gradients, optimizer state and the optimizer step's gradient copy under
    STATE_FIELDS; the buffers under BUFFER_FIELDS) return the unmemoised price for every value of their fields; with
    any one field left out of the key the same check fails (the key is not too loose). FP8 training: its weight
    copies make the buffers read the sharding group."""
    model, hw = load_model("mixtral_8x7b"), load_hardware("h100_sxm")
    tr = TrainingSpec(seq_len=4096, global_batch=64, precision="fp8")
    funcs = [getattr(memory, t) for t in terms]
    assert _state_memo_mismatches(Estimator(model, hw, tr, 64), model, funcs) == 0
    for dropped in getattr(memory, fields):
        kept = [f for f in getattr(memory, fields) if f != dropped]
        monkeypatch.setattr(memory, key, operator.attrgetter(*kept))
        assert _state_memo_mismatches(Estimator(model, hw, tr, 64), model, funcs) > 0, dropped
