"""``--emit megatron`` output parsed with Megatron-LM's own argument definitions (a fixture generated from the
pinned commit), and the cross-flag rules of its validate_args / TransformerConfig checked on the parsed values."""

from __future__ import annotations

import subprocess

import pytest

from autopar.emit import emit
from autopar.emit.megatron import MEGATRON_TARGET, megatron_args, megatron_launch
from autopar.errors import AutoparInputError
from autopar.specs.layout import Layout, resolve_layout
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

from .conftest import DSV3, H100, LLAMA3_8B, LLAMA3_70B, NVL72, TRAIN
from .megatron_parser import ParseError, load_fixture, parse

# The hardware files' calibrated overlaps (hardware/h100_sxm.yaml): DP 100%, TP 90%, EP 48% hidden.
H100_CAL = H100
NVL72_CAL = NVL72
QWEN3_30B = ModelSpec(name="qwen3_30b_a3b", num_layers=48, hidden_size=2048, ffn_hidden_size=6144,
                      num_attention_heads=32, num_kv_heads=4, head_dim=128, vocab_size=151936,
                      moe={"num_experts": 128, "top_k": 8, "expert_ffn_hidden_size": 768})


DSV3_STAGES = (3,) + (4,) * 14 + (2,)   # 61 layers on PP16 (the heuristic's split, tests/emit/conftest.py)


def _resolved(model, gpus, training=TRAIN, **kw):
    return resolve_layout(Layout(**kw), model, training, gpus)


def check_megatron_rules(ns) -> None:
    """Cross-flag assertions of Megatron-LM d98e8a64ddf3 (megatron/training/arguments.py validate_args and
    megatron/core/transformer/transformer_config.py __post_init__) that autopar's flags can trip."""
    if ns.overlap_param_gather:
        assert ns.use_distributed_optimizer or ns.use_megatron_fsdp
        assert ns.overlap_grad_reduce
    if ns.tp_comm_overlap:
        assert ns.sequence_parallel
    if ns.use_torch_fsdp2:
        assert ns.pipeline_model_parallel_size == 1 and ns.expert_model_parallel_size == 1
        assert not ns.use_distributed_optimizer and ns.gradient_accumulation_fusion is False and not ns.fp16
    if ns.recompute_granularity == "selective":
        assert ns.recompute_method is None
    assert ns.cpu_offloading_num_layers in (None, 0), "layer-level offloading is refused with PP or recompute"
    if ns.fine_grained_activation_offloading:
        assert ns.offload_modules
        assert ns.recompute_granularity != "full"
        if "attn_proj" in ns.offload_modules:
            assert "core_attn" in ns.offload_modules
        if ns.recompute_modules and "moe" in ns.recompute_modules:
            assert not {"moe_act", "expert_fc1"} & set(ns.offload_modules)
    if ns.overlap_moe_expert_parallel_comm:
        assert ns.expert_model_parallel_size > 1
        assert ns.moe_token_dispatcher_type in ("alltoall", "flex")
        assert ns.recompute_granularity != "full" and ns.recompute_method is None
        assert not (ns.recompute_modules and "moe" in ns.recompute_modules)
        assert ns.bf16 or ns.fp16
        if ns.pipeline_model_parallel_size > 1:
            hybrid_vpp = ns.hybrid_layer_pattern and ns.hybrid_layer_pattern.count("|") + 1 > \
                ns.pipeline_model_parallel_size   # validate_args derives VPP from the pattern's '|' segments
            assert ns.num_layers_per_virtual_pipeline_stage or ns.pipeline_model_parallel_layout or hybrid_vpp
    vpp_flags = [ns.num_layers_per_virtual_pipeline_stage, ns.num_virtual_stages_per_pipeline_rank,
                 ns.pipeline_model_parallel_layout]
    assert sum(v is not None for v in vpp_flags) <= 1
    if ns.num_layers_per_virtual_pipeline_stage is not None:
        assert ns.decoder_first_pipeline_num_layers is None and ns.decoder_last_pipeline_num_layers is None
    assert not (ns.fp8 and ns.fp4)
    assert not (ns.fp16 and ns.bf16)


