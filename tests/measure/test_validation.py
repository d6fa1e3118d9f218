"""The published-runs validation (autopar/measure/validation.py) and the calibration (autopar/measure/calibration.py)."""

from __future__ import annotations

import dataclasses

import pytest

from autopar.measure import calibration as cal
from autopar.measure.calibrate import BOUNDS, with_constants
from autopar.measure.validation import GROUPINGS, load_cases, validate


@pytest.fixture(scope="module")
def report():
    return validate()


def test_every_published_run_is_predicted_and_fits(report):
    assert len(report.rows) == 104 and not report.skipped
    # Every layout that ran is predicted to fit. The four Megatron-Bridge 26.06 FP8/MXFP8 MoE runs that were 1-4% over
    # HBM before were charged a bf16 weight copy their recipes do not keep: they run fp8_param_gather (FP8 primary
    # weights, the 'knobs' column; autopar/cost/memory.py), which takes 11-38 GiB per GPU off them.
    assert report.predicted_oom == []
    fp8_params = [r for r in report.rows if r.case.row_id.startswith("mb2606") and r.case.training.fp8_param_gather]
    assert len(fp8_params) == 22   # every fp8 / mxfp8 row of the 26.06 recipes, none of the nvfp4 ones


FIRST_SOURCES = ("mlm21", "mcore08", "l3paper", "nemo2407", "moezoo")   # the 50 rows before stacks existed
# Guards on the committed constants (README 'Accuracy': first 50 rows 7.5%, all 104 rows 7.59%, worst row +38.9%),
# about 1 point (the worst row 6 points) above today's figures (all rows tightened from 8.7% on 2026-11-26, when
# gpt-oss's eager clamps and unfused RoPE took the figure from 7.77% to 7.59%). The all-rows guards had been loosened to 17.5% / 0.85
# when issue 20's physics replaced what was fitted to the torchtitan rows; sustained rates by board power, the stacks'
# own kernels, overlap that costs the compute it hides under and the recipes' own switches brought them back.
FIRST_50_GUARD, ALL_ROWS_GUARD, MAX_ROW_GUARD = 0.085, 0.085, 0.45


def test_accuracy_of_the_committed_constants(report):
    # Regression guard on the constants in hardware/*.yaml and stacks/*.yaml (fitted by `autopar validate --fit
    # --write`; README 'Accuracy'). A change to the cost model that loses accuracy must show up here. Issue 20 raised
    # the first 50 rows' guard from 8.00% to 9.5%: overlap priced from its window instead of four fitted fractions,
    # sustained clocks, EP overlap only where the source ran it (the MoE rows carry the rise).
    first = [r for r in report.rows if r.case.row_id.split("-")[0] in FIRST_SOURCES]
    assert len(first) == 50
    assert sum(abs(r.error) for r in first) / len(first) < FIRST_50_GUARD
    assert report.mape < ALL_ROWS_GUARD
    assert report.max_abs_error < MAX_ROW_GUARD


def test_torchtitan_knobs_order_the_runs_as_measured(report):
    # The same layout under eager, compile and compile + Float8 (torchtitan Table 1) and with and without async TP:
    # the stack knobs must put them in the measured order, not tie them.
    pred = {r.case.row_id: r.predicted for r in report.rows}
    t1 = [pred[f"tt2412-l31-8b-h100gt-8-{k}"] for k in ("eager", "compile", "compile-float8")]
    assert t1[0] < t1[1] < t1[2]
    for tag in ("bf16", "tensorwise", "rowwise"):
        assert pred[f"tt2506-l31-70b-h100gt-256-{tag}-tp"] < pred[f"tt2506-l31-70b-h100gt-256-{tag}-asynctp"]


