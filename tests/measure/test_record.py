"""pair_order: the within-group ranking figure `autopar validate` prints next to the mean error."""

import math

from autopar.measure.record import Comparison, pair_order


def rec(p, m):
    return Comparison(label="x", predicted=p, measured=m, quantity="tokens_per_s_per_gpu")


def test_pairs_in_order_are_right_and_reversed_are_wrong():
    rows = [rec(100, 10), rec(200, 20), rec(150, 30)]
    o = pair_order(rows, ["a", "a", "a"])
    # (10,20) right, (10,30) right, (20,30): predicted 200 > 150 but measured 20 < 30: wrong
    assert (o.right, o.pairs, o.ties, o.skipped) == (2, 3, 0, 0)
    assert math.isclose(o.share, 2 / 3)


def test_predicted_tie_counts_as_wrong():
    o = pair_order([rec(100, 10), rec(100, 20)], ["a", "a"])
    assert (o.right, o.pairs, o.ties) == (0, 1, 1)


def test_only_pairs_within_a_group_and_measured_ties_left_out():
    rows = [rec(100, 10), rec(50, 20), rec(1, 10.05)]
    o = pair_order(rows, ["a", "b", "a"])
    # no pair across groups; (10, 10.05) differ by 0.5% < 1%: left out
    assert (o.pairs, o.skipped) == (0, 1)
    assert math.isnan(o.share)
