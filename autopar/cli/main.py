"""Entry point of the ``autopar`` command.

Each subcommand lives in its own module exposing ``register(subparsers)``, which adds an argparse parser
whose ``func`` default takes the parsed arguments and returns an exit status. Bad input anywhere becomes
one line on stderr and exit status 2 (no traceback).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from autopar.errors import AutoparInputError

# Subcommand modules, in the order `autopar --help` lists them.
SUBCOMMANDS = ("solve", "estimate", "validate", "profile", "tune", "zoo", "schema")


class _Parser(argparse.ArgumentParser):
    """argparse exits with status 2 on bad flags already; keep its one-line message, drop the usage dump."""

    def error(self, message: str) -> None:  # pragma: no cover - exercised through the CLI tests
        self.exit(2, f"autopar: error: {message} (see '{self.prog} --help')\n")


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
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[0] if argv and argv[0] in SUBCOMMANDS else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except AutoparInputError as err:
        print(f"autopar: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autopar: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
