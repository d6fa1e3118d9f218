"""Error bars (autopar/measure/intervals.py): bands by regime with fallback, intervals and coverage."""

import pytest

from autopar.measure import intervals as iv


def test_band_table_falls_back_to_coarser_regimes(tmp_path):
    reg_a = {"kind": "dense", "generation": "hopper", "stack": "torchtitan"}
    reg_b = {"kind": "MoE", "generation": "blackwell", "stack": "megatron_core"}
    rows = [(reg_a, e) for e in (-0.1, 0.0, 0.05, 0.1, 0.2, 0.3)] + [(reg_b, 0.01), (reg_b, -0.01)]
    path = tmp_path / "bars.yaml"
    iv.write(path, rows, [], "test")
    # reg_a has its own band (6 >= MIN_ROWS); reg_b has 2 rows and takes the all-runs band
    a = iv.throughput_interval(1000.0, reg_a, path)
    b = iv.throughput_interval(1000.0, reg_b, path)
    assert a.regime == "dense, hopper, torchtitan" and a.rows == 6
    assert b.regime == "all runs" and b.rows == 8
    # predicted = measured · (1 + err): the measurement lies in [P / (1 + q_hi), P / (1 + q_lo)]
    lo, hi = iv.quantile_band([e for _, e in rows[:6]])
    assert a.low == pytest.approx(1000 / (1 + round(hi, 4))) and a.high == pytest.approx(1000 / (1 + round(lo, 4)))
    assert a.low < 1000 < a.high


def test_coverage_counts_runs_inside_their_interval(tmp_path):
    reg = {"kind": "dense", "generation": "hopper", "stack": "s"}
    errs = [-0.2, -0.1, 0.0, 0.1, 0.2, 0.3, -0.3, 0.05, -0.05, 0.15]
    path = tmp_path / "bars.yaml"
    iv.write(path, [(reg, e) for e in errs], [], "test")
    runs = [(reg, 100 * (1 + e), 100.0) for e in errs]    # predicted = measured · (1 + err)
    inside, total = iv.coverage(runs, path)
    # conformal levels for n = 10 at 80%: the 1st and 10th order statistics, so every one of the 10 is inside
    assert total == 10 and inside == 10
    lo, hi = iv.quantile_band(sorted(errs) * 3)               # n = 30: the 3rd and 28th of 30
    assert (lo, hi) == (sorted(errs * 3)[2], sorted(errs * 3)[27])


def test_missing_file_is_a_clear_error(tmp_path):
    from autopar.errors import AutoparInputError
    with pytest.raises(AutoparInputError, match="no error bars"):
        iv.throughput_interval(1.0, {"kind": "dense", "generation": "hopper", "stack": "x"}, tmp_path / "none.yaml")


def test_memory_intervals_do_not_cross_stacks(tmp_path):
    tt = {"kind": "dense", "generation": "hopper", "stack": "torchtitan"}
    mc = {"kind": "dense", "generation": "hopper", "stack": "megatron_core"}
    path = tmp_path / "bars.yaml"
    iv.write(path, [(tt, 0.0)] * 6, [(tt, e) for e in (-0.5, -0.2, 0.0, 0.1, 0.2, 0.3)], "test")
    assert iv.memory_interval(50.0, tt, path).regime == "dense, hopper, torchtitan"
    assert iv.memory_interval(50.0, mc, path) is None           # no Megatron-Core run prints memory
    assert iv.throughput_interval(50.0, mc, path).regime == "dense"   # throughput may fall back to the kind
