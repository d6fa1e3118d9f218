"""One regression test per class of bad input that once ended in a traceback, a hang or silent nonsense (issue 14).
Each runs the CLI in-process (clirun.run_cli: a 20 s alarm turns a hang into a failure) and checks the outcome."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from autopar.cli.main import build_parser
from autopar.cli.common import search_options
from autopar.specs.bounds import RATE_FLOOR
from autopar.specs.bounds import BOUNDS
from autopar.specs.loaders import zoo_dir

from .clirun import check_promise, run_cli

ROOT = Path(__file__).resolve().parents[2]


def _fails(argv: list[str], *needles: str) -> str:
    o = run_cli(argv)
    check_promise(o)
    assert o.rc == 2, o
    line = o.err_lines[-1]
    for n in needles:
        assert n in line, line
    return line


def _model_file(tmp_path: Path, **changes) -> Path:
    data = yaml.safe_load((zoo_dir("models") / "llama3_8b.yaml").read_text())
    data.update(changes)
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# ---- sizes without an upper bound made the work explode --------------------------------------------------------
def test_huge_gpu_count_is_refused_at_once():
    _fails(["solve", "--model", "llama3_8b", "--gpus", "2147483648"], "--gpus", "1,048,576")


def test_the_gpu_bound_itself_is_solved():
    o = run_cli(["solve", "--model", "llama3_8b", "--gpus", str(BOUNDS["gpus"].limit), "--time-limit", "10",
                 "--json"])
    check_promise(o)
    assert o.rc == 0 and json.loads(o.out)["plans"]


def test_ten_million_layers_in_a_model_file(tmp_path):
    _fails(["estimate", "--model", str(_model_file(tmp_path, num_layers=10_000_000)), "--gpus", "8"],
           "field 'num_layers'", "1,024", "DeepNet")


def test_profile_spec_layers_flag_is_bounded(tmp_path):
    _fails(["profile", "spec", "--model", "llama3_8b", "--gpus", "1", "--layers", "2147483648",
            "-o", str(tmp_path / "s.json")], "--layers", "1,024")


def test_seq_len_of_400_digits():
    _fails(["estimate", "--model", "llama3_8b", "--gpus", "8", "--seq-len", "9" * 400], "--seq-len", "16,777,216")


def test_pin_of_400_digits():
    _fails(["solve", "--model", "llama3_8b", "--gpus", "8", "--tp", "9" * 400], "--tp", "400-digit")


def test_tokens_per_step_bound():
    _fails(["estimate", "--model", "llama3_8b", "--gpus", "8", "--seq-len", "16777216", "--global-batch", "16777216"],
           "seq_len x global_batch")


def test_a_gflops_chip_gives_finite_integer_tables(tmp_path):
    """Once: NaN/overflowing step times cast to int64 in the solver's tables (a RuntimeWarning, then no layout)."""
    hw = yaml.safe_load((zoo_dir("hardware") / "h100_sxm.yaml").read_text())
    path = tmp_path / "slow.yaml"
    hw.update(peak_tflops_bf16=1e-9)                      # below the floor: refused, naming the field
    path.write_text(yaml.safe_dump(hw))
    _fails(["solve", "--model", "llama3_8b", "--gpus", "8", "--hardware", str(path)], "peak_tflops_bf16",
           "greater than or equal to 0.001")
    # the slowest chip accepted (every rate at autopar's RATE_FLOOR) still gives finite tables
    hw.update(peak_tflops_bf16=RATE_FLOOR, hbm_tbps=RATE_FLOOR, nvlink_gbps=RATE_FLOOR, scaleout_gbps=RATE_FLOOR)
    path.write_text(yaml.safe_dump(hw))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)       # "invalid value encountered in cast" fails the run
        o = run_cli(["solve", "--model", "llama3_8b", "--gpus", "8", "--hardware", str(path), "--json",
                     "--time-limit", "10"])
    check_promise(o)
    plans = json.loads(o.out)["plans"]
    assert o.rc == 0 and plans and all(math.isfinite(p["estimate"]["step_time_s"]) for p in plans)


# ---- tracebacks on bad values ------------------------------------------------------------------------------------
@pytest.mark.parametrize("cmd", ["solve", "tune"])
def test_recompute_bogus_is_refused_alike_by_solve_and_tune(cmd):
    _fails([cmd, "--model", "llama3_8b", "--gpus", "1", "--recompute", "bogus"], "--recompute",
           "unknown recompute module 'bogus'")


