"""Entry point of the ``autopar`` command.

Each subcommand lives in its own module exposing ``register(subparsers)``, which adds an argparse parser
whose ``func`` default takes the parsed arguments and returns an exit status. Bad input anywhere becomes
one line on stderr and exit status 2 (no traceback).
"""

from __future__ import annotations

import argparse
import errno
import gc
import importlib
import os
import signal
import sys

from autopar.errors import AutoparInputError, Terminated

# Subcommand modules, in the order `autopar --help` lists them.
SUBCOMMANDS = ("solve", "estimate", "validate", "profile", "tune", "zoo", "schema")
# Commands that start no torch work: their numpy work is on small arrays, so numpy's BLAS gets one thread. OpenBLAS
# otherwise starts a worker thread per core when numpy loads, and those spin before they sleep: `python -c 'import
# numpy'` took 0.11 s of CPU against 0.07 s with OPENBLAS_NUM_THREADS=1 (median of 8 whole processes each, 2-core
# development machine, 2026-11-26), and on a busy machine the spinning costs wall time too. A user's own setting wins.
ONE_BLAS_THREAD = ("solve", "estimate", "validate", "zoo", "schema")
# CPython's cyclic garbage collector while a command runs: a first-generation pass every 200,000 net allocations instead
# of every 700 (gc.set_threshold; the older generations' thresholds kept). A command allocates hundreds of thousands of
# short-lived tuples and dicts (the imports' class and schema builds, the search's keys and memos) that reference
# counting frees, and at the default each pass that reaches the oldest generation walks every object the imports made
# (pydantic's schemas, numpy, OR-Tools). `autopar solve --model deepseek_v3 --gpus 256` took about 5% less CPU time at
# 50,000 than at the default and 4% less again at 200,000 (median ratios of 9 and 15 alternating whole processes, 2-core
# development machine, 2026-11-26; peak memory the same, 94 MiB). Cycles are still collected, later; the thresholds in
# force before main() are restored when it returns. When main() is the program itself (argv None: the `autopar` command,
# `python -m autopar.cli.main`), it ends by freezing the collector's objects (gc.freeze: later collections ignore them),
# which spares the interpreter's collections at exit a walk over every object the run made: about 8% of the same
# command's CPU time (median ratio 0.92 of 9 alternating whole processes, same machine and date). Nothing is lost:
# output is flushed before, and atexit handlers and weakref finalizers still run.
GC_THRESHOLD0 = 200_000


class _Parser(argparse.ArgumentParser):
    """argparse exits with status 2 on bad flags already; keep its one-line message, drop the usage dump."""

    def error(self, message: str) -> None:  # pragma: no cover - exercised through the CLI tests
        self.exit(2, f"autopar: error: {_one_line(message)} (see '{self.prog} --help')\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or (``only``) the one with just that subcommand: a command imports only its own module,
    which keeps `autopar solve` and `autopar estimate` start-up short."""
    from autopar import __version__
    parser = _Parser(prog="autopar", description="Pick the parallel layout for training a transformer on GPUs.")
    parser.add_argument("--version", action="version", version=f"autopar {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in SUBCOMMANDS:
        if only is not None and name != only:
            continue
        try:
            module = importlib.import_module(f"autopar.cli.{name}")
        except ModuleNotFoundError as err:
            if err.name == f"autopar.cli.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command. Exit status: 0 done, 1 a documented "no result" (no layout fits, no run succeeded),
    2 bad input (one ``autopar: error:`` line on stderr), 130 interrupted, 141 stdout closed early (``| head``).
    Any other failure is a bug in autopar: one ``autopar: internal error:`` line and status 70
    (set AUTOPAR_DEBUG=1 for the traceback)."""
    global _TERM_SEEN
    program = argv is None   # the command itself, not a call from Python (tests, a notebook): see GC_THRESHOLD0
    argv = sys.argv[1:] if argv is None else argv
    _TERM_SEEN = False
    if argv and argv[0] in ONE_BLAS_THREAD and "numpy" not in sys.modules:
        # before numpy loads (the autopar package loads it only on use); once numpy is loaded (main() called
        # in-process) the setting would change nothing here and only leak into later child processes
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    old_term = _catch_sigterm()
    old_unraisable, sys.unraisablehook = sys.unraisablehook, _on_unraisable
    old_gc = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD0, *old_gc[1:])
    try:
        parser = build_parser(argv[0] if argv and argv[0] in SUBCOMMANDS else None)
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            raise AutoparInputError(f"no command given (choose {', '.join(SUBCOMMANDS)})")
        status = int(args.func(args) or 0)
        sys.stdout.flush()      # a full disk or /dev/full as stdout fails here, inside the handlers below
        return status
    except AutoparInputError as err:
        _say(f"autopar: error: {_one_line(err)}")
        return 2
    except Terminated:
        _say("autopar: terminated (SIGTERM)")
        return 143
    except KeyboardInterrupt:
        _say("autopar: interrupted")
        return 130
    except BrokenPipeError:
        # The reader of stdout went away (`autopar ... --json | head -1`): what it wanted it has; stop quietly,
        # as a command killed by SIGPIPE would. Python's final flush must not write to the closed pipe again.
        _close_stdout()
        return 141
    except OSError as err:
        if err.errno not in _WRITE_ERRNOS:
            return _internal(err)
        # The output could not be written (stdout on a full disk or /dev/full, a file system gone read-only): the
        # user's environment, not a bug. What stdout still holds cannot be written either: drop it.
        _close_stdout()
        where = f" {err.filename}" if getattr(err, "filename", None) else " the output"
        _say(f"autopar: error: cannot write{_one_line(where)}: {err.strerror or err}")
        return 2
    except MemoryError:
        _say("autopar: error: out of memory; the problem is too large for this machine (see docs/input-bounds.md)")
        return 2
    except Exception as err:  # noqa: BLE001 - the promise is one line, never a traceback
        if _TERM_SEEN:
            # SIGTERM arrived and its Terminated was turned into another error on the way up: raised inside a C
            # extension's module init it comes out as "ImportError: initialization failed" (seen when a kill landed
            # while `tune` imported torch). The command was terminated, not broken.
            _say("autopar: terminated (SIGTERM)")
            return 143
        return _internal(err)
    finally:
        gc.set_threshold(*old_gc)
        if program:
            gc.freeze()
        sys.unraisablehook = old_unraisable
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


