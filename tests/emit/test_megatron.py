"""Megatron-LM arguments emitted for resolved layouts (flag names as in megatron/training/arguments.py)."""

from __future__ import annotations

import subprocess

import pytest

from autopar.emit.megatron import format_megatron, megatron_args, pipeline_layout_string, precision_args
from autopar.errors import AutoparInputError
from autopar.specs.launcher_rules import layout_stages
from autopar.specs.layout import Layout, resolve_layout
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

from .conftest import DSV3, LLAMA3_8B, LLAMA3_70B, TRAIN


def values(args: list[str], flag: str) -> list[str]:
    """The tokens following ``flag`` up to the next flag ([] when the flag is a switch, KeyError when absent)."""
    i = args.index(flag)
    out = []
    for token in args[i + 1:]:
        if token.startswith("--"):
            break
        out.append(token)
    return out


def unroll(layout_text: str) -> list[str]:
    """Megatron's parse of --pipeline-model-parallel-layout (autopar.specs.launcher_rules.layout_stages)."""
    return layout_stages(layout_text)


def value(args: list[str], flag: str) -> str:
    v = values(args, flag)
    assert len(v) == 1, (flag, v)
    return v[0]


def test_deepseek_v3_tp2_pp16_ep64(dsv3_layout):
    args = megatron_args(dsv3_layout, DSV3, TRAIN)
    assert value(args, "--tensor-model-parallel-size") == "2"
    assert value(args, "--pipeline-model-parallel-size") == "16"
    assert value(args, "--context-parallel-size") == "1"
    assert value(args, "--expert-model-parallel-size") == "64"
    assert value(args, "--expert-tensor-parallel-size") == "1"  # Megatron's default would be TP
    assert dsv3_layout.stage_layers == (3,) + (4,) * 14 + (2,)
    assert value(args, "--decoder-first-pipeline-num-layers") == "3"
    assert value(args, "--decoder-last-pipeline-num-layers") == "2"
    assert "--pipeline-model-parallel-layout" not in args
    assert "--num-layers-per-virtual-pipeline-stage" not in args
    assert "--sequence-parallel" in args and "--use-distributed-optimizer" in args
    assert value(args, "--micro-batch-size") == "1"
    assert value(args, "--global-batch-size") == "1024"
    assert value(args, "--seq-length") == "4096"
    assert value(args, "--recompute-granularity") == "selective"
    assert "--recompute-method" not in args  # Megatron rejects a method with selective granularity
    assert "--bf16" in args


def test_interleaved_even_pipeline(llama70_layout):
    args = megatron_args(llama70_layout, LLAMA3_70B, TRAIN)
    assert value(args, "--num-layers-per-virtual-pipeline-stage") == "10"  # 80 / (4·2)
    assert "--decoder-first-pipeline-num-layers" not in args
    assert "--expert-model-parallel-size" not in args  # dense model: no expert flags


def _resolved(model: ModelSpec, gpus: int, training: TrainingSpec = TRAIN, **kw) -> Layout:
    return resolve_layout(Layout(**kw), model, training, gpus)


def test_general_uneven_split_uses_the_layout_string():
    model = ModelSpec(name="twelve", num_layers=12, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=8,
                      vocab_size=32000, mtp_layers=1)
    layout = _resolved(model, 8, tp=2, pp=4, vpp=2, stage_layers=(2, 4, 4, 2))
    args = megatron_args(layout, model, TRAIN)
    text = value(args, "--pipeline-model-parallel-layout")
    assert text == "Et|t*2|t*2|t|t|t*2|t*2|tmL"
    # Unrolled, the layout holds every layer once, pp·vpp stages, embedding first, MTP then loss last.
    stages = unroll(text)
    assert len(stages) == 8 and sum(s.count("t") for s in stages) == 12
    assert "--num-layers-per-virtual-pipeline-stage" not in args


def test_layout_string_single_virtual_stage():
    layout = _resolved(LLAMA3_8B, 8, pp=4, stage_layers=(7, 9, 9, 7))
    assert pipeline_layout_string(layout, LLAMA3_8B) == "Et*7|t*9|t*9|t*7L"
    # only the first and last differ: Megatron's first/last flags are used instead of the layout string
    args = megatron_args(layout, LLAMA3_8B, TRAIN)
    assert value(args, "--decoder-first-pipeline-num-layers") == "7"
    layout = _resolved(LLAMA3_8B, 8, pp=4, stage_layers=(8, 7, 9, 8))
    assert value(megatron_args(layout, LLAMA3_8B, TRAIN), "--pipeline-model-parallel-layout") == "Et*8|t*7|t*9|t*8L"


@pytest.mark.parametrize("recompute,expected", [
    ("none", None),
    ("selective", ["--recompute-granularity", "selective"]),
    ("full", ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]),
    ("mlp,core_attn,layernorm", ["--recompute-granularity", "selective", "--recompute-modules", "core_attn",
                                 "layernorm", "mlp"]),
])
def test_recompute_flags(recompute, expected):
    args = megatron_args(_resolved(LLAMA3_8B, 8, tp=2, recompute=recompute), LLAMA3_8B, TRAIN)
    if expected is None:
        assert not any(a.startswith("--recompute") for a in args)
    else:
        i = args.index("--recompute-granularity")
        assert args[i:i + len(expected)] == expected


def test_sharding_flags():
    ddp = megatron_args(_resolved(LLAMA3_8B, 8, tp=2, zero_stage=0), LLAMA3_8B, TRAIN)
    assert "--use-distributed-optimizer" not in ddp and "--use-megatron-fsdp" not in ddp
    z2 = megatron_args(_resolved(LLAMA3_8B, 8, tp=2, zero_stage=2), LLAMA3_8B, TRAIN)
    assert "--use-distributed-optimizer" in z2
    fsdp = megatron_args(_resolved(LLAMA3_8B, 8, tp=2, fsdp=True), LLAMA3_8B, TRAIN)
    assert "--use-megatron-fsdp" in fsdp and value(fsdp, "--data-parallel-sharding-strategy") == "optim_grads_params"
    assert value(fsdp, "--ckpt-format") == "fsdp_dtensor" and "--use-distributed-optimizer" in fsdp
    hsdp = megatron_args(_resolved(LLAMA3_8B, 16, tp=2, hsdp_shard=2), LLAMA3_8B, TRAIN)
    assert value(hsdp, "--num-distributed-optimizer-instances") == "4"  # dp 8 / shard 2
    torch = megatron_args(_resolved(LLAMA3_8B, 8, tp=2, fsdp=True), LLAMA3_8B, TRAIN, fsdp_impl="torch")
    assert "--use-torch-fsdp2" in torch and "--use-megatron-fsdp" not in torch
    with pytest.raises(AutoparInputError, match="--use-torch-fsdp2"):
        megatron_args(_resolved(LLAMA3_8B, 8, pp=2, fsdp=True), LLAMA3_8B, TRAIN, fsdp_impl="torch")