@pytest.mark.parametrize("cmd", ["solve", "tune"])
@pytest.mark.parametrize("zero, ok", [("0", True), ("0,1,2,3", True), ("4", False), ("-1", False), ("x", False)])
def test_zero_stages_are_checked_alike_by_solve_and_tune(cmd, zero, ok):
    args = build_parser(cmd).parse_args([cmd, "--model", "llama3_8b", "--gpus", "8", "--zero", zero])
    if ok:
        assert search_options(args).zero == [int(z) for z in zero.split(",")]
    else:
        with pytest.raises(Exception, match="--zero"):
            search_options(args)


def test_solve_and_tune_build_the_same_search_options():
    flags = ["--tp", "1,2", "--pp", "2", "--zero", "0,3", "--recompute", "none;core_attn,mlp", "--no-cp", "--no-sp",
             "--max-tp", "4", "--allow-cross-domain", "--time-limit", "7"]
    built = {cmd: search_options(build_parser(cmd).parse_args([cmd, "--model", "m", "--gpus", "8", *flags]))
             for cmd in ("solve", "tune")}
    assert built["solve"] == built["tune"]
    assert built["solve"].cp == [1] and built["solve"].zero == [0, 3] and built["solve"].time_limit_s == 7


def test_300_character_model_name():
    _fails(["estimate", "--model", "x" * 300, "--gpus", "8"], "unknown model", "...")


def test_model_name_with_a_nul_byte():
    _fails(["estimate", "--model", "a\x00b.yaml", "--gpus", "8"], "model file not found")


@pytest.mark.parametrize("suffix, text", [
    (".yaml", "num_layers: " + "[" * 3000 + "]" * 3000 + "\n"),
    (".json", '{"num_layers": ' + "[" * 100_000 + "]" * 100_000 + "}"),
])
def test_deeply_nested_files(tmp_path, suffix, text):
    path = tmp_path / f"deep{suffix}"
    path.write_text(text)
    _fails(["estimate", "--model", str(path), "--gpus", "8"], "nested too deeply")


def test_yaml_complex_key(tmp_path):
    path = tmp_path / "k.yaml"
    path.write_text("? [a, b]\n: 1\nname: x\n")
    _fails(["estimate", "--model", str(path), "--gpus", "8"], "a key must be a plain name, not a list")


def test_qwen3_moe_decoder_sparse_step_zero(tmp_path):
    from specs.test_hf_config import QWEN3_30B_A3B
    folder = tmp_path / "qwen"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(QWEN3_30B_A3B, decoder_sparse_step=0)))
    _fails(["estimate", "--model", str(folder), "--gpus", "8"], "decoder_sparse_step", "at least 1")


