"""Packaging: the wheel carries the zoo and the validation data (tools/check_wheel.sh installs it in a fresh venv and
runs `autopar validate` there); `validate --fit --write` writes only to an explicit --out."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_write_needs_out():
    r = subprocess.run([sys.executable, "-m", "autopar.cli.main", "validate", "--fit", "--write"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--out" in r.stderr and "Traceback" not in r.stderr


def test_validation_data_is_packaged():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"data" = "autopar/_zoo/data"' in text
    assert '"stacks" = "autopar/_zoo/stacks"' in text         # --stack names, and the stacks' fitted constants
    from autopar.measure.validation import DEFAULT_CSV
    assert DEFAULT_CSV.is_file()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("hatchling") is None or shutil.which("unzip") is None,
                    reason="building the wheel needs hatchling (pip install hatchling) and unzip")
def test_wheel_installed_in_a_fresh_venv_runs_validate():
    r = subprocess.run(["bash", str(ROOT / "tools" / "check_wheel.sh"), sys.executable], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "validate from the wheel: 104 rows" in r.stdout
