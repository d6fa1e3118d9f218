"""ClusterSpec: nodes x GPUs per node with a rail-optimised or oversubscribed scale-out fabric."""

import json
import subprocess
import sys

import pytest

from autopar.errors import AutoparInputError
from autopar.specs.cluster import parse_cluster
from autopar.specs.loaders import load_hardware

H100 = load_hardware("h100_sxm")


@pytest.mark.parametrize("text, nodes, per_node, fabric, ratio", [
    ("32x8", 32, 8, "rail", 1.0), ("32x8:rail", 32, 8, "rail", 1.0), ("4X8:oversubscribed=2", 4, 8, "oversubscribed", 2.0),
    ("4x8:3:1", 4, 8, "oversubscribed", 3.0)])
def test_parse(text, nodes, per_node, fabric, ratio):
    c = parse_cluster(text)
    assert (c.nodes, c.gpus_per_node, c.fabric, c.oversubscription, c.gpus) == (nodes, per_node, fabric, ratio,
                                                                                 nodes * per_node)


@pytest.mark.parametrize("text", ["32", "32x", "0x8", "32x8:fat", "32x8:0.5:1", "32x8:oversubscribed=100"])
def test_parse_rejects(text):
    with pytest.raises(AutoparInputError, match="--cluster"):
        parse_cluster(text)


def test_apply():
    hw, notes = parse_cluster("4x8").apply(H100)
    assert hw == H100 and "rail-optimised" in notes[0]
    hw, notes = parse_cluster("4x8:4:1").apply(H100)
    assert hw.scaleout_gbps == pytest.approx(H100.scaleout_gbps / 4) and "approximation" in notes[0]
    with pytest.raises(AutoparInputError, match="GPUs per node"):
        parse_cluster("8x4").apply(H100)


def _estimate(*extra):
    r = subprocess.run([sys.executable, "-m", "autopar.cli.main", "estimate", "--model", "llama3_70b", "--tp", "8",
                        "--pp", "2", *extra], capture_output=True, text=True)
    return r


def test_cli_oversubscription_slows_inter_node_collectives():
    rail = json.loads(_estimate("--cluster", "8x8", "--json").stdout)
    over = json.loads(_estimate("--cluster", "8x8:4:1", "--json").stdout)
    plain = json.loads(_estimate("--gpus", "64", "--json").stdout)
    assert rail["time_s"] == plain["time_s"] and rail["gpus"] == 64
    assert over["time_s"]["dp"] > rail["time_s"]["dp"] and over["time_s"]["tp"] == rail["time_s"]["tp"]
    assert any("4:1 oversubscribed" in n for n in over["notes"])


@pytest.mark.parametrize("args, needle", [(["--cluster", "8x8", "--gpus", "32"], "disagree"), ([], "--gpus N or --cluster")])
def test_cli_bad_cluster_input(args, needle):
    r = _estimate(*args)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr
