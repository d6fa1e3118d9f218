"""TrainingSpec.projections: a stack's separate projections (torchtitan's wq, wk, wv and w1, w3) price the same
FLOPs as smaller GEMMs, each at its own shape, plus autograd's sum of their input gradients; Megatron-Core's fused
projections price exactly as before (autopar/blocks, autopar/cost/shapes.py, compute.py, tp.py)."""

from __future__ import annotations

import pytest

from autopar.cost import Estimator
from autopar.cost import compute as C
from autopar.cost.kernels import Kernels
from autopar.cost.shapes import layer_kind
from autopar.cost.tp import fp8_amax_seconds
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_model, load_stack
from autopar.specs.training import TrainingSpec

GT = load_hardware("h100_grand_teton")
LLAMA8B = load_model("llama3_8b")
TT = load_stack("torchtitan")


def titan(projections: str, **update) -> TrainingSpec:
    tr = TrainingSpec(seq_len=8192, global_batch=64, **TT.knobs.training_fields())
    return tr.model_copy(update={"projections": projections, **update})


def test_stack_files_set_the_knob():
    assert TT.knobs.training_fields()["projections"] == "separate"
    assert load_stack("megatron_core").knobs.training_fields()["projections"] == "fused"
    assert TrainingSpec().projections == "fused"


def test_separate_layer_has_the_same_gemm_flops_in_seven_gemms():
    fused, sep = layer_kind(LLAMA8B, 0, 8192), layer_kind(LLAMA8B, 0, 8192, "separate")
    assert len(fused.linears) == 4 and len(sep.linears) == 7          # QKV, O, gate-up, down -> q, k, v, o, w1, w3, w2
    assert sum(lin.params for lin in sep.linears) == sum(lin.params for lin in fused.linears)
    # autograd sums the input gradients of q, k, v (one kernel: read 3, write 1) and of w1, w3 (read 2, write 1), h wide,
    # backward only; eager's two adds for q, k, v move 2h more
    h = LLAMA8B.hidden_size
    assert sep.membound["grad_sum"] == (0.0, 4 * h + 3 * h) and sep.membound["grad_sum_eager"] == (0.0, 2 * h)
    assert {k: v for k, v in sep.membound.items() if not k.startswith("grad_sum")} == fused.membound


def test_separate_gemms_are_slower_under_tp_where_k_and_v_are_narrow():
    """At TP 8 wk and wv have N = g·d/8 = 128 columns per GPU: the GEMM curve runs them far below the fused QKV."""
    kern = Kernels(GT, titan("fused"))
    lay = Layout(tp=8, sequence_parallel=True, micro_batch=1)
    T = 8192.0

    def gemm_s(projections: str, layout: Layout) -> float:
        kind = layer_kind(LLAMA8B, 0, 8192, projections)
        parts = C.layer_parts(kern, kind, layout, titan(projections), T, 1.0)
        return sum(sum(parts[p]) for p in ("attn", "mlp"))

    tp8 = gemm_s("separate", lay) / gemm_s("fused", lay)
    tp1 = gemm_s("separate", Layout(micro_batch=1)) / gemm_s("fused", Layout(micro_batch=1))
    assert tp8 > tp1 > 1.0                 # smaller N costs more, and most where TP has already cut it
    assert tp8 > 1.05

    def grad_sum_s(layout: Layout, elementwise: str) -> float:
        kind = layer_kind(LLAMA8B, 0, 8192, "separate")
        parts = C.layer_parts(kern, kind, layout, titan("separate", elementwise=elementwise), T, 1.0)
        return sum(parts.get(p, (0.0, 0.0))[1] for p in ("grad_sum", "grad_sum_eager"))

    # every TP rank sums partial input gradients over all T tokens and the whole width: TP does not split it; eager
    # adds pairwise (3 + 3 + 3 elements of h), Inductor in one kernel per group (4 + 3)
    h = LLAMA8B.hidden_size
    assert grad_sum_s(lay, "eager") == grad_sum_s(Layout(micro_batch=1), "eager") == kern.stream(9 * h * T * 2)
    assert grad_sum_s(lay, "compiled") == kern.stream(7 * h * T * 2)


