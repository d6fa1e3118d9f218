"""The published-runs validation (autopar/validation.py) and the calibration (autopar/calibration.py)."""

from __future__ import annotations

import dataclasses

import pytest

from autopar import calibration as cal
from autopar.validation import GROUPINGS, load_cases, validate


@pytest.fixture(scope="module")
def report():
    return validate()


def test_every_published_run_is_predicted_and_fits(report):
    assert len(report.rows) == 50 and not report.skipped
    assert report.predicted_oom == []          # every layout that ran must be predicted to fit


def test_accuracy_of_the_committed_constants(report):
    # Regression guard on the constants in hardware/*.yaml (fitted by `autopar validate --fit --write`; README
    # 'Accuracy' gives 8.06%). A change to the cost model that loses accuracy must show up here.
    assert report.mape < 0.09
    assert report.max_abs_error < 0.35


def test_breakdown_covers_every_row_once_per_grouping(report):
    bd = report.breakdown()
    assert set(bd) == set(GROUPINGS)
    for grouping, groups in bd.items():
        assert sum(n for n, _, _ in groups.values()) == len(report.rows), grouping
        for n, mae, bias in groups.values():
            assert mae >= abs(bias) - 1e-12       # |mean| <= mean |.|
    assert {"dense", "MoE"} == set(bd["dense/MoE"])


def test_the_fit_recovers_planted_constants():
    """Measurements made by the cost model itself with known constants: the fit must find them again."""
    cases, _ = load_cases()
    pick = [c for c in cases if c.row_id.startswith(("mcore08", "moezoo-q3-235b-h100-256-seq", "nemo2407-l3"))][:10]
    truth = {"dp_overlap": 0.7, "tp_overlap": 0.5, "ep_overlap": 0.3, "cp_overlap": 0.2,
             "layer_overhead_us": 400.0, "moe_dropless_imbalance": 1.4}
    rows = cal._Rows(pick)
    planted = []
    for i, c in enumerate(pick):
        err = rows.errors(truth, [i])[0]       # predicted / measured - 1 with the row's published measurement
        planted.append(dataclasses.replace(c, measured_tokens=c.measured_tokens * (1 + err)))
    res = cal.fit(planted, sweeps=6)
    assert res.loss_after < 0.01 < res.loss_before
    assert res.shared["layer_overhead_us"] == pytest.approx(400.0, rel=0.1)
    for k, (lo, hi, _) in cal.BOUNDS.items():
        assert lo <= res.shared[k] <= hi


def test_fit_starts_inside_the_bounds_and_reports_constants_at_a_bound(monkeypatch):
    cases, _ = load_cases()
    pick = cases[:3]
    monkeypatch.setitem(cal.BOUNDS, "tp_overlap", (0.25, 0.25, "pinned for the test"))
    res = cal.fit(pick, sweeps=1)
    assert res.shared["tp_overlap"] == 0.25
    assert "tp_overlap" in res.at_bound
