"""The hardware zoo (``hardware/*.yaml``): every file loads, its numbers are consistent, and it round-trips."""

from __future__ import annotations

import pytest

from autopar.errors import AutoparInputError
from autopar.specs.hardware import PRECISIONS, HardwareSpec, MeasuredCollectives
from autopar.specs.loaders import dump_spec, load_hardware, zoo_dir, zoo_names

# File stem -> HBM capacity in GB (1e9 B) as the datasheet prints it. hbm_gib must be that converted to GiB.
EXPECTED_GB = {
    "a100_80gb": 80,
    "h100_sxm": 80,
    "h200": 141,
    "b200": 180,
    "b300": 270,
    "gb200_nvl72": 186,
    "gb300_nvl72": 279,
    "mi300x": 192,
    "h100_grand_teton": 96,
    "h100_nvl": 94,
    "h100_pcie": 80,
}
# PCIe cards whose NVLink bridge joins pairs inside an 8-GPU server: the only files whose domain is below a node.
BRIDGED_PAIRS = ("h100_nvl", "h100_pcie")
ZOO = sorted(zoo_names("hardware"))
BLACKWELL = ("b200", "b300", "gb200_nvl72", "gb300_nvl72")


@pytest.fixture(scope="module", params=ZOO)
def hw(request) -> HardwareSpec:
    return load_hardware(request.param)


def test_zoo_has_the_expected_chips():
    assert set(EXPECTED_GB) <= set(ZOO)


@pytest.mark.parametrize("name", ZOO)
def test_file_starts_with_a_datasheet_comment(name):
    text = (zoo_dir("hardware") / f"{name}.yaml").read_text()
    first = text.splitlines()[0]
    assert first.startswith("# "), f"{name}.yaml must open with a comment naming its source"
    assert "datasheet" in text.lower() or "data sheet" in text.lower()


def test_loads_with_its_own_name(hw):
    assert isinstance(hw, HardwareSpec)
    assert hw.source, f"{hw.name}: source is empty"
    assert (zoo_dir("hardware") / f"{hw.name}.yaml").exists(), "name must equal the file stem"


def test_peaks_are_ordered(hw):
    assert hw.peak_tflops_fp16 == hw.peak_tflops_bf16
    if hw.peak_tflops_fp8 is not None:
        assert hw.peak_tflops_fp8 >= hw.peak_tflops_bf16
        assert hw.peak_tflops("fp8_block") == hw.peak_tflops_fp8
    if hw.peak_tflops_mxfp8 is not None:
        assert hw.peak_tflops_fp8 is not None, "MXFP8 tensor cores imply FP8 ones"
        assert hw.peak_tflops_mxfp8 >= hw.peak_tflops_bf16
    if hw.peak_tflops_nvfp4 is not None:
        assert hw.peak_tflops_fp8 is not None
        assert hw.peak_tflops_nvfp4 >= hw.peak_tflops_fp8


def test_bandwidths_and_topology_are_sensible(hw):
    assert hw.nvlink_gbps > hw.scaleout_gbps, "the scale-up domain must be faster than the network"
    if hw.name in BRIDGED_PAIRS:
        assert hw.nvlink_domain_size == 2 and hw.gpus_per_node % 2 == 0
    else:
        assert hw.nvlink_domain_size >= hw.gpus_per_node
        assert hw.nvlink_domain_size % hw.gpus_per_node == 0
    assert 1.0 < hw.hbm_tbps < 20.0
    # efficiency is either the uncalibrated default or the block `autopar validate --fit --write` appends
    text = (zoo_dir("hardware") / f"{hw.name}.yaml").read_text()
    if "calibrated efficiency" not in text:
        assert hw.efficiency == HardwareSpec.model_fields["efficiency"].default_factory()
    # datasheet files carry no measured tables; a system described by a published report may carry the ones it printed
    assert hw.measured_busbw_gbps is None or hw.name in MEASURED_IN_SOURCE


# Zoo systems whose measured collective tables come from their source document.
MEASURED_IN_SOURCE = {"report_accel_128": "example-analysis-report.md, Hardware table, 'Measured BW (GB/s)'"}


def test_the_reference_report_system_carries_its_printed_numbers():
    hw = load_hardware("report_accel_128")
    assert (hw.peak_tflops_bf16, hw.hbm_gib, hw.hbm_tbps, hw.nvlink_domain_size) == (1154, 96, 3.69, 128)
    m = hw.measured_busbw_gbps
    assert m.all_reduce == {2: 23.1, 4: 46.3, 8: 80.1}
    assert m.all_gather == {2: 34.3, 4: 89.9, 8: 186.3}
    assert m.reduce_scatter == {2: 46.0, 4: 92.5, 8: 185.3}


