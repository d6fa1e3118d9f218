"""The one calibration fitter (autopar/measure/calibrate.py) on stand-in predictions: per-(chip, precision)
constants, the bounds table, both losses, leave-one-group-out; the shared record type; the validate adapter's
constant list (ties, inheritance)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from autopar.errors import AutoparInputError
from autopar.measure.calibrate import (BOUNDS, Constant, FitReport, FitRow, FittedConstant, cross_validate, fit,
                                      fitted_by, layout_constants, parse_constant, section_of, with_values)
from autopar.measure.record import Comparison, max_abs_error, mean_abs_error, relative_error
from autopar.specs.hardware import Efficiency, KernelModel
from autopar.specs.loaders import load_hardware

H100 = load_hardware("h100_sxm").model_copy(update={"efficiency": Efficiency(), "kernel_model": KernelModel()})
GB200 = load_hardware("gb200_nvl72").model_copy(update={"efficiency": Efficiency(), "kernel_model": KernelModel()})


def _predict(work: float, comm: float, precision: str):
    """tokens/s of a row: math at the chip's gemm[precision] efficiency plus communication at nvlink's, less the
    share pp_overlap hides."""
    def predict(hw):
        km = hw.kernel_model
        return 1.0 / (work / km.gemm[precision] + comm / km.nvlink * (1 - 0.5 * hw.efficiency.pp_overlap))
    return predict


def _rows(truth: dict[Constant, float]) -> list[FitRow]:
    rows = []
    for i, (hw, prec) in enumerate([(H100, "bf16"), (H100, "fp8"), (GB200, "bf16")] * 3):
        work, comm = 1.0 + 0.5 * i, 0.2 + 0.1 * (i % 4)
        p = _predict(work, comm, prec)
        rows.append(FitRow(label=f"r{i}", hardware=hw, measured=p(with_values(hw, truth)), predict=p,
                           group=f"src{i // 3}"))
    return rows


PER_CHIP = [Constant("gemm", "bf16", ("h100_sxm",)), Constant("gemm", "fp8", ("h100_sxm",)),
            Constant("gemm", "bf16", ("gb200_nvl72",)), Constant("nvlink")]


@pytest.mark.parametrize("loss", ["mae", "log"])
def test_per_chip_constants_are_recovered(loss):
    truth = dict(zip(PER_CHIP, [0.55, 0.42, 0.7, 0.65]))
    rep = fit(_rows(truth), PER_CHIP, loss=loss)
    for c, v in truth.items():
        assert rep.constant(c.name).after == pytest.approx(v, abs=2e-3), rep.format()
    assert rep.mae_after < 1e-4 < rep.mae_before
    assert rep.constant("h100_sxm:gemm[fp8]").rows == 3      # only the fp8 rows move with it
    assert not rep.pinned and "PINNED" not in rep.format()
    # the same rows give the same constants
    assert fit(_rows(truth), PER_CHIP, loss=loss).values == rep.values


def test_a_constant_outside_its_bounds_is_pinned_and_said():
    truth = dict(zip(PER_CHIP, [0.55, 0.42, 0.7, 0.65]))
    rows = _rows(truth)
    for r in rows:                     # 3x faster than any efficiency <= 1 allows
        r.measured *= 3
    rep = fit(rows, PER_CHIP)
    assert {c.name for c in rep.pinned} >= {"h100_sxm:gemm[bf16]", "nvlink"}
    assert all(c.after <= BOUNDS[c.name.split(":")[-1].split("[")[0]].hi + 1e-12 for c in rep.constants)
    text = rep.format()
    assert "PINNED at its upper bound" in text and BOUNDS["nvlink"].why in text


def test_unmoved_constants_are_not_fitted():
    truth = dict(zip(PER_CHIP, [0.55, 0.42, 0.7, 0.65]))
    rep = fit(_rows(truth), PER_CHIP + [Constant("moe_dropless_imbalance")])
    assert "moe_dropless_imbalance" in rep.not_identifiable and "moe_dropless_imbalance" not in {c.name for c in rep.constants}


def test_leave_one_group_out_predicts_each_group_from_the_others():
    truth = dict(zip(PER_CHIP, [0.55, 0.42, 0.7, 0.65]))
    rows = _rows(truth)
    held = cross_validate(rows, PER_CHIP)
    assert set(held.predicted) == {r.label for r in rows} and not held.skipped
    assert all(v < 1e-3 for v in held.by_group(rows).values())   # noise-free: exact out of sample
    # a chip only one group has cannot be predicted out of sample: skipped, and said why
    only = [r for r in rows if r.hardware.name == "h100_sxm"] + [r for r in rows if r.hardware.name == "gb200_nvl72"][:1]
    held = cross_validate(only, PER_CHIP)
    gb = [r.label for r in only if r.hardware.name == "gb200_nvl72"][0]
    assert gb in held.skipped and "gb200_nvl72:gemm[bf16]" in held.skipped[gb]


def test_bad_fit_input_is_an_input_error():
    rows = _rows(dict(zip(PER_CHIP, [0.5, 0.5, 0.5, 0.5])))
    with pytest.raises(AutoparInputError, match="loss"):
        fit(rows, PER_CHIP, loss="l7")
    with pytest.raises(AutoparInputError, match="at least 2"):
        fit(rows[:1], PER_CHIP)
    with pytest.raises(AutoparInputError, match="no bounds"):
        fit(rows, [Constant("warp_speed")])
    with pytest.raises(AutoparInputError, match="no bounds"):
        parse_constant("h100_sxm:warp[bf16]")
    assert parse_constant("h100_sxm:gemm[bf16]") == Constant("gemm", "bf16", ("h100_sxm",))
    assert parse_constant("nvlink").name == "nvlink"


def test_every_bound_is_inside_the_spec_and_explained():
    for name, b in BOUNDS.items():
        assert b.lo < b.hi and len(b.why) > 20, name
        assert set(b.fitted_by) <= {"runs", "layouts"}, name
        model = Efficiency if section_of(name) == "efficiency" else KernelModel
        for v in (b.lo, b.hi):                                  # both bounds are valid spec values
            model.model_validate({**model().model_dump(), name: v if name != "gemm" else {"bf16": v}})


def test_each_fit_takes_the_constants_declared_for_it_in_field_order():
    """The FitBound on a hardware-file field is the one declaration: the fits' lists are read from it."""
    assert fitted_by("runs") == ("layer_overhead_us", "moe_layer_overhead_us", "moe_dropless_imbalance")
    rows = [SimpleNamespace(training=SimpleNamespace(precision=p)) for p in ("fp8", "bf16", "fp8")]
    assert [c.name for c in layout_constants(rows)] == [
        "gemm[bf16]", "gemm[fp8]", "nvlink", "scaleout", "hbm", "pp_overlap", "layer_overhead_us"]
    assert "host_link" in BOUNDS and not BOUNDS["host_link"].fitted_by   # bounded, set only by hand


