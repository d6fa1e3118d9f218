"""Every command's output fits the terminal (issue 22 #6): at COLUMNS=80 and 120 no line of stdout or stderr is
longer, counted in characters. A table that cannot fit drops columns (and names them) or prints one record per
line. tune and profile run are counted in tests/tune/test_tune_cli.py and tests/run/test_cli_profile.py (they
start real runs)."""

import os
import subprocess
import sys

import pytest

COMMANDS = {
    "solve": ["solve", "--model", "llama3_70b", "--gpus", "512", "--tokens", "15T", "--time-limit", "5",
              "--emit", "megatron", "--explain"],
    "solve-range": ["solve", "--model", "llama3_8b", "--gpus", "8-16", "--tokens", "1T", "--gpu-hour-price", "2",
                    "--mbs", "1", "--vpp", "1", "--time-limit", "5"],
    "estimate": ["estimate", "--model", "deepseek_v3", "--gpus", "256", "--tp", "2", "--pp", "8", "--ep", "32",
                 "--stage-layers", "7,8,8,8,8,8,8,6"],
    "solve-bridge": ["solve", "--model", "deepseek_v3", "--gpus", "256", "--time-limit", "5", "--emit", "bridge"],
    "solve-torchtitan": ["solve", "--model", "llama3_70b", "--gpus", "512", "--time-limit", "5", "--emit",
                         "torchtitan"],
    "validate": ["validate"],
    "zoo": ["zoo"],
}


def run(argv, columns):
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run([sys.executable, "-m", "autopar.cli.main", *argv], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_no_line_is_wider_than_the_terminal(name, columns):
    r = run(COMMANDS[name], columns)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines() + r.stderr.splitlines()
    assert len(lines) > 5
    widest = max(lines, key=len)
    assert len(widest) <= columns, f"{len(widest)} characters: {widest}"
    assert "…" not in "".join(ln for ln in r.stdout.splitlines()), "a cell was cut"


def test_validate_at_80_columns_is_compact_and_names_what_it_drops():
    """853 lines at 80 columns before, most cells cut; now the text columns wrap and the dropped ones are named."""
    r = run(COMMANDS["validate"], 80)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) < 400
    assert "not shown at 80 columns:" in " ".join(r.stdout.split())
