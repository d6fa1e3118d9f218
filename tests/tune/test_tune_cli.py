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


def _tune_cli(monkeypatch, capsys, tmp_path, *extra, columns=80):
    """`autopar tune` in-process with the bookkeeping runner (the real runs are tested in test_tune_workers.py)."""
    import autopar.tune as T
    from autopar.cli.main import main
    real = T.tune
    monkeypatch.setattr(T, "tune", lambda *a, **kw: real(*a, **{**kw, "runner": BookRunner()}))
    monkeypatch.setenv("COLUMNS", str(columns))
    rc = main(["tune", "--model", "llama3_8b", "--gpus", "2", "--backend", "gloo", "--trials", "8",
               "--storage", f"sqlite:///{tmp_path / 't.db'}", "--study", "s", *extra])
    return rc, capsys.readouterr()


def test_tune_json_keeps_the_emitted_settings(monkeypatch, capsys, tmp_path):
    """Issue 22 #7: --emit with --json dropped the launcher settings silently."""
    import json
    rc, cap = _tune_cli(monkeypatch, capsys, tmp_path, "--emit", "env", "--json", "--quiet")
    assert rc == 0, cap.err
    d = json.loads(cap.out)
    assert d["emit"]["target"] == "env" and "AUTOPAR_TP=" in d["emit"]["text"]


@pytest.mark.parametrize("columns", [80, 120])
def test_tune_output_fits_the_terminal(monkeypatch, capsys, tmp_path, columns):
    """Issue 22 #6: tune's result lines ran to 219 characters. Every line of stdout and stderr fits COLUMNS."""
    rc, cap = _tune_cli(monkeypatch, capsys, tmp_path, columns=columns)
    assert rc == 0, cap.err
    lines = cap.out.splitlines() + cap.err.splitlines()
    assert "Winning plan" in cap.out and any(ln.startswith("[trial 1/8") for ln in lines)
    assert max(len(ln) for ln in lines) <= columns, max(lines, key=len)
