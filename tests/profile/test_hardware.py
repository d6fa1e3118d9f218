"""autopar profile hardware: the nccl-tests bus-bandwidth definitions, a real 2-process gloo measurement, the
hardware file it writes, and the no-overwrite rule."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autopar.errors import AutoparInputError
from autopar.profile import hardware as hwmod
from autopar.profile.hardware import (OPS, ProfileError, bus_factor, busbw_gbps, gemm_shapes, group_sizes,
                                      message_elems, profile_hardware, register_hardware, run_collectives,
                                      write_new_file)
from autopar.specs.loaders import load_hardware
from autopar.specs.model import ModelSpec


# ---- definitions -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_bus_factors_are_the_nccl_tests_ones(n):
    assert bus_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert bus_factor(op, n) == pytest.approx((n - 1) / n)
    assert bus_factor("send_recv", n) == 1.0


def test_busbw_from_bytes_and_time():
    # 1 GB in 0.1 s is 10 GB/s algbw; on 8 ranks the all-reduce bus bandwidth is 10 * 14/8 = 17.5 GB/s.
    assert busbw_gbps("all_reduce", 8, 1e9, 0.1) == pytest.approx(17.5)
    assert busbw_gbps("all_gather", 4, 1e9, 0.1) == pytest.approx(7.5)
    assert busbw_gbps("send_recv", 2, 1e9, 0.1) == pytest.approx(10.0)
    with pytest.raises(ValueError):
        bus_factor("broadcast", 2)


def test_group_sizes_and_message_rounding():
    assert group_sizes(1) == []
    assert group_sizes(2) == [2]
    assert group_sizes(6) == [2, 4, 6]
    assert group_sizes(8) == [2, 4, 8]
    assert message_elems(1000, 3) % 3 == 0 and message_elems(1000, 3) * 4 <= 1000
    assert message_elems(1, 4) == 4  # never empty


def test_gemm_shapes_follow_the_model():
    m = ModelSpec(name="t", num_layers=2, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=8,
                  num_kv_heads=2, vocab_size=1000)
    shapes = {s.label: (s.m, s.k, s.n) for s in gemm_shapes(m, 512)}
    assert shapes["qkv"] == (512, 256, (8 + 2 * 2) * 32)
    assert shapes["attn_out"] == (512, 256, 256)
    assert shapes["mlp_up"] == (512, 256, 2 * 1024)  # gated: gate and up fused
    assert shapes["mlp_down"] == (512, 1024, 256)
    assert [s.label for s in gemm_shapes(None, 512)] == ["square512", "square1024", "square2048"]


# ---- real measurement ------------------------------------------------------------------------------------
def _children() -> set[int]:
    """Live (not zombie) processes whose parent is this test process, from /proc."""
    kids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            kids.add(int(stat.parent.name))
    return kids


@pytest.mark.slow
def test_real_two_process_gloo_measurement_writes_a_loadable_file(tmp_path):
    lines = []
    model = ModelSpec(name="t", num_layers=2, hidden_size=256, ffn_hidden_size=512, num_attention_heads=4,
                      vocab_size=1000)
    spec, raw = profile_hardware(None, world=2, sizes_mib=[0.0625, 0.25], ops=["all_reduce", "all_gather"],
                                 model=model, tokens=256, timeout_s=60, gemm=True, min_time_s=0.02,
                                 out=lines.append, progress=lambda m: None)
    coll = [r for r in raw["records"] if r["kind"] == "collective"]
    assert {(r["op"], r["n"], r["size_mib"]) for r in coll} == {
        (op, 2, s) for op in ("all_reduce", "all_gather") for s in (0.0625, 0.25)}
    assert all(r["busbw_gbps"] > 0 and r["seconds"] > 0 for r in coll)
    for r in coll:  # busbw follows from the recorded bytes and time
        assert r["busbw_gbps"] == pytest.approx(busbw_gbps(r["op"], 2, r["bytes"], r["seconds"]))
    assert len(lines) == 1 + len(coll)  # the table: a header and a row per measurement, as it goes
    table = spec.measured_busbw_gbps
    assert table.message_mib == 0.25 and set(table.all_reduce) == {2} and table.all_reduce[2] > 0
    assert table.all_gather[2] > 0 and not table.all_to_all
    assert spec.gpus_per_node == spec.nvlink_domain_size == 2
    assert "fp32" in raw["gemm"]["tflops"] and spec.kernel_model.gemm["fp32"] == 1.0
    # The CPU runner computes in fp32: that is the rate a bf16 training spec must look up on this "GPU".
    # The rate is the one each process gets while all compute at once, as in a training step.
    together = [r for r in raw["records"] if r["kind"] == "compute"]
    assert len(together) == 1 and together[0]["tflops"]["fp32"] > 0
    assert spec.peak_tflops_bf16 == spec.peak_tflops_fp16 == pytest.approx(together[0]["tflops"]["fp32"])
    assert spec.hbm_gib > 0 and spec.hbm_tbps > 0 and spec.reserve_gib > 0
    path = tmp_path / "cpu.yaml"
    write_new_file(spec, path, hwmod.file_header(spec, raw), force=False)
    again = load_hardware(path)
    assert again == spec
    assert "Bus bandwidth" in path.read_text()
    assert not _children()  # every worker was reaped


@pytest.mark.slow
def test_timeout_stops_every_worker():
    with pytest.raises(ProfileError, match="timed out"):
        run_collectives(2, [64.0], list(OPS), timeout_s=0.5)
    assert not _children()


@pytest.mark.slow
def test_base_spec_keeps_datasheet_and_gets_the_table():
    base = load_hardware("h100_sxm")
    spec, raw = profile_hardware(base, world=2, sizes_mib=[0.0625], ops=["send_recv"], model=None, timeout_s=60,
                                 gemm=False, min_time_s=0.02, out=lambda m: None, progress=lambda m: None)
    assert spec.peak_tflops_bf16 == base.peak_tflops_bf16 and spec.efficiency == base.efficiency
    assert spec.measured_busbw_gbps.send_recv[2] > 0 and spec.measured_busbw_gbps.message_mib == 0.0625


# ---- never lose a user's file ----------------------------------------------------------------------------
def test_write_refuses_to_overwrite(tmp_path):
    spec = load_hardware("h100_sxm")
    path = tmp_path / "hw.yaml"
    path.write_text("mine\n")
    with pytest.raises(AutoparInputError, match="exists"):
        write_new_file(spec, path, "", force=False)
    assert path.read_text() == "mine\n"
    write_new_file(spec, path, "# header", force=True)
    assert load_hardware(path) == spec


def test_cli_refuses_before_measuring(tmp_path, monkeypatch):
    path = tmp_path / "hw.yaml"
    path.write_text("mine\n")
    monkeypatch.setattr(hwmod, "profile_hardware", lambda *a, **k: pytest.fail("measured anyway"))
    parser = argparse.ArgumentParser()
    register_hardware(parser.add_subparsers())
    args = parser.parse_args(["hardware", "--out", str(path)])
    with pytest.raises(AutoparInputError, match="--force"):
        args.func(args)
    assert path.read_text() == "mine\n"


def test_bad_input_is_an_input_error():
    with pytest.raises(AutoparInputError, match="unknown collective"):
        profile_hardware(None, world=2, sizes_mib=[1], ops=["broadcast"], model=None, timeout_s=10)
    with pytest.raises(AutoparInputError, match="positive"):
        profile_hardware(None, world=2, sizes_mib=[0], ops=["all_reduce"], model=None, timeout_s=10)
    with pytest.raises(AutoparInputError):
        hwmod.parse_float_list("1,x", "--sizes")


def test_planning_import_does_not_load_torch():
    code = ("import sys; import autopar.profile.hardware, autopar.profile.compare, autopar.profile.calibrate; "
            "print('torch' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=str(Path(hwmod.__file__).resolve().parents[2]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"