def test_ranking_counts_within_source_pairs(report):
    # Regression guard on the headline ranking (96.6% on the 104 rows: 750 of 776 pairs, 0 predicted ties).
    rk = report.ranking
    n_pairs = sum(n * (n - 1) // 2 for n, _, _ in report.breakdown()["source"].values())
    assert rk.pairs + rk.skipped == n_pairs
    assert rk.share >= 0.9


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
    truth = {"layer_overhead_us": 400.0, "moe_layer_overhead_us": 250.0, "moe_dropless_imbalance": 1.4}
    planted = []
    for c, row in zip(pick, cal.rows_from_cases(pick)):
        predicted = row.predict(with_constants(c.hardware, truth))   # the measurement these constants explain
        planted.append(dataclasses.replace(c, measured_tokens=predicted))
    res = cal.fit(planted)
    assert res.mae_after < 0.01 < res.mae_before
    assert res.constant("layer_overhead_us").after == pytest.approx(400.0, rel=0.1)
    for c in res.constants:
        assert c.bound.lo <= c.after <= c.bound.hi


def test_fit_starts_inside_the_bounds_and_reports_constants_at_a_bound(monkeypatch):
    cases, _ = load_cases()
    pick = cases[:3]
    monkeypatch.setitem(BOUNDS, "layer_overhead_us", (250.0, 250.0, "pinned for the test"))
    res = cal.fit(pick)
    assert res.constant("layer_overhead_us").after == 250.0
    assert "layer_overhead_us" in {c.name for c in res.pinned}


def test_fit_write_refreshes_only_calibrated_files_with_four_significant_digits(tmp_path, capsys):
    """``validate --fit --write --out DIR`` refreshes the calibrated block of the files that carry one, each value to
    four significant digits, and leaves a file without one (the report's accelerator) alone."""
    import yaml

    from autopar.cli.main import main
    from autopar.measure.validation import DEFAULT_CSV
    csv = tmp_path / "runs.csv"
    csv.write_text("".join(DEFAULT_CSV.read_text().splitlines(keepends=True)[:4]))
    out = tmp_path / "hw"
    assert main(["validate", "--csv", str(csv), "--fit", "--write", "--out", str(out)]) == 0
    assert "left report_accel_128 as it is" in capsys.readouterr().out
    assert not (out / "report_accel_128.yaml").exists()
    eff = yaml.safe_load((out / "h100_sxm.yaml").read_text())["efficiency"]
    assert eff and all(float(f"{v:.4g}") == v for v in eff.values())


def test_fit_write_puts_a_stacks_constants_under_out_and_leaves_the_repository_alone(tmp_path, capsys):
    """A stack's own fitted constants (torchtitan's per-layer overhead) are written to DIR/stacks/ under
    ``--out DIR``: the stack file autopar loads is not rewritten (it was, before: a write outside --out)."""
    import yaml

    from autopar.cli.main import main
    from autopar.measure.validation import DEFAULT_CSV
    from autopar.specs.loaders import zoo_dir
    lines = DEFAULT_CSV.read_text().splitlines(keepends=True)
    csv = tmp_path / "runs.csv"
    csv.write_text(lines[0] + "".join(ln for ln in lines[1:] if ln.startswith("tt2412-l31-8b-h100gt-8-")))
    repo_stack = zoo_dir("stacks") / "torchtitan.yaml"
    before = repo_stack.read_bytes()
    out = tmp_path / "hw"
    assert main(["validate", "--csv", str(csv), "--fit", "--write", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.replace("\n", "")     # the console folds long lines at 80 columns
    assert f"wrote stack torchtitan's own constants to {out / 'stacks' / 'torchtitan.yaml'}" in printed
    assert repo_stack.read_bytes() == before
    written = yaml.safe_load((out / "stacks" / "torchtitan.yaml").read_text())
    assert written["name"] == "torchtitan" and "layer_overhead_us" in written["efficiency"]


def test_a_pipeline_split_stated_in_the_notes_prices_the_row(tmp_path):
    # The DeepSeek-V3 B300 row's recipe splits 61 layers over PP8 as 8x7 + 5 (Bridge layout_map[(8, 1)]); the balanced
    # split would be 6/8x6/7. A split that does not cover the model's layers is refused with the row named.
    import csv
    from autopar.measure.validation import DEFAULT_CSV
    with open(DEFAULT_CSV, newline="") as f:
        reader = csv.DictReader(f)
        header, rows = reader.fieldnames, [r for r in reader if r["id"] == "mb2606-dsv3-b300-256-mxfp8"]
    assert len(rows) == 1 and "pipeline split 8/8/8/8/8/8/8/5" in rows[0]["notes"]
    bad = dict(rows[0], id="mb2606-dsv3-b300-bad-split",
               notes=rows[0]["notes"].replace("pipeline split 8/8/8/8/8/8/8/5", "pipeline split 8/8/8/8/8/8/8/6"))
    path = tmp_path / "runs.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        w.writerows([rows[0], bad])
    cases, skipped = load_cases(path)
    assert [c.layout.stage_layers for c in cases] == [(8, 8, 8, 8, 8, 8, 8, 5)]
    assert len(skipped) == 1 and skipped[0][0] == "mb2606-dsv3-b300-bad-split"
    assert "pipeline split 8/8/8/8/8/8/8/6" in skipped[0][1] and "61 layers" in skipped[0][1]
