"""autopar profile compare: Kendall's tau-b, layout parsing, the bounded least-squares fit of the efficiency
constants (a stand-in cost function, then an identifiability check on the real cost model), and an end-to-end
comparison of two tiny layouts run for real."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from autopar.errors import AutoparInputError
from autopar.cli.measure import register_compare
from autopar.measure.calibrate import fit_efficiency, leave_one_out, with_constants
from autopar.measure.record import rank_agreement
from autopar.measure.compare import compare_layouts, format_comparison, parse_layouts
from autopar.specs.hardware import Efficiency, KernelModel
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec


# ---- Kendall's tau-b (scipy's, through record.rank_agreement) ---------------------------------------------
def test_tau_identical_and_reversed():
    a = [0.3, 1.2, 0.9, 4.0, 2.2]
    assert rank_agreement(a, a) == pytest.approx(1.0)
    assert rank_agreement(a, [-x for x in a]) == pytest.approx(-1.0)
    assert rank_agreement(a, [10 * x + 1 for x in a]) == pytest.approx(1.0)  # only the order matters


def test_tau_hand_computed():
    # 6 pairs, one discordant (2 vs 3): (5 - 1) / 6.
    assert rank_agreement([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    # Ties: pair (1,2) tied in a, pair (2,3) tied in b; 4 concordant; tau_b = 4 / sqrt(5 * 5).
    assert rank_agreement([1, 2, 2, 3], [1, 2, 3, 3]) == pytest.approx(0.8)
    assert math.isnan(rank_agreement([1, 1, 1], [1, 2, 3]))
    assert math.isnan(rank_agreement([1.0], [2.0]))


# ---- layouts ---------------------------------------------------------------------------------------------
def test_parse_layouts():
    lays = parse_layouts("tp=2,pp=1; tp=1,pp=2,mbs=2 ;zero=3,fsdp=true,rc=mlp+layernorm,sp=false")
    assert lays[0] == Layout(tp=2, pp=1)
    assert lays[1] == Layout(pp=2, micro_batch=2)
    assert lays[2].fsdp and lays[2].zero_stage == 3 and lays[2].recompute == "layernorm,mlp"
    for bad in ("tq=2", "tp", "tp=two", ""):
        with pytest.raises(AutoparInputError):
            parse_layouts(bad)


# ---- the fit on a stand-in cost function ----------------------------------------------------------------
@dataclass
class Row:
    model: object
    training: TrainingSpec
    layout: Layout
    gpus: int
    measured: float | None
    label: str = "row"


def standin(model, hardware, training, layout, gpus):
    """A small cost function with the shape of the real one: compute / gemm, TP traffic / nvlink, stage-to-stage
    sends / nvlink exposed (1 - pp_overlap), a per-layer overhead on each stage's layers, a pipeline bubble, an
    hbm-bound optimizer step."""
    e, km = hardware.efficiency, hardware.kernel_model
    shards = layout.tp * layout.pp
    compute = (1.0 + 0.3 * (layout.recompute == "full")) / shards / km.gemm["bf16"]
    tp = 0.3 * (layout.tp - 1) / layout.tp / km.nvlink
    p2p = 0.1 * (layout.pp - 1) / km.nvlink * (1 - e.pp_overlap)
    over = 4.0 / layout.pp * e.layer_overhead_us * 1e-4
    bubble = (layout.pp - 1) / (4 * layout.micro_batch) * compute
    opt = 0.05 / shards / km.hbm
    return SimpleNamespace(step_time_s=compute + tp + p2p + over + bubble + opt)


LAYOUTS = [Layout(tp=1), Layout(tp=2), Layout(tp=4), Layout(pp=2), Layout(pp=2, micro_batch=2),
           Layout(tp=2, recompute="full"), Layout(tp=4, pp=2), Layout(pp=4, micro_batch=4)]


def _rows(cost, hw, truth):
    hw_true = with_constants(hw, truth)
    tr = TrainingSpec(seq_len=128, global_batch=16)
    return [Row(None, tr, lay, 8, cost(None, hw_true, tr, lay, 8).step_time_s) for lay in LAYOUTS]


def test_fit_recovers_standin_constants():
    # start from the uncalibrated defaults (the zoo file carries constants fitted to published runs)
    hw = load_hardware("h100_sxm").model_copy(update={"efficiency": Efficiency(), "kernel_model": KernelModel()})
    truth = {"gemm[bf16]": 0.37, "nvlink": 0.55, "pp_overlap": 0.25, "layer_overhead_us": 400.0, "hbm": 0.7}
    fitted, rep = fit_efficiency(hw, _rows(standin, hw, truth), estimator=standin)
    for name, value in truth.items():
        assert rep.constant(name).after == pytest.approx(value, rel=5e-3), name
    # The stand-in ignores this: reported, left unchanged.
    assert set(rep.not_identifiable) == {"scaleout"}
    assert fitted.kernel_model.scaleout == hw.kernel_model.scaleout
    assert fitted.kernel_model.gemm["bf16"] == pytest.approx(0.37, abs=2e-3)
    assert rep.rms_log_err_after < 1e-4 < rep.rms_log_err_before
    assert rep.tau_after == pytest.approx(1.0)
    assert "gemm[bf16]" in rep.format()


def test_fit_reports_constants_it_cannot_separate():
    # Only the sends / (nvlink / (1 - pp_overlap)) are observable: the fit must say the two trade off.
    def confounded(model, hardware, training, layout, gpus):
        e, km = hardware.efficiency, hardware.kernel_model
        p2p = 0.3 * (layout.pp - 1) / km.nvlink * (1 - e.pp_overlap)
        return SimpleNamespace(step_time_s=1 / (layout.tp * layout.pp) / km.gemm["bf16"] + p2p)

    hw = load_hardware("h100_sxm")
    fitted, rep = fit_efficiency(hw, _rows(confounded, hw, {"nvlink": 0.55, "pp_overlap": 0.25}),
                                 estimator=confounded)
    assert any("nvlink, pp_overlap" in n for n in rep.notes), rep.notes
    e, km = fitted.efficiency, fitted.kernel_model
    assert km.nvlink / (1 - e.pp_overlap) == pytest.approx(0.55 / 0.75, rel=1e-3)  # the combination is right


def test_fit_respects_bounds():
    # Measurements 3x faster than any constants in range allow: gemm must stop at its bound of 1.0.
    hw = load_hardware("h100_sxm")
    rows = _rows(standin, hw, {"gemm[bf16]": 1.0, "nvlink": 1.0, "hbm": 1.0, "layer_overhead_us": 0.0})
    rows = [Row(r.model, r.training, r.layout, r.gpus, r.measured / 3) for r in rows]
    fitted, rep = fit_efficiency(hw, rows, estimator=standin)
    e, km = fitted.efficiency, fitted.kernel_model
    assert km.gemm["bf16"] == pytest.approx(1.0) and 0 < km.nvlink <= 1 and 0 <= e.pp_overlap <= 1
    # ... and the report says so, with the bound and its reason.
    assert rep.constant("gemm[bf16]").pinned == "upper"
    text = rep.format()
    assert "gemm[bf16]" in text and "PINNED at its upper bound" in text and "[0.15, 1]" in text


def test_fit_needs_two_measured_rows():
    hw = load_hardware("h100_sxm")
    rows = _rows(standin, hw, {})[:2]
    rows[1] = Row(None, rows[1].training, rows[1].layout, 8, None)  # a failed run
    with pytest.raises(AutoparInputError, match="at least 2"):
        fit_efficiency(hw, rows, estimator=standin)


def test_leave_one_out_is_exact_on_noise_free_data():
    hw = load_hardware("h100_sxm").model_copy(update={"efficiency": Efficiency(), "kernel_model": KernelModel()})
    rows = _rows(standin, hw, {"gemm[bf16]": 0.5, "nvlink": 0.6, "pp_overlap": 0.1, "layer_overhead_us": 300.0,
                               "hbm": 0.6})
    loo = leave_one_out(hw, rows, estimator=standin)
    assert rank_agreement(loo, [r.measured for r in rows]) == pytest.approx(1.0)


# ---- identifiability on the real cost model ---------------------------------------------------------------
def test_fit_recovers_constants_from_the_real_cost_model():
    from autopar.cost import estimate
    model = ModelSpec(name="small", num_layers=8, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16,
                      num_kv_heads=4, vocab_size=32000)
    hw = load_hardware("h100_sxm")
    tr = TrainingSpec(seq_len=2048, global_batch=64)
    truth = {"gemm[bf16]": 0.42, "nvlink": 0.55, "scaleout": 0.35, "hbm": 0.6, "layer_overhead_us": 300.0}
    hw_true = with_constants(hw, truth)
    layouts = [Layout(tp=1), Layout(tp=2), Layout(tp=4), Layout(tp=8), Layout(tp=2, pp=2),
               Layout(pp=4, micro_batch=2), Layout(tp=2, cp=2), Layout(tp=4, fsdp=True),
               Layout(tp=8, recompute="full"), Layout(zero_stage=0), Layout(tp=2, pp=2, vpp=2)]
    rows = [Row(model, tr, lay, 16, estimate(model, hw_true, tr, lay, 16).step_time_s) for lay in layouts]
    fitted, rep = fit_efficiency(hw, rows)
    for name, value in truth.items():
        assert rep.constant(name).after == pytest.approx(value, rel=1e-2), (name, rep.format())
    assert "pp_overlap" not in rep.not_identifiable  # two pipelined layouts send between stages
    assert rep.rms_log_err_after < 1e-4


# ---- compare ---------------------------------------------------------------------------------------------
def _tiny():
    model = ModelSpec(name="tiny", num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                      num_kv_heads=2, vocab_size=256)
    return model, TrainingSpec(seq_len=32, global_batch=4)


def test_compare_with_a_fake_runner_builds_rows_and_table():
    model, tr = _tiny()
    hw = load_hardware("h100_sxm")
    calls = []

    def runner(model, layout, training, *, world, steps, timeout_s):
        calls.append(layout)
        ok = layout.tp == 1
        return SimpleNamespace(ok=ok, failure="" if ok else "boom", step_time_s=0.5 if ok else None,
                               tokens_per_s=256.0, peak_mem_gib=[0.2, 0.3], losses=[], applied={}, wall_s=1.0)

    rows = compare_layouts(model, hw, tr, [Layout(tp=1), Layout(tp=2)], world=2, steps=2, timeout_s=30,
                           runner=runner, progress=lambda m: None)
    assert [r.ok for r in rows] == [True, False] and calls[0].dp == 2
    assert rows[0].measured_mem_gib == 0.3 and rows[0].error == pytest.approx(rows[0].predicted / 0.5 - 1)
    text = format_comparison(rows)
    assert "FAILED: boom" in text and "TP1" in text
    with pytest.raises(AutoparInputError, match="layout 1"):
        compare_layouts(model, hw, tr, [Layout(tp=3)], world=2, steps=2, timeout_s=30, runner=runner,
                        progress=lambda m: None)


def test_repeats_alternate_the_order_and_keep_the_fastest_run():
    model, tr = _tiny()
    hw = load_hardware("h100_sxm")
    seen = []

    def runner(model, layout, training, *, world, steps, timeout_s):
        seen.append(layout.micro_batch)
        t = {1: [0.9, 0.6], 2: [0.5, 0.8]}[layout.micro_batch][sum(m == layout.micro_batch for m in seen) - 1]
        return SimpleNamespace(ok=True, failure=None, step_time_s=t, tokens_per_s=1.0, peak_mem_gib=[t],
                               losses=[], applied={}, wall_s=1.0)

    rows = compare_layouts(model, hw, tr, [Layout(micro_batch=1), Layout(micro_batch=2)], world=2, steps=2,
                           timeout_s=30, repeats=2, runner=runner, progress=lambda m: None)
    assert seen == [1, 2, 2, 1]
    assert [r.measured for r in rows] == [0.6, 0.5] and rows[0].measured_mem_gib == 0.6


def test_layouts_from_solve_are_the_solvers_top_k():
    from autopar.measure.compare import layouts_from_solve
    model, tr = _tiny()
    lays = layouts_from_solve(model, load_hardware("h100_sxm"), tr, 2, 3)
    assert 1 <= len(lays) <= 3 and all(lay.world == 2 for lay in lays)


def test_compare_cli_refuses_to_overwrite(tmp_path):
    out = tmp_path / "cal.yaml"
    out.write_text("mine\n")
    parser = argparse.ArgumentParser()
    register_compare(parser.add_subparsers())
    args = parser.parse_args(["compare", "--model", "llama3_8b", "--hardware", "h100_sxm", "--layouts", "tp=1",
                              "--out", str(out)])
    with pytest.raises(AutoparInputError, match="--force"):
        args.func(args)
    assert out.read_text() == "mine\n"


@pytest.mark.slow
def test_compare_two_tiny_layouts_end_to_end():
    launch = pytest.importorskip("autopar.run.launch")
    if not hasattr(launch, "run_layout"):
        pytest.skip("run_layout not written yet")
    model, tr = _tiny()
    hw = load_hardware("h100_sxm")
    rows = compare_layouts(model, hw, tr, [Layout(tp=1), Layout(tp=2)], world=2, steps=2, timeout_s=120,
                           progress=lambda m: None)
    assert all(r.ok for r in rows), [r.failure for r in rows]
    assert all(r.measured > 0 and r.predicted > 0 for r in rows)
    assert all(r.measured_mem_gib is None or r.measured_mem_gib > 0 for r in rows)
    fitted, rep = fit_efficiency(hw, rows)
    assert rep.mae_after <= rep.mae_before + 1e-9