def test_a_constant_whose_bounds_meet_is_held_and_reported_pinned(monkeypatch):
    truth = dict(zip(PER_CHIP, [0.55, 0.42, 0.7, 0.65]))
    monkeypatch.setitem(BOUNDS, "pp_overlap", (0.25, 0.25, "pinned for the test"))
    rep = fit(_rows(truth), PER_CHIP + [Constant("pp_overlap")])
    assert rep.constant("pp_overlap").after == 0.25 and rep.constant("pp_overlap").pinned


def test_record_errors():
    assert relative_error(110.0, 100.0) == pytest.approx(0.1)
    assert relative_error(None, 1.0) is None and relative_error(1.0, 0.0) is None
    recs = [Comparison(label="a", predicted=1.1, measured=1.0), Comparison(label="b", predicted=0.8, measured=1.0),
            Comparison(label="c", predicted=1.0, measured=None)]
    assert mean_abs_error(recs) == pytest.approx(0.15) and max_abs_error(recs) == pytest.approx(0.2)
    assert math.isnan(mean_abs_error(recs[2:]))
    assert Comparison(label="m", predicted_mem_gib=9.0, measured_mem_gib=10.0).mem_error == pytest.approx(-0.1)


def test_validate_adapter_constants_are_data():
    from autopar.measure.calibration import PER_STACK, SHARED, constants_for, efficiency_for
    from autopar.measure.validation import load_cases
    cases, _ = load_cases()
    names = [c.name for c in constants_for(cases)]
    # shared by every chip and run, then per stack only what no measurement sees (no kernel figure is fitted: the
    # Grand Teton H100's GEMM rates are its hardware file's, not the torchtitan rows')
    assert names[:len(SHARED)] == list(SHARED)
    assert names[len(SHARED):] == [f"torchtitan/{f}" for f in PER_STACK]
    assert PER_STACK == ("layer_overhead_us",)
    assert not any("gemm" in n for n in names)
    per_chip = {c.name: c for c in constants_for(cases, per_chip=("gemm",), shared=())}
    # per (chip, precision) on request; gb300 MXFP8 (one row) shares gb200's constant
    assert per_chip["gb200_nvl72:gemm[mxfp8]"].chips == ("gb200_nvl72", "gb300_nvl72")
    assert "gb300_nvl72:gemm[mxfp8]" not in per_chip
    c = Constant("layer_overhead_us")
    rep = FitReport(loss="mae", constants=[FittedConstant(c.name, 0.0, 123.0, c.bound, 3)], not_identifiable={},
                    labels=[], measured=[], predicted_before=[], predicted_after=[], values={c: 123.0})
    assert efficiency_for(rep, load_hardware("h200")).layer_overhead_us == 123.0


def test_validate_fit_prints_every_constant_with_its_bounds(tmp_path, capsys):
    from autopar.cli.main import main
    from autopar.measure.validation import DEFAULT_CSV
    lines = DEFAULT_CSV.read_text().splitlines()
    h100 = [ln for ln in lines[1:] if ",h100_sxm," in ln and ",bf16," in ln][:8]
    csv = tmp_path / "runs.csv"
    csv.write_text("\n".join([lines[0], *h100]) + "\n")
    assert main(["validate", "--fit", "--csv", str(csv)]) == 0
    out = capsys.readouterr().out
    assert "layer_overhead_us" in out and "bounds" in out and "[0, 3000]" in out
    assert "mean |error|" in out
    # every fitted constant's row shows its bounds; any pinned one is flagged with its reason
    table = [ln for ln in out.splitlines() if ln.strip().startswith(("moe_layer_overhead_us", "layer_overhead_us"))
             and "ended at" not in ln]
    assert len(table) == 2 and all("[" in ln and "]" in ln for ln in table), out
    for ln in table:
        if "PINNED" in ln:
            assert f"{ln.split()[0]} ended at its" in out
