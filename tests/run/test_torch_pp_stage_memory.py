"""benchmarks/torch_pp_stage_memory.py: refuses clearly without CUDA, and its --smoke path runs both schedules, every
micro-batch's gradient accumulated and reduced (the script asserts it each step)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "torch_pp_stage_memory.py"


def _run(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=600)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_without_cuda_it_refuses_in_one_line(tmp_path):
    r = _run(cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("torch_pp_stage_memory: error: no CUDA device")
    assert r.stderr.count("\n") == 1 and not list(tmp_path.iterdir())


def test_smoke_runs_both_schedules(tmp_path):
    r = _run("--smoke", "--layers", "2", "--out", "rec.json", cwd=tmp_path)
    assert r.returncode == 0 and "failed" not in r.stdout, r.stdout + r.stderr
    recs = json.loads((tmp_path / "rec.json").read_text())
    assert [x["schedule"] for x in recs] == ["1f1b", "interleaved"]
    assert all(x["params_per_gpu"] > 0 and x["microbatches"] == 8 for x in recs)