@pytest.mark.parametrize("argv", [
    ["solve", "--model", "llama3_8b", "--gpus", "8"],          # rich tables
    ["zoo", "--json"],                                           # print()
])
def test_stdout_closed_early_ends_quietly(argv):
    """`autopar ... | head -1`: once a BrokenPipeError traceback; now no message and status 141 (as SIGPIPE).
    The pipe's reading end is closed before the command starts, so its first write fails, whatever the timing."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", "autopar.cli.main", *argv], stdout=w, stderr=subprocess.PIPE,
                           cwd=ROOT, timeout=120)
    finally:
        os.close(w)
    err = p.stderr.decode()
    assert p.returncode == 141, err
    assert "Traceback" not in err and "Error" not in err, err


# ---- nonsense accepted silently ----------------------------------------------------------------------------------
@pytest.mark.parametrize("cmd", ["solve", "tune"])
@pytest.mark.parametrize("value", ["nan", "-5", "inf", "0", "1e9"])
def test_time_limit_must_be_finite_positive_and_bounded(cmd, value):
    _fails([cmd, "--model", "llama3_8b", "--gpus", "1", "--time-limit", value], "--time-limit", "86,400")


@pytest.mark.parametrize("value", ["nan", "-5", "inf"])
def test_run_timeout_must_be_finite_and_positive(value, tmp_path):
    _fails(["profile", "spec", "--model", "llama3_8b", "--gpus", "1", "--timeout", value,
            "-o", str(tmp_path / "s.json")], "--timeout")


def test_no_command_is_one_line():
    _fails([], "no command given")
    _fails(["profile"], "no subcommand given")


def test_control_characters_stay_on_one_line():
    line = _fails(["solve", "--model", "llama3_8b", "--gpus", "8\x07\x1e"], "--gpus")
    assert "8\\x07\\x1e" in line


# ---- validate --csv with a user's own file -----------------------------------------------------------------------
def _csv(tmp_path: Path, *rows: str) -> Path:
    published = (ROOT / "data" / "published_runs.csv").read_text().splitlines()
    path = tmp_path / "runs.csv"
    path.write_text("\n".join([published[0], *rows]) + "\n")
    return path


# the published header has 28 columns: the 25 of a run, then stack, knobs, memory_gib
GOOD = "mine-ok,me,1,llama3_8b,h100_sxm,8,bf16,4096,64,1,1,1,,,,,,,,none,9000,,,,,,,"


@pytest.mark.parametrize("row, reason", [
    ("mine-short,me,1,llama3_8b,h100_sxm,8", "short row"),
    ("mine-seq0,me,1,llama3_8b,h100_sxm,8,bf16,0,64,1,1,1,,,,,,,,none,9000,,,,,,,", "column 'seq_len' must be at least 1"),
    ("mine-blank,me,1,llama3_8b,h100_sxm,8,bf16,,64,1,1,1,,,,,,,,none,9000,,,,,,,", "column 'seq_len' is empty"),
    ("mine-text,me,1,llama3_8b,h100_sxm,eight,bf16,4096,64,1,1,1,,,,,,,,none,9000,,,,,,,",
     "column 'gpus': expected a whole"),
    ("mine-nan,me,1,llama3_8b,h100_sxm,8,bf16,4096,64,1,1,1,,,,,,,,none,nan,,,,,,,", "positive finite number"),
    ("mine-nomeasure,me,1,llama3_8b,h100_sxm,8,bf16,4096,64,1,1,1,,,,,,,,none,,,,,,,,", "no measured throughput"),
    ("mine-model,me,1,,h100_sxm,8,bf16,4096,64,1,1,1,,,,,,,,none,9000,,,,,,,", "empty model name"),
    ("mine-rc,me,1,llama3_8b,h100_sxm,8,bf16,4096,64,1,1,1,,,,,,,,bogus,9000,,,,,,,", "unknown recompute module"),
    ("mine-long,me,1,llama3_8b,h100_sxm,8,bf16,4096,64,1,1,1,,,,,,,,none,9000,,,,,,,,,,", "the header has"),
])
def test_validate_skips_a_bad_row_with_its_reason_and_validates_the_rest(tmp_path, row, reason):
    o = run_cli(["validate", "--csv", str(_csv(tmp_path, GOOD, row)), "--json"])
    check_promise(o)
    d = json.loads(o.out)
    assert o.rc == 0 and [r["id"] for r in d["rows"]] == ["mine-ok"]
    assert len(d["skipped"]) == 1 and d["skipped"][0][0] == row.split(",")[0] and reason in d["skipped"][0][1], d


def test_validate_reads_a_csv_with_a_byte_order_mark(tmp_path):
    path = _csv(tmp_path, GOOD)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())      # Excel's "CSV UTF-8"
    o = run_cli(["validate", "--csv", str(path), "--json"])
    check_promise(o)
    assert o.rc == 0 and [r["id"] for r in json.loads(o.out)["rows"]] == ["mine-ok"], o.err


def test_validate_refuses_a_file_with_no_usable_row_instead_of_printing_nan(tmp_path):
    _fails(["validate", "--csv", str(_csv(tmp_path))], "no usable row to validate (0 skipped)")
    bad = "mine-model,me,1,no_such_model,h100_sxm,8,bf16,4096,64,1,1,1,,,,,,,,none,9000,,,,,,,"
    _fails(["validate", "--csv", str(_csv(tmp_path, bad))], "no usable row to validate (1 skipped",
           "unknown model 'no_such_model'")


def test_validate_has_a_row_bound_counted_before_any_work(tmp_path):
    from autopar.specs.bounds import limit
    rows = [GOOD.replace("mine-ok", f"r{i}") for i in range(limit("csv_rows") + 1)]
    _fails(["validate", "--csv", str(_csv(tmp_path, *rows))], "more than 10,000 rows")


def test_validate_says_a_repeated_skip_reason_once(tmp_path):
    bad = [f"u{i},me,1,no_such_model,h100_sxm,8,bf16,4096,64,1,1,1,,,,,,,,none,9000,,,,,,," for i in range(500)]
    o = run_cli(["validate", "--csv", str(_csv(tmp_path, GOOD, *bad))])
    check_promise(o)
    skipped = [ln for ln in o.out.splitlines() if ln.startswith("skipped")]
    assert o.rc == 0 and len(skipped) == 1, o.out
    assert "skipped 500 rows (u0, u1, u2 and 497 more): unknown model 'no_such_model'" in skipped[0]


def test_hardware_sizes_that_overflowed_the_solver_are_refused(tmp_path):
    """Once exit 70: hbm_gib 1e30 overflowed the CP-SAT tables; a link at 1e-300 GB/s made step times infinite."""
    hw = yaml.safe_load((zoo_dir("hardware") / "h100_sxm.yaml").read_text())
    for field, value, needle in (("hbm_gib", 1e30, "less than or equal to 1048576"),
                                 ("nvlink_gbps", 1e-300, "greater than or equal to 0.001")):
        path = tmp_path / f"{field}.yaml"
        path.write_text(yaml.safe_dump({**hw, field: value}))
        _fails(["solve", "--model", "llama3_8b", "--gpus", "16", "--hardware", str(path)], field, needle)


def test_validate_broken_files(tmp_path):
    _fails(["validate", "--csv", ""], "--csv: empty path")
    _fails(["validate", "--csv", str(tmp_path)], "a folder")
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"\x00\xff\xfe" * 50)
    _fails(["validate", "--csv", str(binary)], "not UTF-8")
    nul = tmp_path / "nul.csv"
    nul.write_text("id,model\x00\n")
    check_promise(run_cli(["validate", "--csv", str(nul)]))
    _fails(["validate", "--csv", str(_csv(tmp_path)), "--fit"], "no usable row")


# ---- the other input paths -------------------------------------------------------------------------------------
def test_bad_storage_url_is_one_line():
    _fails(["tune", "--model", "llama3_8b", "--gpus", "1", "--storage", "bogus://x"], "unknown storage URL")


def test_storage_without_its_driver_is_one_line():
    _fails(["tune", "--model", "llama3_8b", "--gpus", "1", "--storage", "redis://127.0.0.1:1"],
           "the study storage redis://127.0.0.1:1")   # "cannot open" (no driver) or "cannot reach"


@pytest.mark.parametrize("flag, content", [("--training", "seq_len: [1\n"), ("--layouts-file", "? [a, b]\n: 1\n"),
                                           ("--training", "seq_len: 0\n"), ("--layouts-file", "[[[[[[")])
def test_profile_compare_input_files(tmp_path, flag, content):
    path = tmp_path / "f.yaml"
    path.write_text(content)
    argv = ["profile", "compare", "--model", "llama3_8b", "--hardware", "h100_sxm", "--steps", "0", flag, str(path)]
    if flag == "--training":
        argv += ["--layouts", "tp=1"]
    _fails(argv, str(path))


def test_json_output_is_strict_json_even_for_an_empty_mean():
    from autopar.cli.common import dump_json
    import json
    text = dump_json({"mape": float("nan"), "rows": [], "worst": float("inf"), "ok": 1.5})
    assert json.loads(text) == {"mape": None, "rows": [], "worst": None, "ok": 1.5}


def test_a_sigterm_landing_in_a_weakref_callback_still_terminates():
    """SIGTERM while a weakref callback runs (garbage collection inside a library, as SQLAlchemy's registry during
    `tune`): the handler's Terminated cannot be raised there; Python would print "Exception ignored" with a
    traceback and run on. main()'s unraisable hook delivers the signal again, so the command stops, quietly."""
    import gc
    import signal
    import weakref

    from autopar.cli import main as cli_main
    from autopar.errors import Terminated

    class Thing:
        pass

    old_term = signal.signal(signal.SIGTERM, cli_main._on_sigterm)
    old_hook, sys.unraisablehook = sys.unraisablehook, cli_main._on_unraisable
    try:
        thing = Thing()
        ref = weakref.ref(thing, lambda _: signal.raise_signal(signal.SIGTERM))
        with pytest.raises(Terminated):
            del thing            # the callback runs here; its Terminated goes to the unraisable hook
            gc.collect()
            for t in cli_main._REDELIVERIES:
                t.join()         # the signal is delivered again: the main thread raises it at its next step
            for _ in range(10_000):
                pass
        assert ref() is None
    finally:
        sys.unraisablehook = old_hook
        signal.signal(signal.SIGTERM, old_term)


def test_main_restores_the_collector_and_freezes_nothing_when_called(monkeypatch, capsys):
    """autopar/cli/main.py GC_THRESHOLD0: a command runs with the collector's first generation at 200,000, and the
    thresholds in force before are restored when main() returns; only the program itself (argv None) freezes the
    collector's objects at the end, so a call from Python (tests, a notebook) leaves its collector as it was."""
    import gc

    from autopar.cli import main as cli_main
    seen = []
    real = cli_main.build_parser

    def spy(*a, **k):   # the threshold while the command runs
        seen.append(gc.get_threshold()[0])
        return real(*a, **k)

    monkeypatch.setattr(cli_main, "build_parser", spy)
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    gc.set_threshold(700, *before[1:])
    try:
        assert cli_main.main(["zoo", "models"]) == 0
        assert seen == [cli_main.GC_THRESHOLD0]
        assert gc.get_threshold() == (700, *before[1:]) and gc.get_freeze_count() == frozen
    finally:
        gc.set_threshold(*before)
    capsys.readouterr()
