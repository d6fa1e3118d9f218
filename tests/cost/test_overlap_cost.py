"""What hiding a collective costs the compute beside it (autopar/cost/overlap.py), and that every overlapped term
(TP, DP/FSDP, EP, CP) pays it on its hidden part only."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.cost import Estimator
from autopar.cost.overlap import link_rate, overlap_cost
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_model
from autopar.specs.training import TrainingSpec

H100 = load_hardware("h100_sxm")
ON = TrainingSpec(seq_len=4096, global_batch=1024)
OFF = ON.model_copy(update={**{f"{k}_comm_overlap": False for k in ("tp", "dp", "ep", "cp")},
                            "tp_dgrad_overlap": False})   # nothing hidden


def _with_slowdown(hw, sm: float, ce: float = 0.0):
    km = hw.kernel_model
    return hw.model_copy(update={"kernel_model": km.model_copy(
        update={"overlap_slowdown": km.overlap_slowdown.model_copy(update={"sm": sm, "copy_engine": ce})})})


def test_cost_is_the_work_lost_while_the_collective_runs():
    s = H100.kernel_model.overlap_slowdown.sm
    assert s == pytest.approx(0.189)
    # compute overlapped for 1 s runs 1 + s times slower: it loses s / (1 + s) of a second of work
    assert overlap_cost(1.0, H100, "sm") == pytest.approx(s / (1 + s))
    assert overlap_cost(0.0, H100, "sm") == 0.0
    assert overlap_cost(1.0, H100, "copy_engine") == 0.0     # not measured: no SM taken
    got = overlap_cost(np.array([0.0, 1.0, 2.0]), H100, "sm")
    assert got == pytest.approx([0.0, s / (1 + s), 2 * s / (1 + s)])


def test_a_network_collective_costs_in_proportion_to_its_byte_rate():
    km = H100.kernel_model
    r = H100.scaleout_gbps * km.scaleout / (H100.nvlink_gbps * km.nvlink)
    assert link_rate(H100, "network") == pytest.approx(r) and 0 < r < 0.2
    s = km.overlap_slowdown.sm * r
    assert overlap_cost(1.0, H100, "sm", "network") == pytest.approx(s / (1 + s))


def _terms(hw, training, model, gpus, **lay):
    est = Estimator(load_model(model), hw, training, gpus)
    L = est.resolve(Layout(**lay))
    st = est.stages(L.stage_layers)[0]
    return est.stage_times(L, st), est.stage_tail(L, st)


@pytest.mark.parametrize("model,gpus,lay,term", [
    ("llama3_70b", 64, dict(tp=8, pp=2), "tp"),
    ("qwen3_30b_a3b", 64, dict(ep=8, micro_batch=1), "ep"),
    ("llama3_8b", 16, dict(tp=2, cp=4), "cp"),
])
def test_each_overlapped_term_pays_on_its_hidden_part(model, gpus, lay, term):
    free = _with_slowdown(H100, 0.0)
    t_free, _ = _terms(free, ON, model, gpus, **lay)
    t_cost, _ = _terms(H100, ON, model, gpus, **lay)
    t_off, _ = _terms(H100, OFF, model, gpus, **lay)
    exposed, total = getattr(t_free, term), getattr(t_off, term)
    assert exposed < total                                      # something hides
    assert getattr(t_cost, term) > exposed                      # and it is not free
    assert getattr(t_cost, term) <= exposed + overlap_cost(total - exposed, H100, "sm") + 1e-12
    # overlap off: nothing hides, nothing to pay
    assert getattr(t_off, term) == pytest.approx(getattr(_terms(free, OFF, model, gpus, **lay)[0], term))


def test_fsdp_traffic_hidden_over_the_network_pays_at_the_network_rate():
    lay = dict(tp=1, fsdp=True, micro_batch=1)
    (_, (dp_free, _)), (_, (dp_cost, _)) = (_terms(hw, ON, "llama3_8b", 16, **lay)
                                            for hw in (_with_slowdown(H100, 0.0), H100))
    (_, (dp_off, _)) = _terms(H100, OFF, "llama3_8b", 16, **lay)
    hidden = dp_off - dp_free
    assert hidden > 0
    # the FSDP group of 16 spans two 8-GPU NVLink domains: its hidden part pays the network-rate slowdown
    assert dp_cost - dp_free == pytest.approx(overlap_cost(hidden, H100, "sm", "network"))
