"""Where a tuning study lives: an Optuna storage opened from a URL, and a lock for file-based storages.

Accepted (``--storage``):

- nothing: the embedded SQLite file ``autopar-tune.db`` in the current directory;
- ``sqlite:///PATH`` (or a bare path ending in ``.db``, ``.sqlite``, ``.sqlite3``);
- ``postgresql://``, ``postgresql+DRIVER://``, ``mysql://``, ``mysql+DRIVER://``: any SQLAlchemy URL that
  Optuna's ``RDBStorage`` takes (several workers on several nodes share one study);
- ``journal:PATH`` (or a bare path ending in ``.log`` / ``.journal``): Optuna's append-only journal file
  (``JournalStorage(JournalFileBackend(PATH))``), for a shared filesystem without a database server;
- ``redis://...``: Optuna's Redis journal (needs the ``redis`` package).

SQLite takes one writer at a time and does not lock rows, so two processes could both take the same queued
trial; workers on one SQLite or journal file therefore serialise their study bookkeeping (creating the study,
taking the next queued trial) with an ``flock`` on ``PATH.autopar-lock`` (not ``PATH.lock``: Optuna's journal
lock takes that name). Database servers take the queued trial
atomically themselves (``SELECT ... FOR UPDATE``).

Faults the storage survives (tests/cli/test_faults.py):

- a journal whose last record was cut (a full disk, a crash mid-write): the cut record is removed after the file
  is copied to ``PATH.autopar-backup-<time>``; a journal damaged anywhere else is refused, never appended to;
- a file that is not an SQLite database: refused before Optuna touches it;
- a worker that dies mid-trial: RDB storages are opened with Optuna's heartbeat (``heartbeat_interval``
  :data:`HEARTBEAT_S`, ``grace_period`` :data:`GRACE_S`) and a stale-trial callback that queues the trial again;
  journals get the same from a heartbeat user attribute (autopar/tune/_study.py).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autopar.errors import AutoparInputError

DEFAULT_DB = "autopar-tune.db"
HEARTBEAT_S = 10      # a running trial's worker records a heartbeat this often (seconds) ...
GRACE_S = 120         # ... and its trial is taken as abandoned when none came for this long (a loaded node's
                      # thread can be late by seconds, not minutes)
_SQLITE_MAGIC = b"SQLite format 3\x00"    # the first 16 bytes of every SQLite 3 database (sqlite.org/fileformat.html)
_RDB_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql", "mariadb", "oracle", "mssql")
_FORMS = ("sqlite:///FILE, postgresql://USER:PASS@HOST/DB, mysql://USER:PASS@HOST/DB, journal:FILE "
          "(a journal file on a shared filesystem) or redis://HOST:PORT")


@dataclass
class StorageTarget:
    """A parsed storage URL: the kind, what to open, the text to show (password hidden) and the lock file."""

    kind: str                 # "rdb" | "journal" | "redis"
    url: str                  # what Optuna opens (for "journal": the file path)
    display: str              # the URL as shown to the user, password masked
    lock_path: Path | None    # flock file serialising the bookkeeping of local workers (file storages)

    @property
    def is_file(self) -> bool:
        return self.lock_path is not None


def mask_url(url: str) -> str:
    """The URL with the password replaced by ``***``."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def parse_storage(url: str | None) -> StorageTarget:
    """Recognise a storage URL (AutoparInputError for an unknown form). Does not connect."""
    if url is None or not str(url).strip():
        path = Path(DEFAULT_DB).resolve()
        return StorageTarget("rdb", f"sqlite:///{path}", f"sqlite:///{DEFAULT_DB}", Path(f"{path}.autopar-lock"))
    text = str(url).strip()
    if text.startswith("journal:"):
        path = Path(text[len("journal:"):].removeprefix("//")).expanduser()
        if not str(path) or str(path) == ".":
            raise AutoparInputError(f"storage '{text}': journal: needs a file path, e.g. journal:./tune.log")
        path = path.resolve()
        return StorageTarget("journal", str(path), f"journal:{path}", Path(f"{path}.autopar-lock"))
    if "://" not in text:
        suffix = Path(text).suffix.lower()
        if suffix in (".db", ".sqlite", ".sqlite3"):
            return parse_storage(f"sqlite:///{Path(text).expanduser().resolve()}")
        if suffix in (".log", ".journal"):
            return parse_storage(f"journal:{text}")
        raise AutoparInputError(f"unknown storage URL '{text}': use {_FORMS}")
    scheme = text.split("://", 1)[0].lower()
    base = scheme.split("+", 1)[0]
    if base in ("redis", "rediss"):
        return StorageTarget("redis", text, mask_url(text), None)
    if base not in _RDB_SCHEMES:
        raise AutoparInputError(f"unknown storage URL '{mask_url(text)}' (scheme '{scheme}'): use {_FORMS}")
    if base == "sqlite":
        rest = text.split("://", 1)[1]
        if not rest.startswith("/") or rest in ("/", "/:memory:"):
            raise AutoparInputError(f"storage '{text}': an SQLite study needs a file, e.g. sqlite:///tune.db "
                                    "(in-memory SQLite cannot be resumed or shared)")
        path = Path(rest[1:]).expanduser()
        path = path.resolve()
        if not path.parent.is_dir():
            raise AutoparInputError(f"storage '{text}': folder {path.parent} does not exist")
        return StorageTarget("rdb", f"sqlite:///{path}", text, Path(f"{path}.autopar-lock"))
    return StorageTarget("rdb", text, mask_url(text), None)


