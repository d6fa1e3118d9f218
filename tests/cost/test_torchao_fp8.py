"""torchao Float8Linear as torchtitan runs it (fp8_recipe tensorwise / rowwise): quantisation bytes against hand
counts from torchao's own roofline (pytorch/ao torchao/testing/training/roofline_utils.py), where TP puts each cast,
and which GEMM the rowwise kernel factor applies to (autopar/cost/compute.py torchao_cast_bytes, kernels.py)."""

from __future__ import annotations

import pytest

from autopar.cost import compute as C
from autopar.cost.kernels import Kernels
from autopar.cost.shapes import layer_kind
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_model
from autopar.specs.training import TrainingSpec

GT = load_hardware("h100_grand_teton")
LLAMA8B = load_model("llama3_8b")
KIND = layer_kind(LLAMA8B, 0, 8192)
T = 2 * 8192.0   # tokens per GPU of one micro-batch


def tr(recipe: str, elementwise: str = "compiled") -> TrainingSpec:
    return TrainingSpec(seq_len=8192, global_batch=64, precision="fp8", fp8_recipe=recipe, elementwise=elementwise)


def test_tensorwise_without_tp_is_torchaos_roofline_count():
    # roofline_utils.get_tensor_memory_traffic_ovhd_s, tensorwise: an activation operand costs amax (2 B) + one cast
    # writing both layouts (2 + 1 + 1 B) = 6 B; a weight amax 2 + forward cast 3 + backward cast 3 = 8 B
    fwd, bwd = C.torchao_cast_bytes(KIND, Layout(), tr("tensorwise"), T)
    acts = sum(T * (lin.k + lin.n) for lin in KIND.linears)
    weights = sum(lin.k * lin.n for lin in KIND.linears)
    assert fwd + bwd == pytest.approx(6 * acts + 8 * weights)
    assert fwd == pytest.approx(sum(6 * T * lin.k + 5 * lin.k * lin.n for lin in KIND.linears))


def test_rowwise_without_tp_adds_the_second_quantisation_and_the_backward_rescale():
    # rowwise: 8 B per activation element (kernel 1: 2 + 1 + 2, kernel 2: 2 + 1), 10 B per weight element, and the
    # slow-accumulation backward GEMMs' separate rescale: 4 B per grad_input (T x K) and grad_weight (K x N) element
    fwd, bwd = C.torchao_cast_bytes(KIND, Layout(), tr("rowwise"), T)
    acts = sum(T * (lin.k + lin.n) for lin in KIND.linears)
    weights = sum(lin.k * lin.n for lin in KIND.linears)
    rescale = sum(T * lin.k + lin.k * lin.n for lin in KIND.linears)
    assert fwd + bwd == pytest.approx(8 * acts + 10 * weights + 4 * rescale)


def test_rowwise_quantises_the_gathered_tp_operands_on_every_gpu():
    # rowwise keeps bf16 TP all-gathers: the h-wide operands (column-parallel inputs, row-parallel output gradients)
    # are cast over all T tokens on each of the tp GPUs, so their bytes do not shrink with tp; tensorwise casts the
    # T/tp shard before its FP8 all-gather and only transposes the gathered copy
    h = LLAMA8B.hidden_size
    wide = sum(lin.k for lin in KIND.linears if lin.split == "col") + \
        sum(lin.n for lin in KIND.linears if lin.split == "row")
    assert wide == 4 * h
    lay = Layout(tp=8, sequence_parallel=True)
    row8 = sum(C.torchao_cast_bytes(KIND, lay, tr("rowwise"), T))
    tw8 = sum(C.torchao_cast_bytes(KIND, lay, tr("tensorwise"), T))
    narrow = sum(T * lin.n / 8 for lin in KIND.linears if lin.split == "col") + \
        sum(T * lin.k / 8 for lin in KIND.linears if lin.split == "row")
    w8 = sum(lin.k * lin.n for lin in KIND.linears) / 8
    rescale8 = sum(T * (lin.k if lin.split == "col" else lin.k / 8) + lin.k * lin.n / 8 for lin in KIND.linears)
    assert row8 == pytest.approx(8 * (T * wide + narrow) + 10 * w8 + 4 * rescale8)
    assert tw8 == pytest.approx(wide * (5 * T / 8 + 2 * T) + 6 * narrow + 8 * w8)
    assert row8 > 2 * tw8


def test_eager_casts_move_more_bytes_than_compiled_ones():
    for recipe in ("tensorwise", "rowwise"):
        assert sum(C.torchao_cast_bytes(KIND, Layout(), tr(recipe, "eager"), T)) > \
            sum(C.torchao_cast_bytes(KIND, Layout(), tr(recipe), T))


def test_rowwise_kernel_factor_prices_only_the_forward_gemm():
    # torchao runs the output GEMM on the rowwise CUTLASS kernel (fast accumulation) and both backward GEMMs on the
    # tensorwise cuBLAS one (torchao/float8/float8_ops.py addmm_float8_unwrapped)
    factor = GT.kernel_model.fp8_rowwise_gemm
    assert factor < 1.0
    m, n, k = 16384.0, 8192.0, 8192.0
    tw = Kernels(GT, tr("tensorwise")).gemm(m, n, k, n * k, 2, 2)
    rw = Kernels(GT, tr("rowwise")).gemm(m, n, k, n * k, 2, 2)
    assert rw[0] == pytest.approx(tw[0] / factor)
    assert rw[1] == pytest.approx(tw[1])


def test_transformer_engine_recipe_is_unchanged_by_the_torchao_terms():
    # Megatron-Core's FP8 (fp8_recipe te) keeps its fused cast-transpose count: 4 B per GEMM input/output element
    te = TrainingSpec(seq_len=8192, global_batch=64, precision="fp8")
    kern = Kernels(GT, te)
    parts = C.layer_parts(kern, KIND, Layout(tp=2, sequence_parallel=True), te, T, 1.0)
    half = 0.5 * KIND.fp8_cast_width * 4.0 * T / 2
    assert parts["fp8_cast"] == pytest.approx((kern.stream(half), kern.stream(half)))


def test_tensorwise_tp_pays_one_amax_all_reduce_per_cast():
    # docs/float8.md (torchtitan): under TP each cast's max(abs) is all-reduced over the TP group; per TP-split linear
    # the input and weight casts (forward), the output gradient's (backward), and the forward two again when
    # recomputing; latency-bound, not hidden by async TP; none without TP
    from autopar.cost import Estimator
    from autopar.cost.tp import fp8_amax_seconds, tp_time_per_microbatch

    def est(recipe: str, tp_overlap: bool = False) -> Estimator:
        t = tr(recipe).model_copy(update={"tp_comm_overlap": tp_overlap, "tp_overlap_impl": "async_tp"})
        return Estimator(LLAMA8B, GT, t, 8)

    lay = Layout(tp=8, sequence_parallel=True, micro_batch=1, recompute="full")
    e = est("tensorwise")
    (st,) = e.stages((LLAMA8B.num_layers,))
    n_lin = LLAMA8B.num_layers * 4            # QKV, O, gate-up, down per Llama layer
    one = e.net.time("all_reduce", 4.0, 8, 1)
    assert fp8_amax_seconds(e.profile, st, lay, e.training, e.net) == pytest.approx(n_lin * 5 * one)
    assert fp8_amax_seconds(e.profile, st, lay.model_copy(update={"recompute": "none"}), e.training, e.net) == \
        pytest.approx(n_lin * 3 * one)
    assert fp8_amax_seconds(e.profile, st, Layout(tp=1), e.training, e.net) == 0.0
    # async TP hides the bulk collectives behind the GEMMs, never the amax reductions
    a = est("tensorwise", tp_overlap=True)
    assert tp_time_per_microbatch(a.profile, st, lay, a.training, a.hardware, a.net, gemm_window=1e9,
                                  kern=a.kernels) >= n_lin * 5 * one


