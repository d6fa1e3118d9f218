"""The README says what a new user needs (issue 22 #12, #13, #15): the hf extra for Hub ids, --report, and a test
count that matches the suite."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_hub_ids_name_the_hf_extra():
    text = " ".join(README.split())
    assert "Hugging Face id" in text and "autopar[hf]" in text and "local Hugging Face cache" in text


def test_report_is_in_the_command_table():
    solve_row = next(ln for ln in README.splitlines() if ln.startswith("| `autopar solve"))
    assert "--report OUT.md" in solve_row and "_memory.png" in solve_row


def test_quick_start_works_from_any_folder():
    start = README.split("## Quick start", 1)[1].split("##", 1)[0]
    assert "--model deepseek_v3 " in start and "models/deepseek_v3.yaml --gpus" not in start


def test_the_stated_test_count_matches_the_suite():
    stated = int(re.search(r"about ([\d,]+) tests", README).group(1).replace(",", ""))
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300).stdout
    collected = int(re.search(r"(\d+) tests? collected", out).group(1))
    assert abs(collected - stated) <= 0.1 * collected, f"README says about {stated}, the suite has {collected}"
