"""Storage URLs: what is accepted, and one clear message (exit status 2 from the CLI) for what is not."""

from __future__ import annotations

import subprocess
import sys

import pytest

from autopar.errors import AutoparInputError
from autopar.tune._storage import DEFAULT_DB, mask_url, open_storage, parse_storage


def test_default_is_an_sqlite_file_in_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    t = parse_storage(None)
    assert t.kind == "rdb" and t.url == f"sqlite:///{tmp_path / DEFAULT_DB}" and t.is_file
    assert t.lock_path == tmp_path / f"{DEFAULT_DB}.autopar-lock"


@pytest.mark.parametrize("url, kind", [
    ("sqlite:///{tmp}/a.db", "rdb"), ("{tmp}/b.sqlite3", "rdb"), ("journal:{tmp}/c.log", "journal"),
    ("{tmp}/d.journal", "journal"), ("postgresql://u:pw@db.example:5432/tune", "rdb"),
    ("mysql+pymysql://u:pw@db/tune", "rdb"), ("redis://localhost:6379", "redis"),
])
def test_accepted_forms(url, kind, tmp_path):
    t = parse_storage(url.format(tmp=tmp_path))
    assert t.kind == kind
    assert "pw" not in t.display


@pytest.mark.parametrize("url, needle", [
    ("bogus://somewhere/x", "unknown storage URL 'bogus://somewhere/x' (scheme 'bogus')"),
    ("tune.txt", "unknown storage URL 'tune.txt'"),
    ("sqlite:///:memory:", "needs a file"),
    ("sqlite:////no/such/folder/t.db", "folder /no/such/folder does not exist"),
])
def test_rejected_forms(url, needle):
    with pytest.raises(AutoparInputError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        parse_storage(url)


def test_password_is_masked():
    assert mask_url("postgresql://me:s3cret@host/db") == "postgresql://me:***@host/db"


def test_unreachable_storage_is_one_message(tmp_path):
    with pytest.raises(AutoparInputError, match="cannot reach the study storage sqlite:////proc/tune.db"):
        open_storage(parse_storage("sqlite:////proc/tune.db"))       # /proc takes no new files
    with pytest.raises(AutoparInputError, match="driver is missing|cannot reach"):
        open_storage(parse_storage("postgresql://me:s3cret@127.0.0.1:1/tune"))


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "autopar.cli.main", "tune", "--model", "llama3_8b", "--gpus", "2",
                           "--backend", "gloo", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.mark.parametrize("storage, needle", [
    ("bogus://x", "unknown storage URL"),
    ("postgresql://me:s3cret@127.0.0.1:1/tune", "postgresql://me:***@127.0.0.1:1/tune"),
    ("sqlite:////proc/tune.db", "cannot reach the study storage"),
])
def test_cli_bad_storage_exits_2_with_one_line(storage, needle, tmp_path):
    r = _cli("--storage", storage, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("autopar: error")]
    assert len(err) == 1 and needle in err[0]
    assert "Traceback" not in r.stderr and "s3cret" not in r.stderr
