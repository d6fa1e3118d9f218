"""The command line as a user meets it: exit codes, one-line errors, the JSON contract."""

import json
import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run([sys.executable, "-m", "autopar.cli.main", *args], capture_output=True, text=True)


def test_estimate_json_contract():
    r = run("estimate", "--model", "llama3_70b", "--gpus", "64", "--tp", "4", "--pp", "4", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d["memory_gib"]) == {"weights", "grads", "optimizer", "activations", "buffers", "reserve", "total"}
    assert set(d["time_s"]) >= {"compute", "tp", "cp", "ep", "dp", "pp_bubble", "pp_p2p", "optimizer"}
    assert d["time_s"]["offload"] == 0.0 and d["host_offload_gib"] == 0.0
    assert d["step_time_s"] == pytest.approx(sum(d["time_s"].values()))
    assert d["layout"]["dp"] == 4 and d["layout"]["edp"] == 16
    assert {"fits", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "bottleneck"} <= set(d)


def test_estimate_splits_an_uneven_pipeline_by_itself():
    """issue 12 item 5: 61 layers over 8 stages need no --stage-layers (the split solve uses: 6/8x6/7)."""
    r = run("estimate", "--model", "deepseek_v3", "--gpus", "256", "--pp", "8", "--ep", "32", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["layout"]["stage_layers"] == [6, 8, 8, 8, 8, 8, 8, 7]


@pytest.mark.parametrize("args, needle", [
    (["estimate", "--model", "no_such_model", "--gpus", "8"], "unknown model 'no_such_model'"),
    (["estimate", "--model", "llama3_70b", "--gpus", "64", "--tp", "3"], "not divisible by tp (3)"),
    (["estimate", "--model", "llama3_70b", "--gpus", "64", "--ep", "2"], "expert parallel needs an MoE model"),
    (["estimate", "--model", "deepseek_v3", "--gpus", "256", "--tp", "2", "--pp", "16", "--ep", "64"],
     "min_gpus = pp·max(tp·cp, ep·etp) = 16·max(2, 64) = 1024 > gpus (256)"),
    (["estimate", "--model", "llama3_70b", "--gpus", "0"], "--gpus: must be between 1 and 1,048,576"),
    (["solve", "--model", "llama3_70b", "--gpus", "0"], "--gpus: must be between 1 and 1,048,576, got 0"),
    (["estimate", "--model", "llama3_70b", "--gpus", "8", "--recompute", "bogus"], "unknown recompute module"),
    (["estimate", "--model", "llama3_70b", "--gpus", "8", "--precision", "nvfp4"], "no nvfp4 tensor cores"),
    (["solve", "--model", "llama3_70b", "--gpus", "64", "--tp", "3"], "factorises 64 GPUs"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    r = run(*args)
    assert r.returncode == 2
    assert needle in r.stderr
    assert "Traceback" not in r.stderr


def test_solve_small_problem_prints_a_ranked_table():
    r = run("solve", "--model", "llama3_8b", "--gpus", "8", "--top-k", "2", "--mbs", "1,2", "--vpp", "1",
            "--zero", "1,3", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["status"] == "OPTIMAL" and len(d["plans"]) == 2
    assert d["plans"][0]["estimate"]["step_time_s"] <= d["plans"][1]["estimate"]["step_time_s"]


def test_zoo_lists_every_model_and_hardware_file_with_their_figures():
    from autopar.specs.loaders import zoo_names
    r = run("zoo", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert [m["name"] for m in d["models"]] == zoo_names("models")
    assert [h["name"] for h in d["hardware"]] == zoo_names("hardware")
    v3 = next(m for m in d["models"] if m["name"] == "deepseek_v3")
    assert v3["total_params_b"] == pytest.approx(671, rel=0.02) and v3["experts"] == 256 and v3["mla"]
    mixers = {m["name"]: m["mixers"] for m in d["models"]}
    assert mixers["nemotron_h_8b"] == "mamba2 x24, attention x4"          # 24 MLP-only layers have no mixer
    assert mixers["falcon_h1_7b"] == "attention+mamba2 x44" and mixers["llama3_8b"] == "attention x32"
    assert mixers["jamba_v0_1"] == "mamba1 x28, attention x4"
    table = run("zoo", "hardware")
    assert table.returncode == 0 and "h100_sxm" in table.stdout and "deepseek_v3" not in table.stdout


def test_zoo_blocks_lists_the_catalogue():
    from autopar.blocks import CHANNELS, MIXERS
    r = run("zoo", "blocks", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["blocks"]
    assert [b["kind"] for b in rows] == [*MIXERS, *CHANNELS]
    assert all(b["title"] and b["source"] for b in rows)
    assert "mamba1" in run("zoo", "blocks").stdout


def test_help_lists_every_command():
    r = run("--help")
    assert r.returncode == 0
    for cmd in ("solve", "estimate", "validate", "profile", "tune", "zoo"):
        assert cmd in r.stdout
    assert "invalid choice" in run("nope").stderr
