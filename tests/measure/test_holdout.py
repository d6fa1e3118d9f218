"""The out-of-sample check: data/published_runs_holdout.csv, Megatron-Bridge's releases before 26.06 (26.04.01, 26.04,
26.02.01, 26.02, 25.11) and NeMo's long-sequence runs (nemolong-: Llama 3 8B on B200, Llama 2 7B on H100, 4K-1024K
tokens with context parallelism), each row's switches read from its release's recipe (data/
published_runs_holdout_skipped.txt). It is predicted, never fitted."""

from __future__ import annotations

import csv
import shutil

import pytest

from autopar.measure.validation import DEFAULT_CSV, GROUPINGS, HOLDOUT_CSV, is_holdout_csv, load_cases, validate
from autopar.specs.layout import normalize_recompute
from tests.cli.clirun import check_promise, run_cli

BRIDGE = {"mb2604a", "mb2604", "mb2602a", "mb2602", "mb2511"}     # one id prefix per container
SOURCES = BRIDGE | {"nemolong"}
ROWS = 169 + 17
# Regression guard, not a target: measured 13.36% mean |error| (bias +1.9%, 9 layouts predicted over HBM) on
# 2026-11-26 with the model of main 006664c (`autopar validate --csv data/published_runs_holdout.csv`; README
# 'Accuracy'); 13.91% (1 over HBM) once the MoE layer stopped counting the experts' outputs and Transformer Engine's
# loss its fp32 softmax (three rows whose recompute autopar fills then take a lighter policy). Set just above the
# first: a cost-model change that loses accuracy on runs it was never fitted to shows here. Since then (2026-11-26):
# 12.29% on the 169 Bridge rows once gpt-oss's eager clamps and unfused RoPE were priced, and 13.57% on the 186 rows
# with NeMo's 17 long-sequence rows (26.2% among themselves; benchmarks/holdout_breakdown.py).
HOLDOUT_MAE_GUARD = 0.14


@pytest.fixture(scope="module")
def rows() -> list[dict[str, str]]:
    with HOLDOUT_CSV.open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def report():
    return validate(HOLDOUT_CSV)


def test_every_row_is_a_case_with_its_published_layout(rows, report):
    # No silent skipping: every row of the file becomes a case, with the layout, batch, precision and throughput
    # its cells give.
    assert len(rows) == ROWS
    assert report.skipped == []
    cases = {r.case.row_id: r.case for r in report.rows}
    assert sorted(cases) == sorted(row["id"] for row in rows)
    assert {GROUPINGS["source"](c) for c in cases.values()} == SOURCES
    for row in rows:
        c, lay = cases[row["id"]], cases[row["id"]].layout
        cells = tuple(int(row[k]) for k in ("tp", "pp", "cp", "ep", "vpp", "micro_batch"))
        assert (lay.tp, lay.pp, lay.cp, lay.ep, lay.vpp, lay.micro_batch) == cells, row["id"]
        assert lay.tp * lay.pp * lay.cp * lay.dp == c.gpus == int(row["gpus"]), row["id"]
        assert lay.sequence_parallel == (lay.tp > 1), row["id"]
        assert lay.zero_stage == (3 if row["fsdp"] == "1" else 1), row["id"]
        assert (c.training.seq_len, c.training.global_batch, c.training.precision) == (
            int(row["seq_len"]), int(row["global_batch"]), row["precision"]), row["id"]
        assert c.model.name == row["model"] and c.hardware.name == row["system"], row["id"]
        if row["id"].startswith("nemolong-"):   # the page prints NeMo's model TFLOPS/GPU only (its FLOPs formula)
            assert c.measured_from.startswith("TFLOP/s ÷ Megatron-Core formula") and "causal" not in c.measured_from
            assert row["tokens_per_s_per_gpu"] == "" and float(row["model_tflops_per_gpu"]) > 0, row["id"]
        else:
            assert c.measured_from == "tokens/s" and c.measured_tokens == float(row["tokens_per_s_per_gpu"])
        if row["recompute"]:                     # stated by the release's workload config
            assert lay.recompute == normalize_recompute(row["recompute"]), row["id"]
        if "pipeline split" in row["notes"]:     # the recipe's own split, taken as stated
            assert lay.stage_layers is not None and sum(lay.stage_layers) == c.model.num_layers, row["id"]


