"""benchmarks/isolated.py: a variant's record read back, and a failing or hanging child reported in one line."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("isolated", ROOT / "benchmarks" / "isolated.py")
isolated = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(isolated)


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_the_record_comes_back():
    code = f"print('noise'); print({isolated.result_line({'a': 1.5})!r})"
    assert isolated.run_isolated(_child(code), dict(os.environ), timeout=60) == {"a": 1.5}


def test_a_failing_child_is_one_line(capsys):
    code = "import sys; print('boom', file=sys.stderr); sys.exit(3)"
    assert isolated.run_isolated(_child(code), dict(os.environ), timeout=60) is None
    assert capsys.readouterr().out == "  failed (3): boom\n"


def test_a_child_past_its_timeout_is_killed_and_reported(capsys):
    # the child would sleep for a minute; the parent gives it a fraction of a second and goes on (no traceback)
    assert isolated.run_isolated(_child("import time; time.sleep(60)"), dict(os.environ), timeout=0.5) is None
    assert capsys.readouterr().out == "  failed (timed out after 0.5 s)\n"


def test_free_port_is_a_port_nobody_holds():
    import socket
    port = int(isolated.free_port())
    assert 0 < port < 65536
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))        # free: a benchmark's child can take it as MASTER_PORT
