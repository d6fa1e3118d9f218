"""`autopar profile run` / `autopar profile spec` as a user meets them, and the documented torchrun command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCALE = ["--layers", "2", "--hidden", "32", "--heads", "2", "--kv-heads", "2", "--ffn", "64", "--vocab", "64",
         "--seq-len", "16"]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def autopar(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "autopar.cli.main", *args], capture_output=True, text=True,
                          env=_env(), cwd=cwd)


@pytest.mark.slow
def test_profile_run_json():
    r = autopar("profile", "run", "--model", "llama3_70b", "--gpus", "2", "--pp", "2", *SCALE, "--steps", "3",
                "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["ok"] and d["failure"] is None and len(d["losses"]) == 3 and len(d["peak_mem_gib"]) == 2
    assert d["applied"]["pp"] == 2 and d["applied"]["schedule"] == "1F1B" and d["tokens_per_s"] > 0
    assert "step 3/3" in r.stderr          # progress goes to stderr


@pytest.mark.parametrize("args, needle", [
    (["--model", "llama3_70b", "--gpus", "2", "--tp", "3"], "not divisible by tp (3)"),
    (["--model", "no_such_model", "--gpus", "2"], "unknown model 'no_such_model'"),
    (["--model", "llama3_70b", "--gpus", "2", "--hidden", "65"], "cannot scale llama3_70b"),
    (["--model", "llama3_70b", "--gpus", "1", "--ep", "2"], "expert parallel needs an MoE model"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    r = autopar("profile", "run", *args)
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


@pytest.mark.slow
def test_documented_torchrun_command_runs_a_written_spec(tmp_path):
    r = autopar("profile", "spec", "--model", "llama3_70b", "--gpus", "2", "--tp", "2", *SCALE, "--steps", "2",
                "-o", "spec.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    cmd = r.stdout.strip().splitlines()[-1].split()
    assert cmd[:4] == ["torchrun", "--nproc-per-node", "2", "-m"]
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", *cmd[1:]], cwd=tmp_path, env=_env(),
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-2000:]
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    assert all(x["ok"] for x in ranks) and ranks[0]["applied"]["tp"] == 2 and len(ranks[0]["losses"]) == 2


def test_tiny_moe_says_its_size_and_its_clamped_top_k_within_80_columns():
    """Issue 22 #9 and #6: a tiny MoE printed "0.0B total" and top-8 quietly became top-4 of 4 experts; the
    result lines ran to 342 characters."""
    env = {**_env(), "COLUMNS": "80"}
    r = subprocess.run([sys.executable, "-m", "autopar.cli.main", "profile", "run", "--model", "qwen3_30b_a3b",
                        "--gpus", "2", "--layers", "2", "--hidden", "64", "--ffn", "128", "--heads", "4",
                        "--experts", "4", "--vocab", "512", "--steps", "3", "--warmup", "1"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "0.0B" not in r.stdout and "K total" in r.stdout
    assert "top-4 in the scaled model, not qwen3_30b_a3b's top-8" in " ".join(r.stderr.split())
    lines = r.stdout.splitlines() + r.stderr.splitlines()
    assert lines and max(len(ln) for ln in lines) <= 80, max(lines, key=len)


def test_count_text_units():
    from autopar.specs.model import ModelSpec
    assert [ModelSpec.count_text(n) for n in (70.6e9, 3.04e5, 1.2e8, 45_100, 950.0)] == [
        "70.6B", "304.0K", "120.0M", "45.1K", "950"]