def test_rowwise_tp_all_reduces_the_amax_of_every_operand_scaled_along_a_sharded_dimension():
    # autopar/cost/tp.py docstring: DTensor all-reduces an amax taken over a TP-sharded dimension. Column-parallel
    # (N sharded): backward, the output gradient's per-row amax (T values) and the weight's cast along N (K values);
    # row-parallel (K sharded): forward, the input's per-row amax (T values) and the weight's cast along K (N values),
    # twice with recomputation; 2 B per value (BF16). Casts along M, or of the gathered column-parallel input, are local.
    from autopar.cost import Estimator
    from autopar.cost.tp import fp8_amax_seconds

    e = Estimator(LLAMA8B, GT, tr("rowwise"), 8)
    (st,) = e.stages((LLAMA8B.num_layers,))
    lay = Layout(tp=8, sequence_parallel=True, micro_batch=2, recompute="full")
    tokens = 2 * 8192.0
    h = LLAMA8B.hidden_size

    def ar(values: float) -> float:
        return e.net.time("all_reduce", 2.0 * values, 8, 1)

    rows = ar(tokens)
    # per Llama layer: QKV and gate-up column-parallel (K = h), O and down row-parallel (N = h)
    col = 2 * (rows + ar(h))
    row = 2 * (rows + ar(h))
    for recompute, passes in (("full", 2), ("none", 1)):
        got = fp8_amax_seconds(e.profile, st, lay.model_copy(update={"recompute": recompute}), e.training, e.net)
        assert got == pytest.approx(LLAMA8B.num_layers * (col + passes * row))
    # the T-value reductions grow with the tokens per GPU; none without TP
    more = fp8_amax_seconds(e.profile, st, lay.model_copy(update={"micro_batch": 8}), e.training, e.net)
    assert more > fp8_amax_seconds(e.profile, st, lay, e.training, e.net)
    assert fp8_amax_seconds(e.profile, st, Layout(tp=1), e.training, e.net) == 0.0


def test_async_tp_under_rowwise_leaves_the_all_gathers_exposed():
    # pytorch/pytorch#149990: the async-TP pass fuses matmul -> reduce-scatter under rowwise scales, not
    # all-gather -> matmul (autopar/cost/tp.py async_tp_fused_share). With an unbounded GEMM window the fused
    # collectives hide entirely; what stays is the unfused share, async TP's chunked GEMMs and partial sums, and the
    # amax reductions: under rowwise at least the all-gather half of T_tp, more than under tensorwise
    from autopar.cost import Estimator
    from autopar.cost.tp import (async_tp_compute_seconds, async_tp_fused_share, fp8_amax_seconds, tp_comm_seconds,
                                 tp_time_per_microbatch)

    lay = Layout(tp=8, sequence_parallel=True, micro_batch=1, recompute="full")
    exposed = {}
    for recipe in ("tensorwise", "rowwise"):
        e = Estimator(LLAMA8B, GT, tr(recipe).model_copy(update={"tp_comm_overlap": True,
                                                                 "tp_overlap_impl": "async_tp"}), 8)
        (st,) = e.stages((LLAMA8B.num_layers,))
        t = tp_comm_seconds(e.profile, st, lay, e.training, e.net)
        amax = fp8_amax_seconds(e.profile, st, lay, e.training, e.net)
        got = tp_time_per_microbatch(e.profile, st, lay, e.training, e.hardware, e.net, gemm_window=1e9,
                                     kern=e.kernels)
        share = async_tp_fused_share(e.profile, st, lay, e.training)
        extra = async_tp_compute_seconds(e.profile, st, lay, e.training, e.kernels)
        assert got == pytest.approx(t * (1 - share) + extra + amax)
        exposed[recipe] = (got - extra - amax) / t
    assert exposed["rowwise"] >= 0.5 > exposed["tensorwise"]
