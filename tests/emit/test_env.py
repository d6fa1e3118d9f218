"""AUTOPAR_* environment variables: values, shell quoting, and emit()'s dispatch."""

from __future__ import annotations

import subprocess

import pytest

from autopar.emit import emit
from autopar.emit.env import env_vars, format_env
from autopar.errors import AutoparInputError, LayoutError
from autopar.specs.layout import Layout, resolve_layout

from .conftest import DSV3, LLAMA3_8B, TRAIN

KEYS = ["AUTOPAR_TP", "AUTOPAR_PP", "AUTOPAR_VPP", "AUTOPAR_CP", "AUTOPAR_EP", "AUTOPAR_ETP", "AUTOPAR_DP",
        "AUTOPAR_EDP", "AUTOPAR_SP", "AUTOPAR_ZERO", "AUTOPAR_FSDP", "AUTOPAR_MBS", "AUTOPAR_GA", "AUTOPAR_GBS",
        "AUTOPAR_SEQ_LEN", "AUTOPAR_RECOMPUTE", "AUTOPAR_STAGE_LAYERS", "AUTOPAR_WORLD"]


def bash(script: str, text: str) -> str:
    """Run ``script`` in bash with the emitted text available as $ENV_TEXT."""
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                         env={"ENV_TEXT": text, "PATH": "/usr/bin:/bin"})
    return out.stdout


def test_values(dsv3_layout):
    env = env_vars(dsv3_layout, TRAIN, 1024)
    assert list(env) == KEYS
    assert env["AUTOPAR_TP"] == "2" and env["AUTOPAR_PP"] == "16" and env["AUTOPAR_EP"] == "64"
    assert env["AUTOPAR_DP"] == "32" and env["AUTOPAR_EDP"] == "1" and env["AUTOPAR_GA"] == "32"
    assert env["AUTOPAR_SP"] == "1" and env["AUTOPAR_FSDP"] == "0" and env["AUTOPAR_ZERO"] == "1"
    assert env["AUTOPAR_STAGE_LAYERS"] == "3," + "4," * 14 + "2"
    assert env["AUTOPAR_WORLD"] == "1024" and env["AUTOPAR_RECOMPUTE"] == "selective"


def test_round_trip_through_bash(dsv3_layout):
    text = format_env(env_vars(dsv3_layout, TRAIN, 1024))
    assert bash('source <(printf "%s" "$ENV_TEXT"); echo $AUTOPAR_TP', text) == "2\n"
    got = bash('source <(printf "%s" "$ENV_TEXT"); env', text)
    env = dict(line.split("=", 1) for line in got.splitlines() if line.startswith("AUTOPAR_"))
    assert env == env_vars(dsv3_layout, TRAIN, 1024)


def test_quoting_survives_the_shell():
    tricky = {"AUTOPAR_A": "a b", "AUTOPAR_B": "it's", "AUTOPAR_C": "$(echo no)", "AUTOPAR_D": ""}
    got = bash('source <(printf "%s" "$ENV_TEXT"); printf "%s|" "$AUTOPAR_A" "$AUTOPAR_B" "$AUTOPAR_C" "$AUTOPAR_D"',
               format_env(tricky))
    assert got == "a b|it's|$(echo no)||"
    with pytest.raises(AutoparInputError, match="not a valid shell variable name"):
        format_env({"BAD-NAME": "1"})


def test_hsdp_shard_is_added_when_set():
    layout = resolve_layout(Layout(tp=2, hsdp_shard=2), LLAMA3_8B, TRAIN, 8)
    env = env_vars(layout, TRAIN, 8)
    assert env["AUTOPAR_HSDP_SHARD"] == "2" and env["AUTOPAR_FSDP"] == "0" and env["AUTOPAR_ZERO"] == "3"


def test_world_mismatch_is_refused(dsv3_layout):
    with pytest.raises(AutoparInputError, match="not 512"):
        env_vars(dsv3_layout, TRAIN, 512)


def test_emit_dispatches_and_resolves():
    layout = Layout(tp=2, pp=2)  # unresolved: emit resolves it
    assert "export AUTOPAR_DP=2" in emit("env", layout, LLAMA3_8B, TRAIN, 8)
    assert "--tensor-model-parallel-size 2" in emit("megatron", layout, LLAMA3_8B, TRAIN, 8)
    assert "def autopar_config() -> Trainer.Config:" in emit("torchtitan", layout, LLAMA3_8B, TRAIN, 8)
    assert "[parallelism]" in emit("torchtitan", layout, LLAMA3_8B, TRAIN, 8, torchtitan_version="0.2.2")
    with pytest.raises(AutoparInputError, match="unknown emit kind 'slurm'"):
        emit("slurm", layout, LLAMA3_8B, TRAIN, 8)
    with pytest.raises(LayoutError):
        emit("env", Layout(tp=3), LLAMA3_8B, TRAIN, 8)
    with pytest.raises(LayoutError):
        emit("megatron", Layout(ep=2), LLAMA3_8B, TRAIN, 8)  # EP on a dense model (pitfall 5)
    assert "AUTOPAR_EP=8" in emit("env", Layout(tp=2, ep=8), DSV3, TRAIN, 8)


def test_offloaded_share_is_added_when_set():
    layout = resolve_layout(Layout(tp=2, offload_activations=0.25), LLAMA3_8B, TRAIN, 8)
    assert env_vars(layout, TRAIN, 8)["AUTOPAR_OFFLOAD_ACTIVATIONS"] == "0.25"
    assert "AUTOPAR_OFFLOAD_ACTIVATIONS" not in env_vars(resolve_layout(Layout(tp=2), LLAMA3_8B, TRAIN, 8), TRAIN, 8)