def open_storage(target: StorageTarget, stale_callback: Any = None, heartbeat: tuple[int, int] | None = None,
                 notes: list[str] | None = None) -> Any:
    """The Optuna storage object. AutoparInputError, naming the storage, when it cannot be opened or reached.

    RDB storages get Optuna's heartbeat (``heartbeat``: interval and grace period in seconds, default
    (:data:`HEARTBEAT_S`, :data:`GRACE_S`)) with ``stale_callback`` as the heartbeat-stale trial callback. A cut
    journal is repaired first; what was done is appended to ``notes``."""
    import optuna

    interval, grace = heartbeat or (HEARTBEAT_S, GRACE_S)
    try:
        if target.kind == "journal":
            from optuna.storages.journal import JournalFileBackend, JournalStorage
            path = Path(target.url)
            if not path.parent.is_dir():
                raise AutoparInputError(f"storage '{target.display}': folder {path.parent} does not exist")
            note = repair_journal(path, target.display)
            if note and notes is not None:
                notes.append(note)
            return JournalStorage(JournalFileBackend(str(path)))
        if target.kind == "redis":
            import warnings

            from optuna.storages.journal import JournalRedisBackend, JournalStorage
            with warnings.catch_warnings():   # "experimental" would add two lines to a one-line error
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return JournalStorage(JournalRedisBackend(target.url))
        scheme = target.url.split("://", 1)[0].split("+", 1)[0].lower()
        connect_args: dict[str, Any] = {}
        if scheme == "sqlite":
            check_sqlite_file(Path(target.url.split(":///", 1)[1]), target.display)
            connect_args["timeout"] = 120       # workers wait for each other's short writes
        elif scheme in ("postgresql", "postgres", "mysql", "mariadb"):
            connect_args["connect_timeout"] = 15
        # get_storage wraps it in Optuna's trial cache; the study and the tuner must share that one object
        import warnings
        with warnings.catch_warnings():   # heartbeat_interval is "experimental" in Optuna 5
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            rdb = optuna.storages.RDBStorage(target.url, engine_kwargs={"connect_args": connect_args},
                                             heartbeat_interval=interval, grace_period=grace,
                                             heartbeat_stale_trial_callback=stale_callback)
        return optuna.storages.get_storage(rdb)
    except AutoparInputError:
        raise
    except (ImportError, ModuleNotFoundError) as err:
        raise AutoparInputError(f"cannot open the study storage {target.display}: a driver is missing ({err}); "
                                "install it (e.g. pip install psycopg2-binary, pymysql or redis)") from None
    except Exception as err:  # sqlalchemy/redis connection errors: one line, no traceback
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise AutoparInputError(f"cannot reach the study storage {target.display}: {type(err).__name__}: "
                                f"{mask_url(first)[:300]}") from None


def check_sqlite_file(path: Path, display: str) -> None:
    """Refuse a file that exists, is not empty and is not an SQLite 3 database (before SQLAlchemy opens it)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_SQLITE_MAGIC))
    except FileNotFoundError:
        return
    except OSError as err:
        raise AutoparInputError(f"cannot open the study storage {display}: {err.strerror or err}") from None
    if head and head != _SQLITE_MAGIC:
        raise AutoparInputError(f"study storage {display}: {path} is not an SQLite database (it does not start "
                                "with the SQLite header); autopar leaves it as it is: choose another --storage")


def repair_journal(path: Path, display: str) -> str | None:
    """Check an Optuna journal file before it is opened: every record one JSON line.

    A last record that is cut (no newline, or not JSON: a full disk or a crash stopped the write) is removed,
    after the whole file is copied to ``PATH.autopar-backup-<UTC time>``; the note returned says so. Optuna would
    otherwise append after the partial line and make the study unreadable for good. A record damaged anywhere
    else cannot be repaired safely: AutoparInputError, and the file is left untouched. Held under Optuna's own
    journal lock, so a worker writing at the same moment finishes its record first."""
    import json
    import shutil
    import time

    from optuna.storages.journal import JournalFileSymlinkLock

    if not path.exists():
        return None
    lock = JournalFileSymlinkLock(str(path))
    lock.acquire()
    try:
        try:
            data = path.read_bytes()
        except OSError as err:
            raise AutoparInputError(f"cannot read the study storage {display}: {err.strerror or err}") from None
        lines = data.split(b"\n")
        tail = lines.pop()                 # the bytes after the last newline: empty in a whole journal
        good = len(data) - len(tail)
        for i, line in enumerate(lines, 1):
            try:
                json.loads(line)
            except ValueError:
                if i < len(lines) or tail:
                    raise AutoparInputError(
                        f"study storage {display}: record {i} of {len(lines) + bool(tail)} is damaged (not JSON) "
                        "and is not the last one; autopar leaves the journal as it is (restore it from a copy, or "
                        "choose another --storage)") from None
                good -= len(line) + 1      # the last complete line is itself cut: drop it too
                tail = line + b"\n"
        if not tail:
            return None
        backup = Path(f"{path}.autopar-backup-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
        try:
            shutil.copy2(path, backup)
            with open(path, "r+b") as f:
                f.truncate(good)
                f.flush()
                os.fsync(f.fileno())
        except OSError as err:
            raise AutoparInputError(f"study storage {display}: its last record is cut and it cannot be repaired "
                                    f"({err.strerror or err}); the journal is left as it is") from None
        return (f"journal {display}: its last record was cut ({len(tail)} bytes, a crash or a full disk during a "
                f"write); removed it. The file as it was is kept in {backup}")
    finally:
        lock.release()


@contextlib.contextmanager
def storage_lock(target: StorageTarget) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the storage's lock file (no-op for database servers)."""
    if target.lock_path is None:
        yield
        return
    import fcntl

    try:
        fd = os.open(target.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise AutoparInputError(f"cannot reach the study storage {target.display}: cannot create its lock file "
                                f"{target.lock_path} ({err.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
