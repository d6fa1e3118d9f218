"""Stack files (stacks/*.yaml, autopar/specs/stack.py): loading, knob parsing, what a framework offers."""

import pytest

from autopar.errors import AutoparInputError
from autopar.specs.loaders import load_stack, zoo_names
from autopar.specs.stack import StackKnobs, parse_knobs
from autopar.specs.training import TrainingSpec


def test_every_zoo_stack_loads_and_sets_valid_training_switches():
    assert {"megatron_core", "torchtitan"} <= set(zoo_names("stacks"))
    for name in zoo_names("stacks"):
        st = load_stack(name)
        TrainingSpec(**st.knobs.training_fields())            # every knob maps to a valid switch
        assert all(k in st.knob_sources for k in st.free)      # a knob the solver picks names its source


def test_megatron_core_is_the_built_in_default():
    # the stack every prediction assumed before stacks existed: its switches are TrainingSpec's defaults
    fields = load_stack("megatron_core").knobs.training_fields()
    default = TrainingSpec()
    assert all(getattr(default, k) == v for k, v in fields.items())


def test_megatron_lm_is_megatron_core_without_the_recipes_switches():
    """Megatron-LM from its own command line: the same kernels as NVIDIA's recipes, with its defaults where the
    recipes turn things on (no TP/DP/EP overlap, unfused cross entropy, dropout 0.1); nothing else differs."""
    core = load_stack("megatron_core").knobs.training_fields()
    lm = load_stack("megatron_lm").knobs.training_fields()
    differ = {k: lm[k] for k in core if core[k] != lm[k]}
    assert differ == {"tp_comm_overlap": False, "dp_comm_overlap": False, "ep_comm_overlap": False,
                      "cross_entropy": "unfused", "hidden_dropout": 0.1}


def test_parse_knobs_shorthands_and_assignments():
    assert parse_knobs("compile, async_tp,fp8_recipe=rowwise,dp_overlap=off") == {
        "elementwise": "compiled", "tp_overlap": "async_tp", "fp8_recipe": "rowwise", "dp_overlap": False}
    assert parse_knobs("") == {}
    for bad in ("turbo", "nope=1", "dp_overlap=maybe"):
        with pytest.raises(AutoparInputError):
            parse_knobs(bad)


def test_a_stack_refuses_what_its_framework_does_not_offer():
    tt = load_stack("torchtitan")
    with pytest.raises(AutoparInputError, match="not offered"):
        tt.with_knobs({"tp_overlap": "userbuffers"})
    with pytest.raises(AutoparInputError, match="torch.compile"):
        tt.with_knobs({"tp_overlap": "async_tp"})            # eager by default: async TP needs compile
    assert tt.with_knobs(parse_knobs("compile,async_tp")).tp_overlap == "async_tp"


def test_free_knob_choices_are_valid_settings():
    tt = load_stack("torchtitan")
    choices = tt.knob_choices({})
    # elementwise x tp_overlap, less async TP without compile
    assert {(k.elementwise, k.tp_overlap) for k in choices} == {("eager", "none"), ("compiled", "none"),
                                                               ("compiled", "async_tp")}
    assert all(isinstance(k, StackKnobs) for k in choices)
    assert len(tt.knob_choices({"elementwise": "eager"})) == 1


def test_optimizer_state_knobs_set_the_training_dtypes_and_shrink_the_optimizer_bytes():
    # NeMo 24.07's distributed_fused_adam with optim.dtype bf16 on a bf16 model: two bf16 moments, no master copy
    knobs = load_stack("megatron_core").with_knobs(parse_knobs("optimizer_state_dtype=bf16,master_weights_dtype=none"))
    tr = TrainingSpec(**knobs.training_fields())
    assert (tr.optimizer_state_dtype, tr.master_weights_dtype) == ("bf16", "none")
    assert tr.optimizer_bytes == 4 and TrainingSpec().optimizer_bytes == 12
    with pytest.raises(AutoparInputError, match="not offered"):   # FSDP2's fp32 shards are torchtitan's master copy
        load_stack("torchtitan").with_knobs({"master_weights_dtype": "none"})