def test_recipe_switches_reach_the_training_spec(rows, report):
    # The knobs column is what prices a row's recipe: spot-check that it reaches TrainingSpec for every row.
    cases = {r.case.row_id: r.case for r in report.rows}
    for row in rows:
        t = cases[row["id"]].training
        knobs = dict(k.split("=") for k in row["knobs"].split(",") if k)
        assert t.fp8_param_gather == (knobs.get("fp8_param_gather") == "on"), row["id"]
        if "ep_overlap" in knobs:
            assert t.ep_comm_overlap == (knobs["ep_overlap"] == "on"), row["id"]
        if "tp_overlap" in knobs:
            assert t.tp_comm_overlap == (knobs["tp_overlap"] != "none"), row["id"]
        if "cuda_graphs" in knobs:
            assert t.cuda_graphs == knobs["cuda_graphs"], row["id"]
        # every Bridge release's perf overrides set Transformer Engine's cross entropy (tools/gen_holdout_runs.py)
        if row["id"].split("-")[0] in BRIDGE:
            assert knobs["cross_entropy"] == "te" and t.cross_entropy == "te", row["id"]


def test_long_sequence_rows_are_the_pages_layouts(rows, report):
    # NeMo's long-sequence tables: one row per stated layout (the 'With CP' columns), 8 on B200 and 9 on H100, the
    # global batch the page's 'Batch Size' (4,194,304 tokens a step on every row), TP overlap off as both releases'
    # recipes set it, and the throughput converted with NeMo's (non-causal) FLOPs formula.
    long = {r.case.row_id: r for r in report.rows if r.case.row_id.startswith("nemolong-")}
    assert len([k for k in long if "-b200-" in k]) == 8 and len([k for k in long if "-h100-" in k]) == 9
    for row in (r for r in rows if r["id"] in long):
        c = long[row["id"]].case
        assert c.training.seq_len * c.training.global_batch == 4 * 1024 ** 2, row["id"]
        assert c.training.tp_comm_overlap is False, row["id"]
        assert row["id"].endswith(f"-cp{c.layout.cp}") and f"-{c.training.seq_len // 1024}k-" in row["id"]
    # 128K on B200: 1,588 TFLOPS/GPU / (NeMo's llama3 FLOPs per token at s = 131,072) = 6,322 tokens/s/GPU
    assert round(long["nemolong-l3-8b-b200-128k-cp4"].measured) == 6322


def test_hold_out_is_apart_from_the_fitted_runs(rows):
    fitted, _ = load_cases(DEFAULT_CSV)
    assert not {c.row_id for c in fitted} & {row["id"] for row in rows}
    assert not {c.row_id.split("-")[0] for c in fitted} & SOURCES
    assert is_holdout_csv(HOLDOUT_CSV) and not is_holdout_csv(DEFAULT_CSV)


def test_no_fit_reads_the_hold_out(tmp_path):
    # The fit (and so --write and --write-intervals) refuses the file, and a copy of it, with one error line.
    copy = tmp_path / HOLDOUT_CSV.name
    shutil.copy(HOLDOUT_CSV, copy)
    for path in (HOLDOUT_CSV, copy):
        for extra in ([], ["--cv", "--write-intervals"]):
            o = run_cli(["validate", "--fit", *extra, "--csv", str(path)])
            check_promise(o)
            assert o.rc == 2 and "out-of-sample" in o.err and "--fit" in o.err


def test_accuracy_out_of_sample(report):
    assert report.mape < HOLDOUT_MAE_GUARD


def test_layouts_that_ran_fit_where_their_memory_is_counted(report):
    # Regression guard (issue 20: "0 published layouts predicted not to fit"): 9 of these runs were predicted over
    # HBM while the MoE layer counted the experts' outputs and Transformer Engine's in-place loss an fp32 softmax
    # (DeepSeek-V3 on GB300/GB200, gpt-oss-120b on B200); the one left is a Llama 3 70B NVFP4 row on GB300 that the
    # page prints at TP 1, PP 1 without FSDP on 64 GPUs, a layout no config of its release has (recipe n/f).
    assert report.predicted_oom == ["mb2602a-l3-70b-gb300-64-nvfp4"]


def test_validating_the_hold_out_does_not_call_the_bands_stale():
    """The bands of data/error_bars.yaml were built from published_runs.csv: the hold-out's runs are not new to them,
    so `validate --csv` on the hold-out prints their coverage without the "regenerate them" note (it named all 169
    runs as moved, by up to 999%)."""
    o = run_cli(["validate", "--csv", str(HOLDOUT_CSV)])
    check_promise(o)
    text = " ".join(o.out.split())   # the table wraps at the terminal's width
    assert o.rc == 0 and "interval coverage" in text and "regenerate them" not in text
