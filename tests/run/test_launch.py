"""Failure isolation of run_layout: a crashing, hanging or out-of-memory rank becomes RunResult(ok=False)
quickly, the caller never hangs and no worker process survives. Faults are injected with the test-only
AUTOPAR_PROFILE_FAULT variable ("crash:<rank>", "hang:<rank>", "oom:<rank>")."""

from __future__ import annotations

import os
import time
from pathlib import Path
from unittest import mock

import pytest

from autopar.errors import AutoparInputError, LayoutError
from autopar.run.launch import RunResult, run_layout
from autopar.run.worker import FAULT_ENV
from autopar.specs import Layout, ModelSpec, TrainingSpec

TINY = ModelSpec(name="tiny", num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=2,
                 vocab_size=64)
TR = TrainingSpec(seq_len=16, global_batch=2)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _faulty_run(fault: str, tmp_path: Path, timeout_s: float) -> tuple[RunResult, float]:
    t0 = time.monotonic()
    with mock.patch.dict(os.environ, {FAULT_ENV: fault}):
        res = run_layout(TINY, Layout(pp=2), TR, world=2, steps=2, timeout_s=timeout_s, workdir=tmp_path)
    return res, time.monotonic() - t0


def _assert_no_worker_left(tmp_path: Path) -> None:
    pids = [int(f.read_text()) for f in tmp_path.glob("rank*.pid")]
    assert pids, "workers never started"
    time.sleep(0.2)
    assert not [p for p in pids if _alive(p)], "a worker process survived the run"


@pytest.mark.slow
def test_crashing_rank_is_reported_with_its_error(tmp_path):
    res, _ = _faulty_run("crash:1", tmp_path, timeout_s=120)
    assert not res.ok and res.failure == "crash: RuntimeError: injected crash (test)"
    assert res.step_time_s is None
    _assert_no_worker_left(tmp_path)


@pytest.mark.slow
def test_hanging_rank_times_out_and_every_process_is_killed(tmp_path):
    res, _ = _faulty_run("hang:1", tmp_path, timeout_s=30)     # long enough for both ranks to start under load
    assert not res.ok and res.failure == "timeout"      # how soon after the timeout: a timing, not asserted here
    _assert_no_worker_left(tmp_path)
    assert Path(res.log_path).exists()


@pytest.mark.slow
def test_out_of_memory_is_reported_as_oom(tmp_path):
    res, _ = _faulty_run("oom:0", tmp_path, timeout_s=120)
    assert not res.ok and res.failure == "oom"
    _assert_no_worker_left(tmp_path)


def test_layouts_the_runner_cannot_apply_fail_without_launching():
    moe = ModelSpec.model_validate(dict(TINY.model_dump(), moe=dict(num_experts=2, top_k=1,
                                                                      expert_ffn_hidden_size=32)))
    with mock.patch("subprocess.Popen", side_effect=AssertionError("a process was launched")):
        res = run_layout(moe, Layout(tp=2, sequence_parallel=False), TR, world=2)
    assert not res.ok and res.failure.startswith("unsupported: MoE with tp > 1 needs sequence parallelism")
    assert res.to_dict()["failure"] == res.failure


def test_invalid_input_raises():
    with pytest.raises(LayoutError, match="not divisible by tp"):
        run_layout(TINY, Layout(tp=3), TR, world=3)
    with pytest.raises(AutoparInputError, match="steps"):
        run_layout(TINY, Layout(), TR, world=1, steps=0)


@pytest.mark.slow
def test_a_rank_killed_by_a_signal_is_reported_as_that_signal(tmp_path):
    """Rank 1 SIGKILLs itself; rank 0 then loses its peer ("connection reset"): the cause is the signal."""
    res, _ = _faulty_run("kill:1", tmp_path, timeout_s=120)
    assert not res.ok and res.failure in ("killed by SIGKILL", "oom"), res.failure
    _assert_no_worker_left(tmp_path)


def test_cpu_allocator_failure_is_classified_as_oom():
    from autopar.run.worker import classify
    err = RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                       "you tried to allocate 85899345920 bytes. Error code 12 (Cannot allocate memory)")
    assert classify(err) == "oom"
    assert classify(MemoryError()) == "oom"
    assert classify(ValueError("bad shape")) == "crash: ValueError: bad shape"
