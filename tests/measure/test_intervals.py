"""Error bars (autopar/measure/intervals.py): bands by regime with fallback, intervals and coverage."""

import pytest

from autopar.measure import intervals as iv


def test_band_table_falls_back_to_coarser_regimes(tmp_path):
    reg_a = {"kind": "dense", "generation": "hopper", "stack": "torchtitan"}
    reg_b = {"kind": "MoE", "generation": "blackwell", "stack": "megatron_core"}
    rows = [(reg_a, e) for e in (-0.1, 0.0, 0.05, 0.1, 0.2, 0.3)] + [(reg_b, 0.01), (reg_b, -0.01)]
    path = tmp_path / "bars.yaml"
    iv.write(path, _runs(rows), [], "test")
    # reg_a has its own band (6 >= MIN_ROWS); reg_b has 2 rows and takes the all-runs band
    a = iv.throughput_interval(1000.0, reg_a, path)
    b = iv.throughput_interval(1000.0, reg_b, path)
    assert a.regime == "dense, hopper, torchtitan" and a.rows == 6
    assert b.regime == "all runs" and b.rows == 8
    # predicted = measured · (1 + err): the measurement lies in [P / (1 + q_hi), P / (1 + q_lo)]
    lo, hi = iv.quantile_band([e for _, e in rows[:6]])
    assert a.low == pytest.approx(1000 / (1 + round(hi, 4))) and a.high == pytest.approx(1000 / (1 + round(lo, 4)))
    assert a.low < 1000 < a.high


def _runs(rows, source=lambda i: f"s{i % 2}"):
    return [iv.HeldOutRun(f"r{i}", source(i), reg, e, 100.0) for i, (reg, e) in enumerate(rows)]


def test_coverage_is_out_of_sample_each_source_against_the_others_band():
    reg = {"kind": "dense", "generation": "hopper", "stack": "s"}
    # source a erred -10..+10%, source b +30..+50%: each run lies inside the band of all runs (its own included),
    # but not inside the band of the other source alone, which is what a new source would meet
    a = [-0.10, -0.05, 0.0, 0.05, 0.10]
    b = [0.30, 0.35, 0.40, 0.45, 0.50]
    runs = [iv.HeldOutRun(f"a{i}", "a", reg, e, 1.0) for i, e in enumerate(a)] + \
           [iv.HeldOutRun(f"b{i}", "b", reg, e, 1.0) for i, e in enumerate(b)]
    lo, hi = iv.quantile_band(a + b)                 # in sample, 8 of the 10 lie inside the band of all ten
    assert sum(lo <= e <= hi for e in a + b) == 8
    assert iv.holdout_coverage(runs) == (0, 10)
    # a third source like the first: a's runs are now inside c's band and c's inside a's
    runs += [iv.HeldOutRun(f"c{i}", "c", reg, e + 0.01, 1.0) for i, e in enumerate(a)]
    inside, total = iv.holdout_coverage(runs)
    assert total == 15 and 6 <= inside <= 10          # b's five stay outside; of a and c the extremes may fall out


def test_the_shipped_bands_cover_their_stated_share_out_of_sample():
    """data/error_bars.yaml: every published run's held-out error is stored, and the leave-one-source-out coverage
    of the bands is within 5 points of the stated 80% (issue 21's target)."""
    from autopar.measure.validation import load_cases
    runs = iv.stored_runs()
    cases, _ = load_cases()
    assert {r.row_id for r in runs} == {c.row_id for c in cases}
    inside, total = iv.holdout_coverage(runs)
    assert total == len(runs) and iv.coverage_within(inside, total), (inside, total)


def test_the_file_keeps_the_runs_and_says_when_the_model_moved(tmp_path):
    reg = {"kind": "dense", "generation": "hopper", "stack": "s"}
    runs = [iv.HeldOutRun(f"r{i}", f"s{i % 3}", reg, e, 100.0 + i) for i, e in
            enumerate([-0.2, -0.1, 0.0, 0.1, 0.2, 0.3, -0.3, 0.05, -0.05, 0.15, 0.02, -0.02])]
    path = tmp_path / "bars.yaml"
    iv.write(path, runs, [], "test")
    assert iv.stored_runs(path) == runs
    doc = iv._table(path)
    assert (doc["coverage"]["inside"], doc["coverage"]["runs"]) == iv.holdout_coverage(runs)
    same = {r.row_id: r.predicted for r in runs}
    assert iv.stale_runs(same, path) == ([], 0.0)
    moved = {**same, "r3": 103 * 1.02, "new": 5.0}    # one prediction moved 2%, one run the file lacks
    ids, worst = iv.stale_runs(moved, path)
    assert set(ids) == {"r3", "new"} and worst == float("inf")
    ids, worst = iv.stale_runs({"r3": 103 * 1.02}, path)
    assert ids == ["r3"] and worst == pytest.approx(0.02)


def test_the_band_is_bias_corrected_and_says_whether_it_holds_the_point(tmp_path):
    reg = {"kind": "dense", "generation": "hopper", "stack": "s"}
    fast = [0.10, 0.15, 0.20, 0.25, 0.30, 0.35]       # the model ran 10-35% fast on every run of the regime
    path = tmp_path / "bars.yaml"
    iv.write(path, [iv.HeldOutRun(f"r{i}", "s", reg, e, 1.0) for i, e in enumerate(fast)], [], "test")
    t = iv.throughput_interval(1000.0, reg, path)
    assert t.high < 1000 and not t.contains_prediction          # the band lies below the point
    assert t.low < t.median < t.high
    assert t.median == pytest.approx(1000 / (1 + round(sum(fast[2:4]) / 2, 4)))
    d = t.to_dict()
    assert d["predicted"] == 1000 and d["contains_prediction"] is False and "bias-corrected" in d["centre"]
    from autopar.cli.common import interval_line
    line = interval_line({"tokens_per_s_per_gpu": d})
    assert "bias-corrected" in line and "lies above: the model runs fast" in line and f"median {t.median:,.0f}" in line


