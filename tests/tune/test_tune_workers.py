"""Real runs through the command line: two workers sharing one study, and Ctrl-C then resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import optuna
import pytest
import yaml

from .conftest import TINY

pytestmark = pytest.mark.slow


def _model_file(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY.model_dump(mode="json")))
    return str(path)


def _cmd(model, storage, study, trials, gpus=1, *extra):
    return [sys.executable, "-m", "autopar.cli.main", "tune", "--model", model, "--gpus", str(gpus), "--trials",
            str(trials), "--storage", storage, "--study", study, "--steps", "3", "--warmup", "1", "--timeout", "90",
            "--backend", "gloo", *extra]


def _ran(storage, study):
    trials = optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)
    return [t for t in trials if t.user_attrs.get("outcome") in ("measured", "failed")], trials


def test_two_workers_share_one_study_without_duplicated_or_lost_trials(tmp_path):
    storage, model = f"sqlite:///{tmp_path / 'shared.db'}", _model_file(tmp_path)
    procs = [subprocess.Popen(_cmd(model, storage, "shared", 4, 1, "--json"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    ran, trials = _ran(storage, "shared")
    assert len(ran) == 4                                            # none lost, none run twice over the budget
    assert len({t.number for t in ran}) == 4
    assert len({t.user_attrs["layout"] for t in ran}) == 4          # no layout measured twice
    assert not [t for t in trials if t.state.name in ("WAITING", "RUNNING")]
    assert len({t.user_attrs["worker"] for t in ran}) == 2          # both workers took trials
    for out, _ in outs:                                             # each worker reports the whole study
        doc = json.loads(out)
        assert doc["runs"] == 4 and doc["best"] is not None


def test_ctrl_c_stops_cleanly_and_the_same_command_resumes(tmp_path):
    storage, model = f"sqlite:///{tmp_path / 'resume.db'}", _model_file(tmp_path)
    cmd = _cmd(model, storage, "resume", 3)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    seen = []
    for line in p.stderr:                   # wait for the first measurement, then for the second run to start
        seen.append(line)
        if line.startswith("[trial 2/3"):
            break
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, "".join(seen) + err
    assert "autopar tune: interrupted; study 'resume' in " in err and "1 of 3 trial(s) run" in err
    assert "Traceback" not in err
    ran, trials = _ran(storage, "resume")
    first = ran[0]
    assert len(ran) == 1 and [t.user_attrs.get("outcome") for t in trials].count("interrupted") == 1
    r = subprocess.run(cmd + ["--emit", "env"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "resuming, 1 of 3 trial(s) run" in r.stderr
    ran, _ = _ran(storage, "resume")
    assert len(ran) == 3 and ran[0].number == first.number and ran[0].value == first.value
    assert "Predicted (h100_sxm) vs measured (1 rank(s))" in r.stdout and "Winning plan:" in r.stdout
    assert "export AUTOPAR_WORLD=1" in r.stdout
