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


def open_storage(target: StorageTarget) -> Any:
    """The Optuna storage object. AutoparInputError, naming the storage, when it cannot be opened or reached."""
    import optuna

    try:
        if target.kind == "journal":
            from optuna.storages.journal import JournalFileBackend, JournalStorage
            path = Path(target.url)
            if not path.parent.is_dir():
                raise AutoparInputError(f"storage '{target.display}': folder {path.parent} does not exist")
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
            connect_args["timeout"] = 120       # workers wait for each other's short writes
        elif scheme in ("postgresql", "postgres", "mysql", "mariadb"):
            connect_args["connect_timeout"] = 15
        # get_storage wraps it in Optuna's trial cache; the study and the tuner must share that one object
        return optuna.storages.get_storage(
            optuna.storages.RDBStorage(target.url, engine_kwargs={"connect_args": connect_args}))
    except AutoparInputError:
        raise
    except (ImportError, ModuleNotFoundError) as err:
        raise AutoparInputError(f"cannot open the study storage {target.display}: a driver is missing ({err}); "
                                "install it (e.g. pip install psycopg2-binary, pymysql or redis)") from None
    except Exception as err:  # sqlalchemy/redis connection errors: one line, no traceback
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise AutoparInputError(f"cannot reach the study storage {target.display}: {type(err).__name__}: "
                                f"{mask_url(first)[:300]}") from None


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
