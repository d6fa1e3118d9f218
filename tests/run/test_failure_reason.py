"""launch.failure_reason: which of a failed run's symptoms is its cause (no processes launched)."""

from __future__ import annotations

from autopar.run.launch import failure_reason, rank_exit_codes

RESET = {"ok": False, "failure": "backend: Connection reset by peer", "time": 2.0}
OK = {"ok": True}

# torchrun's failure summary (torch/distributed/elastic/multiprocessing/errors/__init__.py template)
LOG = """[rank 0] step 1/4 0.012s loss 4.85
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
autopar.run.worker FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-24_02:00:01
  host      : box
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 4242)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-24_02:00:01
  host      : box
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4243)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4243
============================================================
"""


def test_exit_codes_are_read_from_torchruns_summary():
    assert rank_exit_codes(LOG) == {0: 1, 1: -9}


def test_a_signal_beats_the_survivors_connection_reset():
    assert failure_reason({0: RESET}, {0: 1, 1: -9}, 2, 1, False, False) == "killed by SIGKILL"


def test_a_sigkill_while_the_oom_killer_struck_is_oom():
    assert failure_reason({0: RESET}, {0: 1, 1: -9}, 2, 1, False, oom_killed=True) == "oom"
    # without a signal from any rank, an OOM kill noticed during the run still says oom
    assert failure_reason({}, {}, 2, 1, False, oom_killed=True) == "oom"


def test_sigterm_sent_by_torchrun_to_survivors_is_not_the_cause():
    assert failure_reason({}, {0: -15, 1: -11}, 2, 1, False, False) == "killed by SIGSEGV"
    assert failure_reason({}, {0: -15}, 2, 1, False, False) == "killed by SIGTERM"


def test_a_ranks_own_exception_beats_signals_and_backend_errors():
    crash = {"ok": False, "failure": "crash: RuntimeError: boom", "time": 3.0}
    assert failure_reason({0: RESET, 1: crash}, {0: 1, 1: 1, 2: -15}, 3, 1, False, False) == crash["failure"]
    oom = {"ok": False, "failure": "oom", "time": 5.0}
    assert failure_reason({0: RESET, 1: oom}, {}, 2, 1, False, False) == "oom"


def test_backend_error_when_nothing_better_is_known_and_timeout_first():
    assert failure_reason({0: RESET, 1: OK}, {0: 1}, 2, 1, False, False) == RESET["failure"]
    assert failure_reason({0: RESET}, {1: -9}, 2, None, True, True) == "timeout"


def test_log_only_failures():
    assert failure_reason({}, {}, 2, 1, False, False, "RuntimeError: DefaultCPUAllocator: can't allocate memory: "
                          "you tried to allocate 8 bytes") == "oom"
    assert failure_reason({}, {}, 2, 1, False, False, "ValueError: nope") == "crash: ValueError: nope"
    assert failure_reason({0: OK, 1: OK}, {}, 2, 0, False, False) is None
