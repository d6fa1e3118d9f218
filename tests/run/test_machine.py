"""What this node can run: the CPU world-size bound (a run without GPUs is one gloo process per rank)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from autopar.errors import AutoparInputError
from autopar.run import check_cpu_world
from autopar.run._machine import CPU_RANKS_PER_CORE, cpu_world_limit


SMALL = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "4", "--ffn", "128", "--vocab", "256"]


def test_the_bound_is_the_machines_and_the_message_shows_its_arithmetic():
    limit, why = cpu_world_limit()
    assert 1 <= limit <= CPU_RANKS_PER_CORE * (os.cpu_count() or 1)
    check_cpu_world(limit)                                       # at the bound: fine
    with pytest.raises(AutoparInputError, match=rf"--gpus {limit + 1:,}: .* at most {limit} \(.*\)"):
        check_cpu_world(limit + 1)
    assert "per core" in why or "MiB" in why


@pytest.mark.parametrize("argv", [
    ["tune", "--model", "llama3_8b", "--gpus", "1048576", "--trials", "1", "--backend", "gloo"],
    ["profile", "run", "--model", "llama3_8b", "--gpus", "1048576", "--tp", "1", "--backend", "gloo", *SMALL],
])
def test_a_world_the_machine_cannot_hold_is_refused_before_anything_starts(argv, tmp_path):
    r = subprocess.run([sys.executable, "-m", "autopar.cli.main", *argv], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    limit, _ = cpu_world_limit()
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr       # one line: nothing printed, nothing started
    assert lines[0].startswith("autopar: error: --gpus 1,048,576") and f"at most {limit}" in lines[0], r.stderr
    assert not list(tmp_path.iterdir())                          # no study file made either
