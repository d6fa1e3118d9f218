"""The --json contract: schema_version and the JSON Schema generated from the pydantic models in
autopar/cli/schema.py; --version."""

import json
import subprocess
import sys

from autopar import __version__
from autopar.cli.schema import EstimateJson, SolveJson


def run(*args):
    return subprocess.run([sys.executable, "-m", "autopar.cli.main", *args], capture_output=True, text=True)


def test_estimate_json_matches_its_schema():
    r = run("estimate", "--model", "deepseek_v3", "--gpus", "256", "--tp", "2", "--pp", "8", "--ep", "32",
            "--stage-layers", "7,8,8,8,8,8,8,6", "--json")
    assert r.returncode == 0, r.stderr
    EstimateJson.model_validate(json.loads(r.stdout))     # extra="forbid": an unnamed key fails


def test_solve_json_matches_its_schema_with_budget_and_sweep():
    r = run("solve", "--model", "llama3_8b", "--gpus", "8-16", "--mbs", "1", "--vpp", "1", "--time-limit", "5",
            "--top-k", "2", "--tokens", "1T", "--gpu-hour-price", "2", "--json")
    assert r.returncode == 0, r.stderr
    d = SolveJson.model_validate(json.loads(r.stdout))
    assert d.gpu_sweep and all(p.budget is not None for p in d.plans)


def test_schema_command_prints_the_generated_schema():
    for name, model in (("solve", SolveJson), ("estimate", EstimateJson)):
        r = run("schema", name)
        assert r.returncode == 0, r.stderr
        schema = json.loads(r.stdout)
        assert schema == model.model_json_schema() and schema["additionalProperties"] is False
        assert "schema_version" in schema["required"]


def test_version():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"autopar {__version__}"


def test_solve_json_keeps_the_emitted_settings():
    """Issue 22 #7: --emit with --json dropped the launcher settings silently."""
    r = run("solve", "--model", "llama3_8b", "--gpus", "8", "--mbs", "1", "--vpp", "1", "--time-limit", "5",
            "--top-k", "2", "--emit", "megatron", "--json")
    assert r.returncode == 0, r.stderr
    d = SolveJson.model_validate(json.loads(r.stdout))
    assert d.emit is not None and d.emit.target == "megatron" and d.emit.plan_rank == 1
    assert "--tensor-model-parallel-size" in d.emit.text and d.emit.refusal is None
    text = run("solve", "--model", "llama3_8b", "--gpus", "8", "--mbs", "1", "--vpp", "1", "--time-limit", "5",
               "--top-k", "2", "--emit", "megatron")
    from autopar.cli.render import wrap_comments            # the terminal wraps long comment lines, nothing else
    assert wrap_comments(d.emit.text, 80) in text.stdout