def test_kernel_model_is_sourced_and_physical(hw):
    km = hw.kernel_model
    # every zoo file states where its kernel speeds come from (not the generic default)
    assert km.source != type(km).model_fields["source"].default
    assert all(0 < v <= 1 for v in km.gemm.values())
    for prec in ("bf16", "fp16", "fp8", "mxfp8", "nvfp4"):
        if getattr(hw, f"peak_tflops_{prec}") is not None:
            assert prec in km.gemm, f"{hw.name}: a peak for {prec} but no GEMM efficiency"
    assert km.attention_bwd <= km.attention_fwd <= max(km.gemm.values())
    assert km.head_dim_factor(128) == pytest.approx(1.0)
    assert 0 < km.nvlink <= 1 and 0 < km.scaleout <= 1 and 0 < km.hbm <= 1
    # the sustained-clock ratios are set in the file and cited there (a measurement, or ASSUMED/UNVERIFIED)
    text = (zoo_dir("hardware") / f"{hw.name}.yaml").read_text()
    for fld in ("sustained_gemm", "sustained_attention"):
        assert f"\n  {fld}: " in text, f"{hw.name}: kernel_model.{fld} is not set"
        assert any(line.lstrip().startswith("#") and fld in line for line in text.splitlines()), \
            f"{hw.name}: no comment cites {fld}"


@pytest.mark.parametrize("name,gb", sorted(EXPECTED_GB.items()))
def test_hbm_gib_is_the_datasheet_gb_in_gib(name, gb):
    assert load_hardware(name).hbm_gib == pytest.approx(gb * 1e9 / 2**30, abs=0.01)


@pytest.mark.parametrize("name", [n for n in BLACKWELL if n in ZOO])
def test_blackwell_has_fp8_mxfp8_and_nvfp4(name):
    h = load_hardware(name)
    assert h.peak_tflops("mxfp8") == h.peak_tflops("fp8") == 2 * h.peak_tflops("bf16")
    assert h.peak_tflops("nvfp4") >= 2 * h.peak_tflops("fp8")


def test_nvl72_is_one_72_gpu_domain_of_4_gpu_trays():
    for name in ("gb200_nvl72", "gb300_nvl72"):
        h = load_hardware(name)
        assert (h.nvlink_domain_size, h.gpus_per_node) == (72, 4)


def test_datasheet_spot_checks():
    a100 = load_hardware("a100_80gb")
    assert (a100.peak_tflops_bf16, a100.nvlink_gbps, a100.scaleout_gbps) == (312, 300, 25)
    mi = load_hardware("mi300x")
    assert (mi.peak_tflops_bf16, mi.peak_tflops_fp8, mi.hbm_tbps) == (1307.4, 2614.9, 5.3)
    assert mi.peak_tflops_mxfp8 is None and mi.peak_tflops_nvfp4 is None
    h200 = load_hardware("h200")
    h100 = load_hardware("h100_sxm")
    assert h200.peak_tflops_bf16 == h100.peak_tflops_bf16  # same GH100 die, more HBM
    assert h200.hbm_gib > h100.hbm_gib and h200.hbm_tbps > h100.hbm_tbps


def test_h100_variants_carry_their_datasheet_columns():
    """H100 datasheet: NVL 1,671 / PCIe 1,513 TFLOP/s BF16 with sparsity (halved here), 3.9 / 2.0 TB/s, NVLink
    bridges of 600 GB/s both ways joining pairs; torchtitan's Grand Teton H100: 96 GB HBM2e at 2.4 TB/s, 400 Gb/s
    per GPU, 8 GPUs on NVLink, peak between the SXM5 (989) and NVL (835.5) figures."""
    nvl, pcie, gt = (load_hardware(n) for n in ("h100_nvl", "h100_pcie", "h100_grand_teton"))
    sxm = load_hardware("h100_sxm")
    assert (nvl.peak_tflops_bf16, nvl.peak_tflops_fp8, nvl.hbm_tbps) == (835.5, 1670.5, 3.9)
    assert (pcie.peak_tflops_bf16, pcie.peak_tflops_fp8, pcie.hbm_tbps) == (756.5, 1513, 2.0)
    for card in (nvl, pcie):
        assert (card.nvlink_domain_size, card.nvlink_gbps, card.host_link_gbps) == (2, 300, 64)
    assert nvl.peak_tflops_bf16 < gt.peak_tflops_bf16 < sxm.peak_tflops_bf16
    assert gt.peak_tflops_bf16 == pytest.approx(835 + (989 - 835) * (500 - 400) / (700 - 400), abs=0.5)
    assert (gt.hbm_tbps, gt.nvlink_domain_size, gt.scaleout_gbps) == (2.4, 8, 50)
    for card in (nvl, pcie, gt):
        assert "ASSUMED" in card.kernel_model.source     # H100 SXM fractions, not measured on this part


