"""`autopar tune` as a user meets it before any run starts: help, and one-line errors with exit status 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from autopar.tune import tune

from .conftest import CPU_TRAIN, FAST, TINY, BookRunner


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "autopar.cli.main", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_help_lists_tune_and_its_flags():
    top = _cli("--help")
    assert top.returncode == 0 and "tune" in top.stdout
    r = _cli("tune", "--help")
    assert r.returncode == 0
    for flag in ("--top-k", "--trials", "--storage", "--study", "--emit", "--no-scale", "--layers"):
        assert flag in r.stdout


def test_a_study_of_another_model_is_exit_2(tmp_path):
    url = f"sqlite:///{tmp_path / 'other.db'}"
    tune(TINY, "h100_sxm", CPU_TRAIN, 2, FAST, trials=1, storage=url, study="mine", backend="gloo",
         runner=BookRunner(), progress=lambda m: None)
    r = _cli("tune", "--model", "llama3_8b", "--gpus", "2", "--backend", "gloo", "--storage", url, "--study", "mine")
    assert r.returncode == 2, r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("autopar: error")]
    assert len(err) == 1 and "study 'mine' in sqlite:///" in err[0] and "belongs to another problem" in err[0]
    assert "model tiny (study) vs llama3_8b_scaled (here)" in err[0] and "Traceback" not in r.stderr


@pytest.mark.parametrize("args, needle", [
    (["--emit-out", "x.env"], "--emit-out needs --emit"),
    (["--no-scale", "--layers", "2"], "--no-scale cannot go with --layers"),
    (["--model", "no_such_model"], "unknown model 'no_such_model'"),
    (["--zero", "5"], "--zero: ZeRO stages are 0, 1, 2 and 3"),
    (["--steps", "2", "--warmup", "2"], "warmup (2) must be at least 0 and below steps (2)"),
])
def test_bad_flags_are_exit_2(args, needle, tmp_path):
    base = ["tune", "--model", "llama3_8b", "--gpus", "2", "--backend", "gloo"]
    if "--model" in args:
        base = base[:1] + base[3:]
    r = _cli(*base, *args, cwd=tmp_path)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr
