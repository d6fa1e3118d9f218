"""``--emit megatron`` for hybrid models: pretrain_hybrid.py flags parsed with Megatron-LM's own argument definitions,
the cross-flag rules of its validate_args / select_pipeline_segment for ``--hybrid-layer-pattern`` checked on the
parsed values, patterns compared with the ones NVIDIA's own recipes write, and the refusals."""

from __future__ import annotations

import subprocess
import sys

import pytest

from autopar.emit import emit
from autopar.emit.megatron import megatron_launch
from autopar.errors import AutoparInputError
from autopar.specs.layout import Layout, resolve_layout
from autopar.specs.loaders import load_model
from autopar.specs.model import ModelSpec

from .conftest import TRAIN
from .megatron_parser import parse
from .test_megatron_parser import H100_CAL, check_megatron_rules

# Megatron-LM d98e8a64ddf3 megatron/core/models/hybrid/hybrid_layer_allocation.py, Symbols.VALID_LAYERS
VALID_SYMBOLS = set("MG*D+-E")

# The same models' patterns as NVIDIA-NeMo/Megatron-Bridge 067f987df03b writes them in its recipes
# (src/megatron/bridge/recipes/nemotronh/h100/nemotronh.py lines 46 and 466, nemotron_3_nano.py line 80): an
# independent source for autopar's zoo layer_pattern / mlp_pattern and the symbol mapping.
BRIDGE_PATTERNS = {
    "nemotron_h_8b": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "nemotron_h_56b": ("M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-"
                       "M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"),
    "nemotron3_nano_30b_a3b": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
}


def _launch(name, gpus, **kw):
    model = load_model(name)
    layout = resolve_layout(Layout(**kw), model, TRAIN, gpus)
    return layout, model, megatron_launch(layout, model, TRAIN, H100_CAL)


def check_hybrid_rules(ns, layout) -> None:
    """validate_args (arguments.py, '=== Hybrid layer pattern') and select_pipeline_segment on the parsed flags."""
    pattern = ns.hybrid_layer_pattern
    assert pattern and ns.hybrid_override_pattern is None          # the deprecated alias is not used
    assert set(pattern) <= VALID_SYMBOLS | {"|"}
    assert not ("*" in pattern and ("+" in pattern or "D" in pattern))
    assert ns.num_layers_per_virtual_pipeline_stage is None and ns.num_virtual_stages_per_pipeline_rank is None
    assert ns.pipeline_model_parallel_layout is None
    assert not ns.account_for_embedding_in_pipeline_split and not ns.account_for_loss_in_pipeline_split
    segments = pattern.split("|")
    if "|" in pattern:
        assert ns.decoder_first_pipeline_num_layers is None and ns.decoder_last_pipeline_num_layers is None
    if ns.pipeline_model_parallel_size > 1:
        assert len(segments) > 1, "the pipe-free form with PP > 1 is deprecated and splits evenly only"
    assert len(segments) % ns.pipeline_model_parallel_size == 0
    vpp = len(segments) // ns.pipeline_model_parallel_size
    assert vpp == layout.vpp
    assert ns.spec == ["megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec"]


@pytest.mark.parametrize("name", sorted(BRIDGE_PATTERNS))
def test_zoo_hybrid_patterns_match_nvidias_recipes(name):
    layout, model, launch = _launch(name, 64, tp=2)
    ns = parse(launch.args)
    check_megatron_rules(ns)
    check_hybrid_rules(ns, layout)
    assert launch.script == "pretrain_hybrid.py"
    assert ns.hybrid_layer_pattern == BRIDGE_PATTERNS[name]
    m = model.mixers[next(k for k, v in model.mixers.items() if v.kind == "mamba2")]
    assert (ns.mamba_num_heads, ns.mamba_head_dim, ns.mamba_state_dim, ns.mamba_num_groups) == \
        (m.num_heads, m.head_dim, m.state_size, m.n_groups)


def test_nemotron_h_mamba_shape_matches_bridge_recipe():
    """Bridge's NemotronH 56B recipe (nemotronh.py line 466ff): mamba_state_dim=256, mamba_num_heads=256."""
    ns = parse(_launch("nemotron_h_56b", 64, tp=8)[2].args)
    assert (ns.mamba_state_dim, ns.mamba_num_heads) == (256, 256)


