"""A study survives what a machine does to it: a cut or damaged journal, a file that is not a database, a worker
that dies mid-trial on another host (Optuna's RDB heartbeat, or the journal's heartbeat attribute)."""

from __future__ import annotations

import time

import optuna
import pytest

from autopar.errors import AutoparInputError
from autopar.tune import tune
from autopar.tune._result import INTERRUPTED, MEASURED
from autopar.tune._storage import check_sqlite_file, open_storage, parse_storage, repair_journal
from autopar.tune._study import ATTR_HEARTBEAT, retry_stale_trial

from .conftest import CPU_TRAIN, FAST, TINY, BookRunner

HEARTBEAT = (1, 2)     # seconds: beat every second, a trial silent for 2 s is taken over


def _study(url: str, trials: int, study: str = "s"):
    return tune(TINY, "h100_sxm", CPU_TRAIN, 2, FAST, trials=trials, storage=url, study=study, backend="gloo",
                runner=BookRunner(), progress=lambda m: None, heartbeat=HEARTBEAT)


def _journal(tmp_path):
    path = tmp_path / "j.log"
    _study(f"journal:{path}", 2)
    return path, path.read_bytes()


def test_a_whole_journal_is_left_alone(tmp_path):
    path, whole = _journal(tmp_path)
    assert repair_journal(path, "j") is None and path.read_bytes() == whole
    assert not list(tmp_path.glob("*.autopar-backup-*"))


@pytest.mark.parametrize("cut", [1, 7, 40])
def test_a_cut_last_record_is_removed_after_a_backup(tmp_path, cut):
    path, whole = _journal(tmp_path)
    path.write_bytes(whole[:-cut])
    note = repair_journal(path, "j")
    assert note and "last record was cut" in note
    backup, = tmp_path.glob("j.log.autopar-backup-*")
    assert backup.read_bytes() == whole[:-cut]                     # the user's file as it was
    kept = path.read_bytes()
    assert kept.endswith(b"\n") and whole.startswith(kept) and len(kept) < len(whole)
    # the study resumes from the repaired file: every trial finished in what is kept is still there
    res = _study(f"journal:{path}", 3)
    assert sum(r.outcome == MEASURED for r in res.records) == 3


def test_a_damaged_record_before_the_last_is_refused_and_the_file_untouched(tmp_path):
    path, whole = _journal(tmp_path)
    lines = whole.split(b"\n")
    lines[1] = lines[1][:5] + b"\xff garbage"
    damaged = b"\n".join(lines)
    path.write_bytes(damaged)
    with pytest.raises(AutoparInputError, match="record 2 of .* is damaged"):
        repair_journal(path, "j")
    assert path.read_bytes() == damaged and not list(tmp_path.glob("*.autopar-backup-*"))


def test_a_file_that_is_not_sqlite_is_refused_untouched(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"my notes, not a database\n" * 10)
    with pytest.raises(AutoparInputError, match="is not an SQLite database"):
        check_sqlite_file(junk, "sqlite:///junk.db")
    with pytest.raises(AutoparInputError, match="not an SQLite database"):
        open_storage(parse_storage(f"sqlite:///{junk}"))
    assert junk.read_bytes() == b"my notes, not a database\n" * 10
    check_sqlite_file(tmp_path / "new.db", "x")                # a new file is fine
    (tmp_path / "empty.db").write_bytes(b"")
    check_sqlite_file(tmp_path / "empty.db", "x")


def _dead_remote_trial(storage, name: str) -> int:
    """A trial RUNNING for a worker on another host that stopped (no local process to look for)."""
    sid = storage.get_study_id_from_name(name)
    tid = storage.create_new_trial(sid)
    storage.set_trial_user_attr(tid, "worker", "another-host:12345:678")
    return tid


def test_a_dead_workers_trial_is_retried_through_optunas_rdb_heartbeat(tmp_path):
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    _study(url, 2)
    storage = open_storage(parse_storage(url), retry_stale_trial, HEARTBEAT)
    tid = _dead_remote_trial(storage, "s")
    storage.record_heartbeat(tid)
    time.sleep(HEARTBEAT[1] + 1.5)          # its worker beats no more: past the grace period
    res = _study(url, 3)
    assert sum(r.outcome == MEASURED for r in res.records) == 3
    dead = next(r for r in res.records if r.number == storage.get_trial_number_from_id(tid))
    assert dead.state == "FAIL" and dead.outcome == INTERRUPTED and "heartbeat" in dead.reason
    retried = optuna.load_study(study_name="s", storage=url).trials
    assert any(t.user_attrs.get("retry_of") == dead.number for t in retried)
    assert not [t for t in retried if t.state.name in ("RUNNING", "WAITING")]


def test_a_dead_workers_trial_is_retried_through_the_journal_heartbeat(tmp_path):
    url = f"journal:{tmp_path / 'j.log'}"
    _study(url, 2)
    storage = open_storage(parse_storage(url))
    tid = _dead_remote_trial(storage, "s")
    storage.set_trial_user_attr(tid, ATTR_HEARTBEAT, time.time() - 60)   # its last beat a minute ago
    res = _study(url, 3)
    assert sum(r.outcome == MEASURED for r in res.records) == 3
    dead = next(r for r in res.records if r.number == storage.get_trial_number_from_id(tid))
    assert dead.outcome == INTERRUPTED and "no heartbeat for" in dead.reason


def test_a_live_remote_worker_is_waited_for_not_taken_over(tmp_path):
    """The heartbeat's other side: a remote trial that beats is running, not stale (checked once, no waiting)."""
    url = f"journal:{tmp_path / 'j.log'}"
    _study(url, 2)
    storage = open_storage(parse_storage(url))
    tid = _dead_remote_trial(storage, "s")
    storage.set_trial_user_attr(tid, ATTR_HEARTBEAT, time.time() + 3600)   # beats "in the future": alive
    from autopar.tune._study import StudyWorker
    worker = StudyWorker.__new__(StudyWorker)
    worker.storage, worker.study = storage, optuna.load_study(study_name="s", storage=storage)
    worker.study_id, worker.worker, worker.say = storage.get_study_id_from_name("s"), "here:1:1", lambda m: None
    from autopar.tune._study import Settings
    worker.s = Settings(3, heartbeat_s=HEARTBEAT[0], grace_s=HEARTBEAT[1])
    assert worker._requeue_stale() == 0
    assert storage.get_trial(tid).state.name == "RUNNING"
