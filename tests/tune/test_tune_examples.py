"""The launcher examples run end to end on this machine (tiny, 1 rank): the Python launcher that embeds
autopar, and the sbatch/torchrun template run without SLURM."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_python_launcher_solves_then_trains_with_the_plan(tmp_path):
    r = subprocess.run([sys.executable, str(EXAMPLES / "launch_with_autopar.py"), "--model", "llama3_8b", "--gpus",
                        "1", "--", sys.executable, "-c",
                        "import json, os; d = json.load(open(os.environ['AUTOPAR_PLAN'])); "
                        "print(os.environ['AUTOPAR_MBS'], d['plan']['estimate']['layout']['micro_batch'], "
                        "'$AUTOPAR_TP')"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    mbs, mbs_in_file, tp = r.stdout.split()
    assert mbs == mbs_in_file and tp == "1"
    assert "model scaled down from llama3_8b" in r.stderr


def test_python_launcher_trains_with_autopars_runner(tmp_path):
    """... and leaves no autopar-launch-* folder in the temp dir (issue 22 #11: the suite left them in /tmp)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    r = subprocess.run([sys.executable, str(EXAMPLES / "launch_with_autopar.py"), "--model", "llama3_8b", "--gpus",
                        "1", "--train-steps", "3"], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert "trained 3 steps: loss" in r.stderr
    assert not list(tmp.glob("autopar-launch-*")) and not list(tmp.glob("autopar-profile-*"))


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("autopar") is None,
                    reason="needs bash and the installed autopar command")
def test_sbatch_template_tunes_then_trains_without_slurm(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(GPUS_PER_NODE="1", TRIALS="2", TRAIN_CMD='echo "TRAIN $AUTOPAR_TP $AUTOPAR_MBS $AUTOPAR_PLAN"')
    r = subprocess.run(["bash", str(EXAMPLES / "tune_then_train.sbatch")], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    plan = json.loads((tmp_path / "autopar-plan-local" / "plan.json").read_text())
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("TRAIN "))
    _, tp, mbs, path = line.split()
    assert int(tp) == plan["plan"]["estimate"]["layout"]["tp"] and int(mbs) == plan["plan"]["estimate"]["layout"][
        "micro_batch"]
    assert Path(path) == tmp_path / "autopar-plan-local" / "plan.json"
    assert "--micro-batch-size" in (tmp_path / "autopar-plan-local" / "megatron.args").read_text()
