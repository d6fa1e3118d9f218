"""Async TP as PyTorch runs it (autopar/cost/tp.py): only the pattern-matched collectives overlap, the backward
reduce-scatter of a summed gradient stays exposed, the fused GEMMs run in TP chunks, and the fused reduce-scatters
end in a partial sum."""

from __future__ import annotations

import pytest

from autopar.cost import Estimator
from autopar.cost.overlap import overlap_cost
from autopar.cost.tp import async_tp_compute_seconds, async_tp_fused_share, tp_comm_seconds
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_model
from autopar.specs.training import TrainingSpec

HW = load_hardware("h100_grand_teton")
UB = TrainingSpec(seq_len=8192, global_batch=64)
ASYNC = UB.model_copy(update={"tp_overlap_impl": "async_tp"})
OFF = UB.model_copy(update={"tp_comm_overlap": False})


def _stage(training: TrainingSpec, gpus: int = 16, model: str = "llama3_8b", **lay):
    est = Estimator(load_model(model), HW, training, gpus)
    L = est.resolve(Layout(**lay))
    return est, L, est.stages(L.stage_layers)[0]


@pytest.mark.parametrize("update,recompute,share", [
    ({}, "selective", 3 / 4),                                  # fwd AG + RS, bwd AG; not the bwd RS
    ({}, "full", 5 / 6),                                       # the recomputed forward's AG + RS too
    ({"precision": "fp8", "fp8_recipe": "tensorwise"}, "selective", (1 + 0.5 + 0.5) / (2 * 1.5)),  # FP8 gathers
    ({"precision": "fp8", "fp8_recipe": "rowwise"}, "selective", 1 / 4),    # gathered in BF16, cast after: RS only
])
def test_fused_share_is_what_the_pattern_matcher_finds(update, recompute, share):
    tr = ASYNC.model_copy(update=update)
    est, L, st = _stage(tr, tp=8, pp=2, recompute=recompute)      # first of two stages: no LM head
    assert not st.is_last
    assert async_tp_fused_share(est.profile, st, L, tr) == pytest.approx(share)


def test_unfused_reduce_scatter_stays_exposed():
    est, L, st = _stage(ASYNC, tp=8, pp=2, micro_batch=4)
    t = est.stage_times(L, st).tp
    comm = tp_comm_seconds(est.profile, st, L, ASYNC, est.net)
    assert comm / 4 <= t < comm           # at least the backward reduce-scatter (1/4), less than all of it
    # userbuffers overlaps every collective: less exposed than async TP at these sizes
    est_ub, L_ub, st_ub = _stage(UB, tp=8, pp=2, micro_batch=4)
    assert est_ub.stage_times(L_ub, st_ub).tp < t


def test_chunked_gemms_cost_more_at_few_tokens():
    """tp GEMMs of M/tp rows instead of one of M: the shape curve's M factor (gemm_half_m) costs more per token
    when M is small; each fused reduce-scatter adds one HBM pass, the same per token."""
    small = ASYNC.model_copy(update={"seq_len": 1024})
    per_tok = []
    for tr, mb in ((small, 1), (ASYNC, 4)):
        est, L, st = _stage(tr, tp=8, micro_batch=mb)
        extra = async_tp_compute_seconds(est.profile, st, L, tr, est.kernels)
        assert extra > 0
        per_tok.append(extra / (mb * tr.seq_len))
    assert per_tok[0] > 1.5 * per_tok[1]


def test_hidden_part_pays_the_copy_engine_slowdown():
    """The async-TP term is the unfused part, the fused part's exposure, the chunking and sums, and the overlap cost
    of what hides, with the hardware file's copy-engine slowdown."""
    slow = HW.model_copy(update={"kernel_model": HW.kernel_model.model_copy(
        update={"overlap_slowdown": HW.kernel_model.overlap_slowdown.model_copy(update={"copy_engine": 0.25})})})
    times = []
    for hw in (HW, slow):
        est = Estimator(load_model("llama3_8b"), hw, ASYNC, 16)
        L = est.resolve(Layout(tp=8, micro_batch=4))
        st = est.stages(L.stage_layers)[0]
        times.append((est.stage_times(L, st).tp, tp_comm_seconds(est.profile, st, L, ASYNC, est.net)
                      * async_tp_fused_share(est.profile, st, L, ASYNC)))
    (t0, fused), (t1, _) = times
    # the GEMM window hides all of the fused transfers at these sizes: the whole fused share pays the slowdown
    assert t1 - t0 == pytest.approx(overlap_cost(fused, slow, "copy_engine") - overlap_cost(fused, HW, "copy_engine"))


def test_stack_knob_selects_async_tp():
    from autopar.specs.stack import StackKnobs
    f = StackKnobs(tp_overlap="async_tp", elementwise="compiled").training_fields()
    assert f["tp_comm_overlap"] and f["tp_overlap_impl"] == "async_tp"
    f = StackKnobs(tp_overlap="userbuffers").training_fields()
    assert f["tp_comm_overlap"] and f["tp_overlap_impl"] == "userbuffers"
    assert not StackKnobs(tp_overlap="none").training_fields()["tp_comm_overlap"]


def test_async_tp_across_nvlink_domains_is_plain_tp():
    """Symmetric memory needs peer access: a TP group spanning NVLink domains gets no async-TP overlap."""
    net = HW.model_copy(update={"nvlink_domain_size": 4, "gpus_per_node": 4})
    est = Estimator(load_model("llama3_8b"), net, ASYNC, 16)
    L = est.resolve(Layout(tp=8, micro_batch=4))
    st = est.stages(L.stage_layers)[0]
    assert est.net.placement(8, 1)[1] == 2
    assert est.stage_times(L, st).tp == pytest.approx(tp_comm_seconds(est.profile, st, L, ASYNC, est.net))