def test_whole_step_moves_only_with_the_knob():
    lay = Layout(tp=8, sequence_parallel=True, micro_batch=1, zero_stage=3, recompute="full")
    hw = TT.on(GT)
    sep = Estimator(LLAMA8B, hw, titan("separate"), 8).estimate(lay)
    fused = Estimator(LLAMA8B, hw, titan("fused"), 8).estimate(lay)
    assert sep.step_time_s > fused.step_time_s
    assert sep.model_tflops_per_gpu * sep.step_time_s == pytest.approx(fused.model_tflops_per_gpu * fused.step_time_s)
    assert sep.memory_gib == fused.memory_gib
    # Megatron-Core's stack is the default TrainingSpec: fused, priced as before the knob existed
    mc = load_stack("megatron_core")
    tr = TrainingSpec(seq_len=8192, global_batch=64, **mc.knobs.training_fields())
    assert Estimator(LLAMA8B, GT, tr, 8).estimate(lay) == Estimator(
        LLAMA8B, GT, tr.model_copy(update={"projections": "fused"}), 8).estimate(lay)


def test_torchao_casts_a_shared_input_once_and_each_weight_and_gradient_apart():
    kind_f, kind_s = layer_kind(LLAMA8B, 0, 8192), layer_kind(LLAMA8B, 0, 8192, "separate")
    T = 2 * 8192.0
    for recipe in ("tensorwise", "rowwise"):
        tr = titan("separate", precision="fp8", fp8_recipe=recipe, elementwise="compiled")
        f = C.torchao_cast_bytes(kind_f, Layout(), tr, T)
        s = C.torchao_cast_bytes(kind_s, Layout(), tr, T)
        assert s[0] == pytest.approx(f[0])   # the shared input cast once, the weights' elements the same
        if recipe == "tensorwise":
            assert s[1] == pytest.approx(f[1])
        else:   # rowwise rescales each backward GEMM's input gradient: wk, wv, w3 write their own T x h
            assert s[1] == pytest.approx(f[1] + C.ROWWISE_RESCALE_BYTES * T * 3 * LLAMA8B.hidden_size)


def test_tensorwise_amax_all_reduces_count_each_separate_gemm():
    lay = Layout(tp=8, sequence_parallel=True, micro_batch=1, recompute="full")
    e = Estimator(LLAMA8B, GT, titan("separate", precision="fp8", fp8_recipe="tensorwise", elementwise="compiled",
                                     tp_comm_overlap=False), 8)
    (st,) = e.stages((LLAMA8B.num_layers,))
    one = e.net.time("all_reduce", 4.0, 8, 1)
    L = LLAMA8B.num_layers
    # per layer 7 GEMMs x (input, weight, output-gradient amax + the forward two again), less wk, wv, w3's input amax
    assert fp8_amax_seconds(e.profile, st, lay, e.training, e.net) == pytest.approx(L * (7 * 5 - 3 * 2) * one)
    assert fp8_amax_seconds(e.profile, st, lay.model_copy(update={"recompute": "none"}), e.training, e.net) == \
        pytest.approx(L * (7 * 3 - 3) * one)


def test_moe_experts_split_gate_and_up_in_grouped_gemms():
    """torchtitan's GroupedExperts runs grouped_mm(x, w1) and grouped_mm(x, w3) apart; its shared experts are a
    FeedForward: both become two GEMMs on one input, with the same weights; the routed copies' input gradients are
    summed over k copies of h (``expert_grad_sum``), the shared experts' over h (``grad_sum``)."""
    dsv3 = load_model("deepseek_v3")
    i = dsv3.num_layers - 1
    fused, sep = layer_kind(dsv3, i, 4096), layer_kind(dsv3, i, 4096, "separate")
    assert fused.is_moe and sum(lin.params for lin in sep.linears) == sum(lin.params for lin in fused.linears)
    assert [lin.split for lin in sep.linears if lin.shares_input] == ["col", "expert_col"]
    h, k = dsv3.hidden_size, dsv3.moe.top_k
    assert sep.membound["expert_grad_sum"] == (0.0, 3 * k * h)   # gate, up: read 2, write 1 per routed copy
    assert sep.membound["grad_sum"] == (0.0, 3 * h)   # the shared experts' gate, up; MLA's projections as they are
    assert "grad_sum_eager" not in sep.membound
    tr = titan("fused")
    kern = Kernels(GT, tr)
    lay = Layout(tp=1, ep=8, micro_batch=1)
    f = C.layer_parts(kern, fused, lay, tr, 4096.0, 1.0)
    s = C.layer_parts(kern, sep, lay, tr.model_copy(update={"projections": "separate"}), 4096.0, 1.0)
    assert sum(s["moe"]) > sum(f["moe"])      # half-width grouped GEMMs run lower on the GEMM curve