@pytest.mark.parametrize("kw", [dict(tp=2, pp=4), dict(tp=2, pp=4, vpp=2), dict(tp=1, pp=2, vpp=3)])
def test_pipeline_segments_carry_autopars_stage_split(kw):
    """Segment v·pp + i is virtual stage v of rank i (select_pipeline_segment); each rank's Megatron layers are the
    symbols of autopar's own (cost-balanced) stage_layers."""
    layout, model, launch = _launch("nemotron_h_8b", 64, **kw)
    ns = parse(launch.args)
    check_megatron_rules(ns)
    check_hybrid_rules(ns, layout)
    segments = ns.hybrid_layer_pattern.split("|")
    pp = layout.pp
    per_rank = ["".join(segments[v * pp + i] for v in range(layout.vpp)) for i in range(pp)]
    full = BRIDGE_PATTERNS["nemotron_h_8b"]
    assert "".join(segments) == full
    start = 0
    for i, n in enumerate(layout.stage_layers):
        # autopar layers [start, start+n) -> their Megatron symbols (one symbol per zoo layer for Nemotron-H)
        assert len(per_rank[i]) == n
        start += n


def test_qwen3_next_maps_gated_deltanet_and_the_attention_gate():
    layout, model, launch = _launch("qwen3_next_80b_a3b", 256, tp=4, pp=4, vpp=2, ep=8)
    ns = parse(launch.args)
    check_megatron_rules(ns)
    check_hybrid_rules(ns, layout)
    pattern = ns.hybrid_layer_pattern.replace("|", "")
    # one autopar layer (token mixer + MoE) is two Megatron layers: 36 GDN + 12 attention, each followed by E
    assert len(pattern) == 2 * model.num_layers and pattern == "GEGEGE*E" * 12
    assert (ns.linear_num_key_heads, ns.linear_num_value_heads, ns.linear_key_head_dim, ns.linear_value_head_dim,
            ns.linear_conv_kernel_dim) == (16, 32, 128, 128, 4)
    assert ns.attention_output_gate
    assert ns.expert_model_parallel_size == 8


def test_gated_deltanet_heads_must_divide_tp_times_cp():
    """TransformerConfig.__post_init__: linear_num_key_heads (16) % (tp·cp) == 0. The layout rules refuse it under
    Megatron's all-to-all CP (the default ``linear_cp``); the emitter refuses it even for a state-passing spec."""
    with pytest.raises(AutoparInputError, match=r"num_heads \(16\) not divisible by tp·cp = 8·4"):
        _launch("qwen3_next_80b_a3b", 256, tp=8, cp=4, ep=8)
    model = load_model("qwen3_next_80b_a3b")
    passing = TRAIN.model_copy(update={"linear_cp": "state_pass"})
    layout = resolve_layout(Layout(tp=8, cp=4, ep=8), model, passing, 256)
    with pytest.raises(AutoparInputError, match=r"divisible by tp·cp = 8·4 = 32"):
        megatron_launch(layout, model, passing, H100_CAL)


@pytest.mark.parametrize("name, kind", [("jamba_v0_1", "mamba1"), ("kimi_linear_48b_a3b", "kda"),
                                        ("report_hybrid_17b", "gla"), ("falcon_h1_7b", "parallel mixers")])
def test_mixers_megatron_cannot_build_are_refused(name, kind):
    model = load_model(name)
    layout = resolve_layout(Layout(tp=1), model, TRAIN, 64)
    with pytest.raises(AutoparInputError, match=kind) as err:
        megatron_launch(layout, model, TRAIN, H100_CAL)
    assert "Megatron" in str(err.value)


def test_mamba_shape_megatron_cannot_express_is_refused():
    base = load_model("nemotron_h_8b")
    model = ModelSpec(**{**base.model_dump(), "mixers": {"mamba": {**base.mixers["mamba"].model_dump(),
                                                                   "conv_kernel": 3}}})
    layout = resolve_layout(Layout(tp=2), model, TRAIN, 64)
    with pytest.raises(AutoparInputError, match="d_conv=4"):
        megatron_launch(layout, model, TRAIN, H100_CAL)