@pytest.mark.parametrize("precision,expected", [
    ("bf16", ["--bf16"]),
    ("fp16", ["--fp16"]),
    ("fp8", ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "delayed"]),
    ("fp8_block", ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "blockwise"]),
    ("mxfp8", ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"]),
    ("nvfp4", ["--bf16", "--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]),
])
def test_precision_flags(precision, expected):
    assert precision_args(precision) == expected
    training = TrainingSpec(seq_len=4096, global_batch=1024, precision=precision)
    args = megatron_args(_resolved(LLAMA3_8B, 8, tp=2), LLAMA3_8B, training)
    assert args[-len(expected):] == expected


def test_no_sequence_parallel_flag_when_off():
    args = megatron_args(_resolved(LLAMA3_8B, 8, tp=2, sequence_parallel=False), LLAMA3_8B, TRAIN)
    assert "--sequence-parallel" not in args


def test_unresolved_layout_is_refused():
    with pytest.raises(AutoparInputError, match="resolve_layout"):
        megatron_args(Layout(tp=2), LLAMA3_8B, TRAIN)


def test_format_is_shell_ready(dsv3_layout):
    """The formatted text, pasted into a shell command line, gives back exactly the argument list."""
    model = ModelSpec(name="twelve", num_layers=12, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=8,
                      vocab_size=32000, mtp_layers=1)
    for args in (megatron_args(dsv3_layout, DSV3, TRAIN),
                 megatron_args(_resolved(model, 8, tp=2, pp=4, vpp=2, stage_layers=(2, 4, 4, 2)), model, TRAIN)):
        text = format_megatron(args)
        assert text.count("\n") == sum(a.startswith("--") for a in args)
        out = subprocess.run(["bash", "-c", "printf '%s\\n' " + text], capture_output=True, text=True, check=True)
        assert out.stdout.splitlines() == args


def test_stages_not_divisible_by_vpp_use_the_layout_string(dsv3_layout):
    """DeepSeek-V3's 3/4x14/2 stages interleaved twice: chunks differ by one layer, the embedding chunk lighter."""
    layout = dsv3_layout.model_copy(update={"vpp": 2})
    text = value(megatron_args(layout, DSV3, TRAIN), "--pipeline-model-parallel-layout")
    stages = unroll(text)
    assert len(stages) == 32 and stages[0] == "Et" and stages[16] == "tt" and stages[-1] == "tmL"
    assert sum(s.count("t") for s in stages) == 61
    # per pipeline rank (virtual stages i and 16 + i), the layers add up to the rank's stage_layers
    assert [stages[i].count("t") + stages[16 + i].count("t") for i in range(16)] == list(dsv3_layout.stage_layers)


def test_fp8_param_gather_flag():
    # the knob the prediction prices (FP8 primary weights) is the flag the launch carries, and only then
    on = TrainingSpec(seq_len=4096, global_batch=1024, precision="mxfp8", fp8_param_gather=True)
    off = TrainingSpec(seq_len=4096, global_batch=1024, precision="mxfp8")
    assert "--fp8-param-gather" in megatron_args(_resolved(LLAMA3_8B, 8, tp=2, zero_stage=1, training=on),
                                                 LLAMA3_8B, on)
    assert "--fp8-param-gather" not in megatron_args(_resolved(LLAMA3_8B, 8, tp=2, zero_stage=1, training=off),
                                                     LLAMA3_8B, off)
    # Megatron-LM arguments.py:1095: only with the distributed optimizer or FSDP; a plain-DDP layout is refused
    with pytest.raises(AutoparInputError, match="--fp8-param-gather needs the distributed optimizer"):
        megatron_args(_resolved(LLAMA3_8B, 8, tp=2, zero_stage=0, training=on), LLAMA3_8B, on)


def test_a_long_layout_string_uses_megatrons_repeat_groups_and_unrolls_to_the_same_stages():
    """A 31-stage layout (60 layers, an MTP layer, embedding and loss); runs of equal stages become '(p|)*n' (Megatron's parse unrolls
    them, autopar.specs.launcher_rules.layout_stages), short enough for an 80-column terminal, and the stages are
    the ones the layout places."""
    from autopar.emit.megatron import _repeat_runs
    parts = ["Et"] + ["t*2"] * 6 + ["t"] + ["t*2"] * 22 + ["t*2mL"]
    text = _repeat_runs(parts)
    assert text == "Et|(t*2|)*6t|(t*2|)*22t*2mL"
    assert layout_stages(text) == layout_stages("|".join(parts)) and len(layout_stages(text)) == 31
    assert _repeat_runs(["Et*7", "t*9", "t*9", "t*7L"]) == "Et*7|t*9|t*9|t*7L"   # no shorter written as a group


def test_nemo_optimizer_state_knobs_are_refused_not_dropped():
    # bf16 Adam moments without a master copy (NeMo 24.07's apex distributed_fused_adam, stack knobs) are priced in
    # memory; Megatron-LM keeps fp32 main parameters, so emitting would launch a run holding more than predicted
    tr = TrainingSpec(seq_len=4096, global_batch=1024, optimizer_state_dtype="bf16", master_weights_dtype="none")
    with pytest.raises(AutoparInputError, match="optimizer_state_dtype=bf16"):
        megatron_args(_resolved(LLAMA3_8B, 8, tp=2, zero_stage=1, training=tr), LLAMA3_8B, tr)


def test_recipe_kernel_switches_are_the_flags_the_prediction_prices():
    # Megatron-LM's --hidden-dropout default is 0.1; the prediction's is 0.0: the flag is always written
    base = TrainingSpec(seq_len=4096, global_batch=1024)
    args = megatron_args(_resolved(LLAMA3_8B, 8, tp=2, zero_stage=1, training=base), LLAMA3_8B, base)
    assert value(args, "--hidden-dropout") == "0"
    assert not {"--no-bias-swiglu-fusion", "--no-bias-gelu-fusion", "--no-bias-dropout-fusion"} & set(args)
    off = TrainingSpec(seq_len=4096, global_batch=1024, bias_activation_fusion=False, bias_dropout_add_fusion=False,
                       hidden_dropout=0.1)
    args = megatron_args(_resolved(LLAMA3_8B, 8, tp=2, zero_stage=1, training=off), LLAMA3_8B, off)
    assert value(args, "--hidden-dropout") == "0.1"
    assert "--no-bias-swiglu-fusion" in args and "--no-bias-dropout-fusion" in args   # Llama 3: a gated MLP
    plain = LLAMA3_8B.model_copy(update={"gated_mlp": False})
    assert "--no-bias-gelu-fusion" in megatron_args(_resolved(plain, 8, tp=2, zero_stage=1, training=off), plain, off)
