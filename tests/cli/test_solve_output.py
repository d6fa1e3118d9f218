"""`autopar solve` as a person reads it: the answer first, 80 columns, time and cost to train, GPU-count ranges."""

import json
import os
import subprocess
import sys

import pytest

BASE = ["solve", "--model", "llama3_8b", "--mbs", "1,2", "--vpp", "1", "--time-limit", "5", "--top-k", "3"]


def run(*args, columns=80):
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run([sys.executable, "-m", "autopar.cli.main", *args], capture_output=True, text=True, env=env)


def test_80_columns_answer_first():
    r = run(*BASE, "--gpus", "16", "--tokens", "1T", "--gpu-hour-price", "2", "--emit", "megatron")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    table_lines = [ln for ln in lines if ln[:1] in "┏┃┡│└"]
    assert table_lines and all(len(ln) <= 80 for ln in table_lines)
    text = r.stdout
    assert text.index("Best layout:") < text.index("megatron settings") < text.index("Fastest layouts")
    assert "days on 16 GPUs" in text and "GPU-hours" in text and "per GPU-hour" in text
    assert "headroom" in text.split("Fastest layouts")[0]
    assert "rule:" not in text and "--explain" in text
    assert "not shown at 80 columns" in text             # compact columns, and it says which


def test_explain_adds_the_reasoning_and_breakdown():
    r = run(*BASE, "--gpus", "16", "--explain", columns=120)
    assert r.returncode == 0, r.stderr
    assert "rule:" in r.stdout and "Best layout in detail" in r.stdout and "Memory per GPU" in r.stdout


def test_tokens_json_budget():
    r = run(*BASE, "--gpus", "16", "--tokens", "15T", "--gpu-hour-price", "3", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["schema_version"] >= 1 and d["gpus"] == 16
    for p in d["plans"]:
        e, b = p["estimate"], p["budget"]
        assert b["days"] == pytest.approx(15e12 / (e["tokens_per_s_per_gpu"] * 16) / 86400)
        assert b["cost"] == pytest.approx(3 * b["gpu_hours"])


@pytest.mark.parametrize("objective", ["time", "cost"])
def test_gpu_range_picks_by_objective(objective):
    r = run(*BASE, "--gpus", "8-32", "--objective", objective, "--tokens", "1T", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    sweep = [s for s in d["gpu_sweep"] if s["fits"]]
    assert [s["gpus"] for s in d["gpu_sweep"]] == [8, 16, 32] and sweep
    if objective == "cost":
        assert d["gpus"] == min(sweep, key=lambda s: s["gpu_hours_per_1e12_tokens"])["gpus"]
    else:
        # time to train on N GPUs ∝ 1 / (tokens/s/GPU · N) ∝ GPU-hours / N
        assert d["gpus"] == min(sweep, key=lambda s: s["gpu_hours_per_1e12_tokens"] / s["gpus"])["gpus"]


@pytest.mark.parametrize("args, needle", [
    (["--gpus", "16", "--tokens", "lots"], "--tokens"),
    (["--gpus", "32-8"], "--gpus"),
    (["--gpus", "16", "--tokens", "1T", "--gpu-hour-price", "-1"], "--gpu-hour-price"),
])
def test_bad_budget_input(args, needle):
    r = run(*BASE, *args)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_offload_for_megatron_leaves_full_recompute_out_of_the_search():
    r = run(*BASE, "--gpus", "8", "--offload-activations", "0.5", "--emit", "megatron", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["plans"] and all(p["estimate"]["layout"]["recompute"] != "full" for p in d["plans"])
    assert any("full recompute left out" in n for n in d["notes"])
    r = run(*BASE, "--gpus", "8", "--offload-activations", "0.5", "--emit", "bridge", "--recompute", "full")
    assert r.returncode == 2 and "full recompute" in r.stderr


def test_tokens_without_price_at_80_columns_does_not_crash():
    """Issue 22 #1: with --tokens but no price the 'cost' column is absent; dropping optional columns at 80 columns
    raised ValueError ("'cost' is not in list") and exited 70."""
    for gpus in ("512", "256-2048"):      # the range crashed the same way, after the sweep had printed
        r = run("solve", "--model", "llama3_70b", "--gpus", gpus, "--tokens", "15T", "--time-limit", "5")
        assert r.returncode == 0, r.stderr
        assert "Fastest layouts" in r.stdout and "not shown at 80 columns" in r.stdout
        assert max(len(ln) for ln in r.stdout.splitlines()) <= 80


def test_fitted_table_falls_back_to_records():
    """Issue 22 #6: a table whose required columns cannot fit prints one record per line, every line within the
    width, with every value still there."""
    from autopar.cli.render import console, fitted_table
    headers = ["name", "a long value column", "another"]
    rows = [["x" * 30, "1" * 40, "2" * 25], ["short", "3", "4"]]
    parts = fitted_table(50, "T", headers, rows, left=("name",))
    c = console(width=50)
    with c.capture() as cap:
        c.print(*parts, sep="\n")
    text = cap.get()
    assert all(len(ln) <= 50 for ln in text.splitlines())
    assert "one record per row" in text and "1" * 40 in text and "2" * 25 in text
