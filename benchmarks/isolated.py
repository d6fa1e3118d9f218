"""One benchmark variant per Python process, its result read back: the memory benchmarks run each variant in a
process of its own so that one variant's cached allocator blocks, compiled kernels or process groups do not serve
the next. The child prints one line, ``RESULT <json>`` (:func:`result_line`); :func:`run_isolated` runs it and returns
the record, or prints why it failed in one line and returns None."""

from __future__ import annotations

import json
import socket
import subprocess

PREFIX = "RESULT "


def result_line(record: dict) -> str:
    """The line a child prints for its record."""
    return PREFIX + json.dumps(record)


def run_isolated(cmd: list[str], env: dict[str, str], timeout: float) -> dict | None:
    """Run ``cmd`` (a child printing :func:`result_line`) and return its record; on failure print
    ``  failed (status): <last error line>`` and return None. A child still running after ``timeout`` seconds is
    killed (``subprocess.run``) and reported the same way, ``  failed (timed out after N s)``."""
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"  failed (timed out after {timeout:g} s)", flush=True)
        return None
    line = [x for x in r.stdout.splitlines() if x.startswith(PREFIX)]
    if r.returncode or not line:
        errors = [x for x in r.stderr.strip().splitlines() if x.strip()]
        print(f"  failed ({r.returncode}): {(errors or [r.stdout[-300:]])[-1]}", flush=True)
        return None
    return json.loads(line[0][len(PREFIX):])


def free_port() -> str:
    """A TCP port free on this host now, for a child's MASTER_PORT (the kernel picks it: bind to port 0), so that two
    benchmark runs at once do not meet on a fixed port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])