def test_the_band_sits_at_the_weibull_positions():
    # n errors: the 80% band runs from position 0.1 (n + 1) to 0.9 (n + 1) of the sorted errors (expected coverage 80%)
    assert iv.quantile_band(list(range(1, 10))) == (1.0, 9.0)            # n = 9: the 1st and 9th
    assert iv.quantile_band(list(range(1, 20))) == pytest.approx((2.0, 18.0))   # n = 19: the 2nd and 18th
    assert iv.quantile_band(list(range(1, 15))) == pytest.approx((1.5, 13.5))   # n = 14: halfway between


def test_missing_file_is_a_clear_error(tmp_path):
    from autopar.errors import AutoparInputError
    with pytest.raises(AutoparInputError, match="no error bars"):
        iv.throughput_interval(1.0, {"kind": "dense", "generation": "hopper", "stack": "x"}, tmp_path / "none.yaml")


def test_memory_intervals_do_not_cross_stacks(tmp_path):
    tt = {"kind": "dense", "generation": "hopper", "stack": "torchtitan"}
    mc = {"kind": "dense", "generation": "hopper", "stack": "megatron_core"}
    path = tmp_path / "bars.yaml"
    iv.write(path, _runs([(tt, 0.0)] * 6), [(tt, e) for e in (-0.5, -0.2, 0.0, 0.1, 0.2, 0.3)], "test")
    assert iv.memory_interval(50.0, tt, path).regime == "dense, hopper, torchtitan"
    assert iv.memory_interval(50.0, mc, path) is None           # no Megatron-Core run prints memory
    assert iv.throughput_interval(50.0, mc, path).regime == "dense"   # throughput may fall back to the kind


def test_validate_reports_the_out_of_sample_coverage_and_when_the_file_is_stale(capsys, monkeypatch, tmp_path):
    import json

    from autopar.cli.main import main
    assert main(["validate", "--json"]) == 0
    cov = json.loads(capsys.readouterr().out)["interval_coverage"]
    assert (cov["inside"], cov["runs"]) == iv.holdout_coverage(iv.stored_runs())
    assert cov["stated"] == iv.SHARE and "leave-one-source-out" in cov["method"]
    # a file written for another model: every stored prediction 100x today's (no model change comes near that)
    import csv
    rows = list(csv.DictReader(iv.runs_path().open()))
    for r in rows:
        r["predicted"] = str(float(r["predicted"]) * 100.0)
    stale = tmp_path / "bars_runs.csv"
    with stale.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    monkeypatch.setattr(iv, "runs_path", lambda path=None: stale)
    assert main(["validate"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "interval coverage, out of sample" in out
    assert f"{len(rows)} of {len(rows)} runs' predictions moved" in out
    assert "autopar validate --fit --cv --write-intervals" in out


def test_the_memory_margin_is_the_stacks_largest_measured_under_prediction(tmp_path):
    from autopar.defaults import DEFAULT_MEMORY_MARGIN
    from autopar.measure.published_memory import largest_under_prediction, predict_rows
    path = tmp_path / "bars.yaml"
    iv.write(path, [], [], "test", {"tt": {"margin": 0.12, "runs": 6}, "few": {"margin": 0.5, "runs": 2}})
    assert iv.memory_margin("tt", path)[0] == 0.12 and "6 published tt runs" in iv.memory_margin("tt", path)[1]
    assert iv.memory_margin("few", path)[0] == DEFAULT_MEMORY_MARGIN       # too few runs of its own
    assert iv.memory_margin("other", path)[0] == DEFAULT_MEMORY_MARGIN
    # the shipped file's torchtitan margin is what the published peaks say today: with it every one would have fitted
    rows = [r for r in predict_rows() if r.regime["stack"] == "torchtitan"]
    margin, _ = iv.memory_margin("torchtitan")
    assert margin == pytest.approx(largest_under_prediction(rows), abs=1e-4)
    # a plan predicted at P <= HBM (1 - margin) measures P / (1 + error) <= HBM for every one of these runs
    assert all(r.measured_gib <= r.predicted_gib / (1 - margin) * (1 + 1e-3) for r in rows)


def test_a_broken_runs_file_is_one_clear_error(tmp_path):
    from autopar.errors import AutoparInputError
    path = tmp_path / "bars.yaml"
    iv.write(path, [], [], "test")
    iv.runs_path(path).write_text("id,source\nx,y\n")
    with pytest.raises(AutoparInputError, match="not a held-out runs file"):
        iv.stored_runs(path)


def test_coverage_within_counts_whole_runs_and_includes_the_bound():
    """80% +- 5 points: 78 of 104 (75.0%) and 88 of 104 (84.6%) are within, 77 of 104 (74.0%) is not."""
    assert iv.coverage_within(78, 104) and iv.coverage_within(88, 104) and iv.coverage_within(83, 104)
    assert not iv.coverage_within(77, 104) and not iv.coverage_within(89, 104)
