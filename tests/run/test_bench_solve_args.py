"""benchmarks/bench_solve.py: a bad --headline-runs or --baseline is one error line and status 2, before any solve
runs, and the children's bytecode cache it made in the temporary directory is removed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_solve.py"


@pytest.mark.parametrize("args, what", [(["--headline-only", "--headline-runs", "-3"], "--headline-runs"),
                                        (["--headline-runs", "1001"], "--headline-runs"),
                                        (["--headline-only", "--baseline", "/nonexistent/checkout"], "--baseline")])
def test_a_bad_flag_is_one_error_line(tmp_path, args, what):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("bench_solve.py: error: " + what) and "Traceback" not in r.stderr
    assert not list(tmp_path.iterdir())     # the bytecode cache directory did not outlive the run