def test_power_capped_h100s_sustain_the_measured_rate_per_watt():
    """The sustained BF16 GEMM rate (peak x gemm x sustained_gemm) of the power-capped GH100 parts is the linear
    reading in board power of the measured MSMF of the same die (stas00/ml-engineering@fe12f4e4: H200 NVL 665
    TFLOP/s at 600 W, H200 SXM 755 at ~686 W drawn), at each part's cap: Grand Teton 500 W, NVL 400 W, PCIe 350 W.
    A lower cap never sustains more, and no capped part sustains more than the 700 W SXM."""
    def sustained(h):
        return h.peak_tflops_bf16 * h.kernel_model.gemm["bf16"] * h.kernel_model.sustained_gemm

    def measured_line(watts):
        return 665 + (755 - 665) * (watts - 600) / (686 - 600)

    parts = {name: load_hardware(name) for name in ("h100_pcie", "h100_nvl", "h100_grand_teton", "h100_sxm")}
    for name, watts in (("h100_grand_teton", 500), ("h100_nvl", 400), ("h100_pcie", 350)):
        assert sustained(parts[name]) == pytest.approx(measured_line(watts), rel=0.005), name
    # attention runs at the SM clock the GEMMs sustain (assumed, cited in each file): that clock is the sustained GEMM
    # rate over the SXM's short-run best (794.5 TFLOP/s at its 1980 MHz boost); the attention figures are fractions of
    # 989 TFLOP/s at a locked 1830 MHz, applied to each file's own peak
    for name in ("h100_grand_teton", "h100_nvl"):
        h = parts[name]
        clock_mhz = 1980 * sustained(h) / 794.5
        assert h.peak_tflops_bf16 * h.kernel_model.sustained_attention == pytest.approx(989 * clock_mhz / 1830,
                                                                                       rel=0.005), name
    rates = [sustained(h) for h in parts.values()]
    assert rates == sorted(rates)


def test_blackwell_sustains_the_measured_rate_at_its_board_power():
    """The sustained FP8 GEMM rate (peak x gemm x sustained_gemm) of each Blackwell part is its long-run measurement
    where one exists: B200 MSMF 2795.7 TFLOP/s at 1000 W (stas00/ml-engineering@082816f9), GB200 2906.9 at 1200 W
    and GB300 3308.5 at 1400 W (the same cuBLASLt benchmark after 10,000 warm-up iterations: Azure/AI-benchmarking-
    guide@2a370be6, egmsft/AI-benchmarking-guide@18e80a21). B300, not measured, stays on the line through B200 and
    GB200 at its 1100 W, and its attention gains what its GEMMs gain over B200 (the clock they share). GB300's
    attention runs at its GEMMs' sustained ratio (its measured gain over GB200 carries the die as well as the power,
    which its short-run attention figures already carry). More board power never sustains less. GB300's NVFP4 GEMM
    sustains its own measurement (8640.3 TFLOP/s at 16384^3, the same benchmark)."""
    def sustained(h, precision="fp8"):
        return h.peak_tflops(precision) * h.kernel_model.gemm[precision] * h.kernel_model.sustained_gemm

    def measured_line(watts):
        return 2795.7 + (2906.9 - 2795.7) * (watts - 1000) / (1200 - 1000)

    watts = {"b200": 1000, "b300": 1100, "gb200_nvl72": 1200, "gb300_nvl72": 1400}
    parts = {name: load_hardware(name) for name in watts}
    for name in ("b200", "b300", "gb200_nvl72"):
        assert sustained(parts[name]) == pytest.approx(measured_line(watts[name]), rel=0.005), name
    gb300 = parts["gb300_nvl72"]
    assert sustained(gb300) == pytest.approx(3308.5, rel=0.005)
    assert sustained(gb300, "nvfp4") == pytest.approx(8640.3, rel=0.005)
    assert gb300.kernel_model.sustained_attention == gb300.kernel_model.sustained_gemm
    b, u = parts["b200"], parts["b300"]
    assert u.kernel_model.sustained_attention == pytest.approx(
        b.kernel_model.sustained_attention * sustained(u) / sustained(b), rel=0.005)
    by_power = [sustained(parts[n]) for n in sorted(watts, key=watts.get)]
    assert by_power == sorted(by_power)
    for h in parts.values():
        assert 0 < h.kernel_model.sustained_gemm <= 1 and 0 < h.kernel_model.sustained_attention <= 1


def test_blackwell_ultra_attention_carries_its_measured_gain_over_blackwell():
    """Blackwell Ultra (B300, GB300) doubles the SFU exponential rate at the same tensor-core peak. Measured with the
    same cuDNN on GB300 and GB200 (NVIDIA/cudnn-frontend@3929da2e llama3.1 results, BF16 causal, head dim 128,
    s = 8192): forward 1856 / 1574, backward 1435 / 1332 TFLOP/s. Each Ultra file's short-run attention figures are
    its Blackwell sibling's times that gain, and its FP8 attention stays the measured MXFP8/BF16 multiple of them."""
    for base, ultra in (("b200", "b300"), ("gb200_nvl72", "gb300_nvl72")):
        b, u = load_hardware(base).kernel_model, load_hardware(ultra).kernel_model
        assert u.attention_fwd == pytest.approx(b.attention_fwd * 1856 / 1574, abs=0.001), ultra
        assert u.attention_bwd == pytest.approx(b.attention_bwd * 1435 / 1332, abs=0.001), ultra
        assert u.attention_fwd > b.attention_fwd and u.attention_bwd > b.attention_bwd
        h = load_hardware(ultra)
        assert u.attention_fp8 * h.peak_tflops_fp8 == pytest.approx(
            u.attention_fwd * h.peak_tflops_bf16 * 2570 / 1856, rel=0.005), ultra


@pytest.mark.parametrize("precision", ["fp8", "fp8_block", "mxfp8", "nvfp4"])
def test_a100_has_no_fp8_tensor_cores(precision):
    with pytest.raises(AutoparInputError, match=rf"a100_80gb.*no {precision}"):
        load_hardware("a100_80gb").peak_tflops(precision)


@pytest.mark.parametrize("name", ["h100_sxm", "h200", "mi300x", "h100_nvl", "h100_pcie", "h100_grand_teton"])
def test_no_block_scaled_formats_before_blackwell(name):
    h = load_hardware(name)
    assert h.peak_tflops("fp8") > 0
    for precision in ("mxfp8", "nvfp4"):
        with pytest.raises(AutoparInputError, match=f"peak_tflops_{precision}"):
            h.peak_tflops(precision)


def test_every_training_precision_resolves_or_raises_input_error(hw):
    for precision in PRECISIONS:
        try:
            assert hw.peak_tflops(precision) > 0
        except AutoparInputError as err:
            assert precision.replace("_block", "") in str(err)


def test_round_trip_through_dump_spec(hw, tmp_path):
    path = tmp_path / f"{hw.name}.yaml"
    dump_spec(hw, path, header="# round-trip copy")
    assert path.read_text().startswith("# round-trip copy\n")
    assert load_hardware(path) == hw
    assert not list(tmp_path.glob("*.tmp")), "dump_spec must not leave its temporary file behind"


def test_round_trip_keeps_measured_collectives_and_efficiency(tmp_path):
    base = load_hardware("h100_sxm")
    spec = base.model_copy(update={
        "measured_busbw_gbps": MeasuredCollectives(all_reduce={2: 23.1, 4: 46.3, 8: 80.1}, all_to_all={8: 41.5},
                                                   message_mib=128),
        "efficiency": base.efficiency.model_copy(update={"moe_dropless_imbalance": 1.21, "layer_overhead_us": 55.0}),
        "kernel_model": base.kernel_model.model_copy(update={"gemm": {"bf16": 0.55}, "nvlink": 0.62}),
    })
    path = tmp_path / "calibrated.yaml"
    dump_spec(spec, path)
    back = load_hardware(path)
    assert back == spec
    assert back.measured_busbw_gbps.all_reduce == {2: 23.1, 4: 46.3, 8: 80.1}  # int keys survive YAML
    # Dumping over an existing file replaces it.
    dump_spec(base, path)
    assert load_hardware(path) == base


@pytest.mark.parametrize("field, value", [("attention_head_dim", {}), ("attention_head_dim_bwd", {}),
                                          ("attention_head_dim", {128: 9.0}), ("attention_head_dim_bwd", {192: 0.0})])
def test_head_dim_tables_are_non_empty_and_bounded(field, value):
    # an empty table had no point to interpolate from (an IndexError deep in the kernel model); a factor is bounded
    # by (0, 4], the range autopar.measure.kernel_tables fits it in
    from pydantic import ValidationError
    hw = load_hardware("b200")
    data = hw.kernel_model.model_dump()
    with pytest.raises(ValidationError, match=field):
        type(hw.kernel_model).model_validate({**data, field: value})
