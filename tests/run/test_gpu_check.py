"""benchmarks/gpu_check.py: refuses clearly without CUDA, and its --cpu-smoke path runs end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _run(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, cwd=cwd)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_without_cuda_it_refuses_in_one_line(tmp_path):
    r = _run(cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("gpu_check: error: no CUDA device") and "--cpu-smoke" in r.stderr
    assert r.stderr.count("\n") == 1 and not list(tmp_path.iterdir())


@pytest.mark.slow
def test_cpu_smoke_prints_measured_next_to_predicted(tmp_path):
    r = _run("--cpu-smoke", "--only", "qwen3", "--out", "rec.json", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    for needle in ("step s     predicted", "memory GiB predicted:", "measured:  weights", "loss ", "scheme "):
        assert needle in r.stdout, needle
    (rec,) = json.loads((tmp_path / "rec.json").read_text())
    assert rec["run"]["ok"] and rec["estimate"]["step_time_s"] > 0 and len(rec["run"]["losses"]) == 6
