"""issue 12 item 4: expert parallel across NVLink domains is in solve's default space; TP is not."""

from __future__ import annotations

import pytest

from autopar.search.space import SearchOptions, build_space
from autopar.specs.layout import Layout, check_layout
from autopar.specs.loaders import load_hardware, load_model
from autopar.specs.training import TrainingSpec

DSV3 = load_model("deepseek_v3")
H100 = load_hardware("h100_sxm")
TRAIN = TrainingSpec(seq_len=4096, global_batch=1920)


@pytest.mark.parametrize("gpus, tp, pp, ep", [
    (1024, 2, 16, 64),   # DeepSeek-V3 technical report (arXiv 2412.19437 sec. 3.1): PP16, EP64 over 8 nodes
    (256, 1, 8, 32),     # NVIDIA Megatron-Core DeepSeek-V3 recipe on H100: TP1 PP8 EP32
])
def test_published_deepseek_v3_layouts_are_in_the_default_space(gpus, tp, pp, ep):
    space = build_space(DSV3, H100, TRAIN, gpus, SearchOptions())
    assert (tp, 1, pp, ep, 1) in space.meshes
    mi = space.meshes.index((tp, 1, pp, ep, 1))
    layout = space.layout(mi, 1, "full", 1, 1)
    assert check_layout(layout, DSV3, TRAIN, gpus, H100, allow_cross_domain_tp=False) == []


def test_tp_and_etp_stay_inside_the_domain_by_default():
    found = check_layout(Layout(tp=16, ep=8), DSV3, TRAIN, 256, H100, allow_cross_domain_tp=False)
    assert any("tp (16) exceeds the NVLink domain (8 GPUs on h100_sxm)" in p for p in found)
    found = check_layout(Layout(ep=2, etp=16), DSV3, TRAIN, 256, H100, allow_cross_domain_tp=False)
    assert any("etp (16) exceeds the NVLink domain" in p for p in found)
    assert not any("NVLink" in p for p in check_layout(Layout(tp=16, ep=8), DSV3, TRAIN, 256, H100,
                                                       allow_cross_domain_tp=True))
