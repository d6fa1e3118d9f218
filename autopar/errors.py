"""Errors autopar raises for bad input.

Every user-facing mistake (a malformed file, an unknown key, an impossible layout) is an
:class:`AutoparInputError`. The CLI turns it into one line on stderr and exit status 2; library callers
can catch it. Messages name the field or the rule and show the numbers that failed.
"""

from __future__ import annotations


class AutoparInputError(ValueError):
    """Bad input from the user: a file, a name, a flag or a layout. The CLI exits with status 2."""


class LayoutError(AutoparInputError):
    """A layout breaks one or more validity rules. ``problems`` lists every rule that failed."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid layout: " + "; ".join(self.problems))


class Terminated(KeyboardInterrupt):
    """SIGTERM (kill, scancel, a SLURM time limit), raised by the CLI's handler: it unwinds like Ctrl-C, so every
    ``finally`` runs (a run's workers are stopped and its folder removed, a study's trial is queued again), and the
    command exits 143."""