_TERM_SEEN = False   # set by the SIGTERM handler: whatever error unwinds after it is the termination's


def _on_sigterm(signum, frame):  # pragma: no cover - exercised through a subprocess (tests/cli/test_faults.py)
    global _TERM_SEEN
    _TERM_SEEN = True
    raise Terminated()


_REDELIVERIES: list = []   # the threads that delivered a swallowed SIGTERM again (tests join them)


def _on_unraisable(unraisable) -> None:
    """SIGTERM's :class:`Terminated` raised where Python cannot raise it (a weakref callback or ``__del__`` running
    when the signal landed: seen in SQLAlchemy's class registry during `tune`) is printed as "Exception ignored"
    with a traceback and lost, and the command runs on. Deliver the signal again instead, from a timer thread
    (``_thread.interrupt_main``, Python 3.10+) 50 ms later, once the main thread is back in its own flow: delivered
    from here, the handler would run inside this hook (even while it waits for a thread to start) and be swallowed
    again. Anything else goes to Python's own hook."""
    if isinstance(unraisable.exc_value, Terminated):
        import _thread
        import threading
        t = threading.Timer(0.05, _thread.interrupt_main, args=(signal.SIGTERM,))
        t.daemon = True
        t.start()
        _REDELIVERIES.append(t)
        return
    sys.__unraisablehook__(unraisable)


def _catch_sigterm():
    """Turn SIGTERM into :class:`Terminated` while a command runs (main thread only); the old handler, or None."""
    try:
        return signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:        # not the main thread
        return None


def _internal(err: Exception) -> int:
    """A failure nobody expected: one line and status 70 (AUTOPAR_DEBUG=1: the traceback instead)."""
    if os.environ.get("AUTOPAR_DEBUG"):
        raise err
    _say(f"autopar: internal error: {type(err).__name__}: {_one_line(err)} (a bug in autopar; please report "
         "it with the command; AUTOPAR_DEBUG=1 shows the traceback)")
    return 70


# errno values of a write the machine refused: no space, quota, file too large, I/O error, read-only file system,
# permission (a file made read-only while autopar ran).
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS, errno.EACCES, errno.EPERM}


def _one_line(err: BaseException | str) -> str:
    """The message on one line: characters that are not printable (a newline, a carriage return or other
    control character typed into a flag or a file name) are shown escaped, as Python writes them."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(err))
    return text or type(err).__name__


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):  # stderr closed too: nothing left to tell
        pass


def _close_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is no file (tests capture it)
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