def test_fixture_names_its_source():
    fx = load_fixture()
    assert len(fx["source"]["commit"]) == 40 and fx["command"].startswith("python tools/gen_megatron_args.py")
    assert fx["source"]["megatron_core_version"] in MEGATRON_TARGET
    assert fx["source"]["commit"][:12] in MEGATRON_TARGET


def test_parser_rejects_what_megatron_rejects():
    """The rebuilt parser is strict: a retired flag, a bad choice and a wrong type all fail."""
    with pytest.raises(ParseError):
        parse(["--cpu-offloading"])               # not a Megatron-LM flag (only --cpu-offloading-num-layers)
    with pytest.raises(ParseError):
        parse(["--moe-token-dispatcher-type", "a2a"])
    with pytest.raises(ParseError):
        parse(["--tensor-model-parallel-size", "two"])
    with pytest.raises(ParseError):
        parse(["--tensor-model"])                 # no abbreviations
    assert parse(["--moe-token-dispatcher-type", "flex"]).moe_token_dispatcher_type == "flex"


CASES = {
    "dsv3_nvl72": lambda: (_resolved(DSV3, 1024, tp=2, pp=16, ep=64, recompute="selective", stage_layers=DSV3_STAGES),
                           DSV3, TRAIN, NVL72_CAL),
    "dsv3_vpp_offload": lambda: (_resolved(DSV3, 1024, tp=2, pp=16, vpp=2, ep=64, recompute="layernorm,moe_act",
                                           offload_activations=0.5, stage_layers=DSV3_STAGES), DSV3, TRAIN, NVL72_CAL),
    "llama70_vpp": lambda: (_resolved(LLAMA3_70B, 64, tp=8, pp=4, vpp=2), LLAMA3_70B, TRAIN, H100_CAL),
    "llama70_full_fp8": lambda: (_resolved(LLAMA3_70B, 64, tp=4, pp=4, recompute="full"), LLAMA3_70B,
                                 TRAIN.model_copy(update={"precision": "fp8"}), H100_CAL),
    "llama8_fsdp": lambda: (_resolved(LLAMA3_8B, 16, fsdp=True, hsdp_shard=8), LLAMA3_8B, TRAIN, H100_CAL),
    "llama8_ddp_nosp": lambda: (_resolved(LLAMA3_8B, 8, tp=2, zero_stage=0, sequence_parallel=False), LLAMA3_8B,
                                TRAIN.model_copy(update={"grad_dtype": "fp32"}), H100_CAL),
    "llama8_offload_pp": lambda: (_resolved(LLAMA3_8B, 8, tp=2, pp=4, stage_layers=(7, 9, 9, 7),
                                            offload_activations=1.0), LLAMA3_8B, TRAIN, H100_CAL),
    "qwen3_moe_mxfp8": lambda: (_resolved(QWEN3_30B, 64, pp=2, ep=8, recompute="moe"), QWEN3_30B,
                                TRAIN.model_copy(update={"precision": "mxfp8"}), H100_CAL),
    "llama8_nvfp4_cp": lambda: (_resolved(LLAMA3_8B, 16, tp=2, cp=2), LLAMA3_8B,
                                TRAIN.model_copy(update={"precision": "nvfp4"}), H100_CAL),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_emitted_argv_parses_with_megatrons_definitions(case):
    layout, model, training, hw = CASES[case]()
    launch = megatron_launch(layout, model, training, hw)
    ns = parse(launch.args)
    check_megatron_rules(ns)
    # the layout itself survives the round trip
    assert (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size, ns.context_parallel_size) == \
        (layout.tp, layout.pp, layout.cp)
    assert (ns.micro_batch_size, ns.global_batch_size, ns.seq_length) == \
        (layout.micro_batch, training.global_batch, training.seq_len)
    if model.is_moe:
        assert (ns.expert_model_parallel_size, ns.expert_tensor_parallel_size) == (layout.ep, layout.etp)
        assert ns.moe_token_dispatcher_type == "alltoall" and ns.moe_grouped_gemm
    # the overlaps the hardware file counts are switched on wherever Megatron allows them
    if layout.dp > 1 or (model.is_moe and layout.edp > 1):
        assert ns.overlap_grad_reduce
        assert ns.overlap_param_gather == (layout.zero_stage >= 1)
    if layout.tp > 1 and layout.sp:
        assert ns.tp_comm_overlap
    if layout.tp > 1 and not layout.sp:
        assert any("sequence parallel" in n for n in launch.notes)


def test_overlaps_follow_the_training_switches():
    layout = _resolved(LLAMA3_70B, 64, tp=8, pp=4, vpp=2)
    off = TRAIN.model_copy(update={"tp_comm_overlap": False, "dp_comm_overlap": False, "ep_comm_overlap": False})
    ns = parse(megatron_args(layout, LLAMA3_70B, off, H100))
    assert not (ns.overlap_grad_reduce or ns.overlap_param_gather or ns.tp_comm_overlap)
    ns = parse(megatron_args(layout, LLAMA3_70B, TRAIN, H100_CAL))
    assert ns.overlap_grad_reduce and ns.overlap_param_gather and ns.tp_comm_overlap


def test_ep_overlap_needs_virtual_stages_with_pp():
    flat = _resolved(DSV3, 1024, tp=2, pp=16, ep=64, stage_layers=DSV3_STAGES)
    launch = megatron_launch(flat, DSV3, TRAIN, NVL72_CAL)
    assert not parse(launch.args).overlap_moe_expert_parallel_comm
    assert any("virtual pipeline stages" in n and "exposed" in n for n in launch.notes)
    inter = _resolved(DSV3, 1024, tp=2, pp=16, vpp=2, ep=64, stage_layers=DSV3_STAGES)
    ns = parse(megatron_args(inter, DSV3, TRAIN, NVL72_CAL))
    assert ns.overlap_moe_expert_parallel_comm and ns.pipeline_model_parallel_layout


def test_offload_uses_the_fine_grained_path_and_refuses_full_recompute():
    layout = _resolved(LLAMA3_70B, 64, tp=8, pp=4, offload_activations=0.5)
    launch = megatron_launch(layout, LLAMA3_70B, TRAIN, H100_CAL)
    ns = parse(launch.args)
    assert ns.fine_grained_activation_offloading and ns.activation_offload_fraction == 0.5
    assert launch.env["NVTE_CPU_OFFLOAD_V1"] == "1"
    assert "expert_fc1" not in ns.offload_modules            # dense model
    moe = megatron_launch(_resolved(QWEN3_30B, 64, pp=2, ep=8, recompute="moe", offload_activations=1.0),
                          QWEN3_30B, TRAIN, H100_CAL)
    assert not {"expert_fc1", "moe_act"} & set(parse(moe.args).offload_modules)
    with pytest.raises(AutoparInputError, match="full recompute"):
        megatron_args(_resolved(LLAMA3_70B, 64, tp=8, pp=4, recompute="full", offload_activations=0.5),
                      LLAMA3_70B, TRAIN, H100_CAL)


def test_emitted_text_is_a_bash_array_naming_the_target(dsv3_layout):
    text = emit("megatron", dsv3_layout, DSV3, TRAIN, 1024, NVL72_CAL)
    assert MEGATRON_TARGET in text
    launch = megatron_launch(dsv3_layout, DSV3, TRAIN, NVL72_CAL)
    out = subprocess.run(["bash", "-c", text + 'printf "%s\\n" "${AUTOPAR_MEGATRON_ARGS[@]}"; '
                          'echo "CDMC=$CUDA_DEVICE_MAX_CONNECTIONS"'],
                         capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert lines[:-1] == launch.args
    assert lines[-1] == "CDMC=" + launch.env.get("CUDA_DEVICE_MAX_CONNECTIONS", "")


def test_tp_overlap_follows_the_training_switch():
    """TrainingSpec.tp_comm_overlap off: the prediction exposes all TP communication, so nothing asks for overlap."""
    layout = _resolved(LLAMA3_70B, 64, tp=8, pp=4, vpp=2)
    off = TRAIN.model_copy(update={"tp_comm_overlap": False})
    assert not parse(megatron_args(layout, LLAMA3_70B, off, H100_CAL)).tp_comm_overlap
    assert parse(megatron_args(layout, LLAMA3_70B, TRAIN, H100_CAL)).tp_comm_overlap
