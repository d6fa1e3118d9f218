"""Run the CLI entry in-process and check the promise every command makes about its exit.

The promise (autopar/cli/main.py): exit 0 (done), exit 1 only where a command documents "no result" (solve: no
layout fits), or exit 2 with exactly one ``autopar: error:`` line on stderr, and never a traceback. Other stderr
lines a command may print before it fails are its notes (``note: ...``) and progress (``… ...``,
``autopar tune: ...``). A case that
runs past CASE_LIMIT_S fails as a hang: the limit is generous (the slowest passing case takes a few seconds on a
loaded 2-core machine), so it fails on a real hang, not on a slow machine.
"""

from __future__ import annotations

import contextlib
import io
import signal
from dataclasses import dataclass

from autopar.cli.main import main

CASE_LIMIT_S = 20
NO_RESULT_OK = {"solve"}          # commands whose exit 1 is documented ("No layout fits.")
PROGRESS = ("note:", "…", "autopar tune:", "  ")   # stderr lines a command may print before its error ("  ":
#   the continuation of a progress line wrapped at the terminal width)


class Hang(BaseException):
    """Raised by the alarm; a BaseException so that no ``except Exception`` in autopar swallows it."""


@dataclass
class Outcome:
    argv: list[str]
    rc: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return [ln for ln in self.err.splitlines() if ln.strip()]


def run_cli(argv: list[str], limit_s: int = CASE_LIMIT_S) -> Outcome:
    def on_alarm(signum, frame):
        raise Hang(f"autopar {' '.join(argv)[:300]} ran past {limit_s} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(limit_s)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(list(argv))
            except SystemExit as exc:     # argparse: --help (0) and its own errors (2)
                rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return Outcome(list(argv), rc, out.getvalue(), err.getvalue())


def check_promise(o: Outcome) -> None:
    """Assert the exit promise; the message shows the command and what it printed."""
    shown = f"argv={o.argv!r:.2000}\nrc={o.rc}\nstderr:\n{o.err[-3000:]}"
    assert "Traceback" not in o.err, shown
    lines = o.err_lines
    errors = [ln for ln in lines if ln.startswith("autopar:")]
    others = [ln for ln in lines if not ln.startswith("autopar:")]
    if o.rc == 2:
        assert len(errors) == 1 and errors[0].startswith("autopar: error: "), shown
        assert lines[-1] == errors[0], shown
        assert all(ln.startswith(PROGRESS) for ln in others), shown
    elif o.rc == 0 or (o.rc == 1 and o.argv and o.argv[0] in NO_RESULT_OK):
        assert not errors, shown
    else:
        raise AssertionError(f"exit status {o.rc} is not 0, 2 or a documented 1\n{shown}")