def test_emitted_text_names_the_hybrid_script():
    model = load_model("nemotron_h_8b")
    text = emit("megatron", Layout(tp=2, pp=2), model, TRAIN, 64, H100_CAL)
    assert "pretrain_hybrid.py" in text and "pretrain_gpt.py" not in text
    out = subprocess.run(["bash", "-c", text + 'printf "%s\\n" "${AUTOPAR_MEGATRON_ARGS[@]}"'],
                         capture_output=True, text=True, check=True)
    assert "--hybrid-layer-pattern" in out.stdout.splitlines()


def test_solve_prints_a_note_and_tune_refuses_up_front():
    """`solve --emit megatron` on a model Megatron cannot build: the table still prints, with a note naming the
    mixer; `tune --emit` (whose plan is the run's output) stops with exit 2 before tuning."""
    cmd = [sys.executable, "-m", "autopar.cli.main"]
    out = subprocess.run(cmd + ["solve", "--model", "falcon_h1_7b", "--gpus", "8", "--emit", "megatron",
                                "--top-k", "1"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "note: no megatron settings" in out.stdout and "parallel mixers 'attention+mamba'" in out.stdout
    assert "AUTOPAR_MEGATRON_ARGS" not in out.stdout and "Fastest layouts" in out.stdout
    out = subprocess.run(cmd + ["tune", "--model", "jamba_v0_1", "--gpus", "8", "--emit", "bridge"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.startswith("autopar: error: --emit bridge: Megatron-LM cannot train")
    assert "mamba1" in out.stderr and "Traceback" not in out.stderr


def test_solve_emits_the_fastest_layout_the_launcher_can_run(monkeypatch, capsys):
    """A layout the launcher refuses is skipped for the next ranked one, with the reason; Bridge on a hybrid is
    searched without virtual stages (its HybridModelProvider has none)."""
    import autopar.emit as E
    from autopar.cli.main import main
    real = E.emit
    calls = []

    def first_refused(kind, layout, *a, **kw):
        calls.append(layout)
        if len(calls) == 1:
            raise AutoparInputError("refused for the test")
        return real(kind, layout, *a, **kw)

    monkeypatch.setattr(E, "emit", first_refused)
    assert main(["solve", "--model", "llama3_8b", "--gpus", "8", "--emit", "megatron", "--top-k", "3"]) == 0
    out = capsys.readouterr().out
    assert "settings for #2, the fastest layout it can run; refused: #1: refused for the test" in " ".join(out.split())
    assert "AUTOPAR_MEGATRON_ARGS" in out and len(calls) == 2
    monkeypatch.setattr(E, "emit", real)
    assert main(["solve", "--model", "nemotron_h_8b", "--gpus", "64", "--pp", "2", "--emit", "bridge",
                 "--top-k", "2"]) == 0
    out = capsys.readouterr().out
    assert "AUTOPAR_BRIDGE_OVERRIDES" in out and "model.pipeline_model_parallel_size=2" in out
    assert "PP2v" not in out and "virtual pipeline stages left out of the search" in out


def test_nemotron3_super_mtp_depth_follows_the_pattern_after_a_slash():
    """Nemotron 3 Super (LatentMoE, one MTP module of an attention and an MoE sub-layer): Megatron's hybrid pattern
    carries the MTP depth after '/' with --mtp-num-layers, as NVIDIA's own Super recipe writes it."""
    import json
    from pathlib import Path

    from autopar.emit.bridge import bridge_overrides
    from autopar.specs.hf_config import model_from_hf_config

    from .test_bridge import check_bridge_keys

    cfg = Path(__file__).parents[1] / "specs" / "fixtures" / "hf" / "nemotron-3-super-120b-a12b.json"
    model, _ = model_from_hf_config(json.loads(cfg.read_text()), name="nemotron3_super", where=str(cfg))
    layout = resolve_layout(Layout(tp=2, ep=32), model, TRAIN, 64)
    ns = parse(megatron_launch(layout, model, TRAIN).args)
    assert ns.hybrid_layer_pattern.endswith("E/*E") and ns.hybrid_layer_pattern.count("/") == 1
    assert ns.mtp_num_layers == 1
    overrides, _ = bridge_overrides(layout, model, TRAIN)
    keys = check_bridge_keys(overrides, model)
    assert keys["model.mtp_num_layers"] == "1"
