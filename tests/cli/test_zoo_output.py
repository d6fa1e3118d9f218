"""`autopar zoo`: the same figures as every other command, within the terminal's width."""

import os
import re
import subprocess
import sys

from autopar.specs.loaders import load_model, zoo_names


def zoo(*args, columns=200):
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run([sys.executable, "-m", "autopar.cli.main", "zoo", *args], capture_output=True, text=True,
                          env=env)


def test_zoo_and_solve_round_parameter_counts_alike():
    """Issue 22 #10: zoo rounded a rounded figure (70.55 -> 70.5) where solve's header says 70.6."""
    r = zoo("models")
    assert r.returncode == 0, r.stderr
    seen = 0
    for line in r.stdout.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if len(cells) > 3 and cells[0] in zoo_names("models"):
            m = re.search(r"([\d.]+)B total, ([\d.]+)B active", load_model(cells[0]).summary())
            assert (cells[1], cells[2]) == m.groups(), cells[0]
            seen += 1
    assert seen == len(zoo_names("models"))
