"""Nothing outlives a killed launcher: SIGKILL the process running run_layout (as `autopar profile run` or
`autopar tune` would be killed) and torchrun, every worker and the temporary run folder must go too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autopar.run import lifetime

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = """
from autopar.run.launch import run_layout
from autopar.specs import Layout, ModelSpec, TrainingSpec
tiny = ModelSpec(name="tiny", num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=2, vocab_size=64)
run_layout(tiny, Layout(pp=2), TrainingSpec(seq_len=16, global_batch=2), world=2, steps=2, timeout_s=600)
"""


def _wait_for(what, limit_s: float, every_s: float = 0.1):
    """Poll ``what()`` until it returns something truthy; None after ``limit_s`` (a bound, not a timing)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(every_s)
    return None


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc and prctl")
def test_sigkill_of_the_launcher_leaves_no_process_and_no_folder(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path), AUTOPAR_PROFILE_FAULT="hang:1",
               PYTHONPATH=str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))
    parent = subprocess.Popen([sys.executable, "-c", LAUNCHER], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        def both_ranks_up():
            for d in tmp_path.glob(f"{lifetime.PREFIX}{parent.pid}-*"):
                if len(lifetime.worker_pids(d)) == 2:
                    return d
            return None
        run_dir = _wait_for(both_ranks_up, limit_s=180)
        assert run_dir is not None, "the workers never started"
        family = lifetime.descendants(parent.pid)      # reaper, torchrun, workers
        workers = lifetime.worker_pids(run_dir)
        assert set(workers) <= set(family) and len(family) >= 4
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    assert _wait_for(lambda: not any(lifetime.alive(p) for p in family), limit_s=60), \
        [p for p in family if lifetime.alive(p)]
    assert _wait_for(lambda: not run_dir.exists(), limit_s=30), "the run folder was left behind"


def test_stale_run_folders_of_dead_launchers_are_swept(tmp_path):
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()                                        # a pid that no longer runs
    stale = tmp_path / f"{lifetime.PREFIX}{done.pid}-abc"
    mine = tmp_path / f"{lifetime.PREFIX}{os.getpid()}-def"
    foreign = tmp_path / f"{lifetime.PREFIX}notmine"
    for d in (stale, mine, foreign):
        d.mkdir()
        (d / "torchrun.log").write_text("x")
    assert lifetime.sweep_stale_run_dirs(tmp_path) == [stale]
    assert not stale.exists() and mine.exists() and foreign.exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl")
def test_a_tied_child_dies_with_its_parent(tmp_path):
    """popen_tied in a middle process; SIGKILL the middle: the grandchild must go at once (PR_SET_PDEATHSIG)."""
    pidfile = tmp_path / "child.pid"
    code = ("import sys, time; from autopar.run.lifetime import popen_tied; "
            f"c = popen_tied([sys.executable, '-c', 'import time; time.sleep(600)']); "
            f"open({str(pidfile)!r}, 'w').write(str(c.pid)); time.sleep(600)")
    middle = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        child = _wait_for(lambda: pidfile.exists() and pidfile.read_text() and int(pidfile.read_text()), 60)
        assert child and lifetime.alive(child)
    finally:
        middle.send_signal(signal.SIGKILL)
        middle.wait()
    assert _wait_for(lambda: not lifetime.alive(child), limit_s=30)
