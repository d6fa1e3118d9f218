"""The Markdown analysis report of one search (``autopar solve --report out.md``), with its two PNG figures.

Layout of the report (after the project's reference example, example-analysis-report.md): a summary; Model, Training
and Hardware tables (with the efficiency constants the prediction used); the ranked table of layouts and its
column legend; the figures; the best layout in detail (memory with what each term counts, step time as a
sum of named terms); the comparison with the rules-of-thumb layout; what to try next; the solver's status;
a closing note that everything is an analytical prediction.

Nothing a user made is overwritten silently: :func:`write_report` refuses when the report or a figure
already exists unless ``overwrite=True``, and it checks every path before writing any.
"""

from __future__ import annotations

from pathlib import Path

from autopar.cost.legend import APPROX_NOTE, MEMORY_LEGEND, TIME_LEGEND
from autopar.cost.estimator import Estimator
from autopar.cost.memory import inflight_layer_microbatches, shard_groups, stage_params
from autopar.cost.pipeline import bubble_fraction
from autopar.cost.result import Estimate
from autopar.cost.stage import split_stages
from autopar.errors import AutoparInputError
from autopar.report.plots import Point, memory_png, pareto_front, pareto_png
from autopar.search import SolveResult
from autopar.specs.hardware import HardwareSpec
from autopar.specs.loaders import load_hardware, load_model
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

__all__ = ["RANKED_COLUMNS", "render_markdown", "report_paths", "write_report"]

# Ranked-table columns: (header, legend). Layout | memory GiB | time s | throughput.
RANKED_COLUMNS: tuple[tuple[str, str], ...] = (
    ("#", "rank by predicted step time (heur. = the rules-of-thumb layout, for comparison)"),
    ("TP", "tensor-parallel degree (Megatron column/row split)"),
    ("DP", "data-parallel degree = GPUs / (TP·CP·PP)"),
    ("PP", "pipeline-parallel stages"),
    ("VPP", "virtual stages per pipeline rank (interleaved 1F1B)"),
    ("CP", "context-parallel degree (sequence split, ring attention)"),
    ("EP", "expert-parallel degree (MoE)"),
    ("ETP", "expert tensor-parallel degree (MoE)"),
    ("SP", "sequence parallelism (y/n)"),
    ("ZeRO", "ZeRO stage over DP: 0 DDP, 1 optimizer, 2 + gradients, FSDP = 3 (+ parameters)"),
    ("MBS", "micro-batch: sequences per micro-batch per DP rank"),
    ("GA", "micro-batches per step per DP rank (gradient accumulation) = global batch / (DP·MBS)"),
    ("recompute", "activation recomputation: none, selective (core attention), full, or a module list"),
    ("W", "GiB: " + MEMORY_LEGEND["weights"]),
    ("G", "GiB: " + MEMORY_LEGEND["grads"]),
    ("O", "GiB: " + MEMORY_LEGEND["optimizer"]),
    ("Act", "GiB: " + MEMORY_LEGEND["activations"]),
    ("Buf", "GiB: " + MEMORY_LEGEND["buffers"]),
    ("Rsv", "GiB: " + MEMORY_LEGEND["reserve"]),
    ("Tot GiB", "per-GPU peak of the fullest pipeline stage = W + G + O + Act + Buf + Rsv"),
    ("comp s", "s: " + TIME_LEGEND["compute"]),
    ("TP s", "s: " + TIME_LEGEND["tp"]),
    ("CP s", "s: " + TIME_LEGEND["cp"]),
    ("EP s", "s: " + TIME_LEGEND["ep"]),
    ("DP s", "s: " + TIME_LEGEND["dp"]),
    ("bubble s", "s: " + TIME_LEGEND["pp_bubble"]),
    ("p2p s", "s: " + TIME_LEGEND["pp_p2p"]),
    ("opt s", "s: " + TIME_LEGEND["optimizer"]),
    ("step s", "predicted step time = the sum of the eight time columns"),
    ("tok/s/GPU", "trained tokens per second per GPU = global batch · seq / (step · GPUs)"),
    ("MFU", "model FLOPs utilisation: model FLOPs per token · tok/s/GPU / dense peak (PaLM, arXiv 2204.02311 app. B)"),
    ("bottleneck", "the largest time term"),
)


def report_paths(path: Path | str) -> tuple[Path, Path, Path]:
    """(report, memory figure, Pareto figure): ``out.md`` -> ``out_memory.png``, ``out_pareto.png`` beside it."""
    path = Path(path)
    return path, path.with_name(f"{path.stem}_memory.png"), path.with_name(f"{path.stem}_pareto.png")


# ---- small Markdown helpers -----------------------------------------------------------------------------

def _cell(v: object) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def _table(headers: list[str], rows: list[list[object]], right: set[int] | None = None) -> str:
    right = right if right is not None else set()
    sep = ["---:" if i in right else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(_cell(h) for h in headers) + " |", "|" + "|".join(sep) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _kv(rows: list[tuple[str, str]]) -> str:
    return _table(["Property", "Value"], [list(r) for r in rows])


def _zero(L) -> str:
    if L.hsdp_shard:
        return f"HSDP{L.hsdp_shard}"
    return "FSDP" if L.zero_stage == 3 else str(L.zero_stage)


def _b(n: float) -> str:
    return f"{n / 1e9:.2f}B"


# ---- sections -------------------------------------------------------------------------------------------

def _model_section(m: ModelSpec, tr: TrainingSpec) -> str:
    rows = [("Name", m.name + (f" ({m.source})" if m.source else ""))]
    params = f"{_b(m.total_params)} total, {_b(m.active_params)} active per token"
    if m.is_moe:
        params += (f" (routed experts {_b(m.expert_params_total)}, "
                   f"non-expert {_b(m.total_params - m.expert_params_total)})")
    rows.append(("Parameters", params))
    layers = f"{m.num_layers} ({m.num_dense_layers} dense MLP, {m.num_moe_layers} MoE)"
    if m.mtp_layers:
        layers += f" + {m.mtp_layers} MTP module(s)"
    rows.append(("Layers", layers))
    rows.append(("Width", f"hidden {m.hidden_size}, FFN {m.ffn_hidden_size}, vocab {m.vocab_size:,}"
                          + (", tied embeddings" if m.tie_embeddings else "")))
    if m.mla:
        attn = (f"MLA, {m.num_attention_heads} heads, KV rank {m.mla.kv_lora_rank}, "
                f"QK {m.qk_head_dim} / V {m.v_head_dim} per head")
    else:
        kind = "MHA" if m.kv_heads == m.num_attention_heads else ("MQA" if m.kv_heads == 1 else "GQA")
        attn = f"{kind}, {m.num_attention_heads} heads × {m.dim_per_head}, {m.kv_heads} KV heads"
    if m.sliding_window:
        attn += (f", sliding window {m.sliding_window}"
                 + (f" (every {m.sliding_window_every}th layer global)" if m.sliding_window_every else ""))
    rows.append(("Attention", attn))
    if m.moe:
        moe = f"{m.moe.num_experts} experts × FFN {m.moe.expert_ffn_hidden_size}, top-{m.moe.top_k}"
        if m.moe.num_shared_experts:
            moe += f", {m.moe.num_shared_experts} shared × FFN {m.moe.shared_ffn}"
        if m.moe.first_dense_layers:
            moe += f", first {m.moe.first_dense_layers} layers dense"
        if m.moe.moe_layer_interval > 1:
            moe += f", MoE every {m.moe.moe_layer_interval} layers"
    else:
        moe = "no (dense)"
    rows.append(("MoE", moe))
    fwd = m.forward_flops_per_token(tr.seq_len)
    rows.append(("FLOPs per token", f"{fwd / 1e9:.2f} GFLOP forward, {3 * fwd / 1e9:.2f} GFLOP training "
                                    f"(3× forward, no recompute; attention at seq {tr.seq_len})"))
    return "## Model\n\n" + _kv(rows)


def _training_section(m: ModelSpec, tr: TrainingSpec) -> str:
    tokens = tr.tokens_per_step
    flops = m.training_flops_per_token(tr.seq_len) * tokens
    per_param = tr.weight_bytes + tr.grad_bytes + tr.optimizer_bytes
    rows = [
        ("Sequence length", f"{tr.seq_len:,}"),
        ("Global batch", f"{tr.global_batch:,} sequences"),
        ("Tokens per step", f"{tokens:,} ({tokens / 1e6:.2f}M)"),
        ("Training FLOPs per step", f"{flops / 1e15:,.1f} PFLOP (model FLOPs, recomputation not counted)"),
        ("Precision", f"{tr.precision} math; weights {tr.weight_dtype}, gradients {tr.grad_dtype}, master "
                      f"weights {tr.master_weights_dtype}, Adam moments {tr.optimizer_state_dtype}, "
                      f"activations {tr.activation_dtype}"),
        ("Model state", f"{tr.weight_bytes} + {tr.grad_bytes} + {tr.optimizer_bytes} = {per_param} B per "
                        "parameter before sharding (weights + gradients + optimizer)"),
    ]
    return "## Training\n\n" + _kv(rows)


def _hardware_section(hw: HardwareSpec, tr: TrainingSpec, gpus: int) -> str:
    peak = hw.peak_tflops(tr.precision)
    eff, km = hw.efficiency, hw.kernel_model
    nodes = gpus / hw.gpus_per_node
    rows = [
        ("GPUs", f"{gpus} × {hw.name} ({nodes:g} node(s) of {hw.gpus_per_node})"),
        ("Peak", f"{peak:,.0f} TFLOP/s dense {tr.precision} per GPU = {peak * gpus / 1e3:,.1f} PFLOP/s total"),
        ("HBM", f"{hw.hbm_gib:.1f} GiB per GPU at {hw.hbm_tbps:g} TB/s"),
        ("NVLink domain", f"{hw.nvlink_domain_size} GPUs, {hw.nvlink_gbps:g} GB/s per GPU per direction, "
                          f"{hw.nvlink_latency_us:g} µs latency"),
        ("Scale-out", f"{hw.scaleout_gbps:g} GB/s per GPU per direction, {hw.scaleout_latency_us:g} µs latency"),
        ("Memory reserve", f"{hw.reserve_gib:g} GiB (CUDA context, NCCL) + {hw.fragmentation:.0%} of the "
                           "modelled memory (allocator fragmentation)"),
        ("Kernel speeds used", f"large GEMMs {km.gemm_max(tr.precision):.0%} of peak ({tr.precision}), by shape; "
                               f"flash attention ({km.attention_kernel}) {km.attention_fwd:.0%} fwd / "
                               f"{km.attention_bwd:.0%} bwd of the BF16 peak at long sequences; both at the clock a "
                               f"long run sustains (x{km.sustained_gemm:g} GEMM, x{km.sustained_attention:g} "
                               f"attention); bandwidth NVLink {km.nvlink:.0%}, scale-out "
                               f"{km.scaleout:.0%}, HBM {km.hbm:.0%} of peak ({km.source})"),
        ("Per-layer overhead", f"{eff.layer_overhead_us:,.0f} µs per layer and micro-batch, "
                               f"{eff.moe_layer_overhead_us:,.0f} µs more per MoE layer (calibrated)"),
        ("Overlap used", f"{tr.overlaps()} (what the compute window covers is hidden), PP send/recv "
                         f"{eff.pp_overlap:.0%} hidden"),
    ]
    meas = hw.measured_busbw_gbps
    if meas is not None:
        parts = []
        for op, short in (("all_reduce", "AR"), ("all_gather", "AG"), ("reduce_scatter", "RS"),
                          ("all_to_all", "A2A"), ("send_recv", "P2P")):
            table = getattr(meas, op)
            if table:
                parts.append(f"{short}={{" + ", ".join(f"{k}: {v:.1f}" for k, v in sorted(table.items())) + "}")
        if parts:
            rows.append(("Measured bus BW (GB/s)", ", ".join(parts) + f" at {meas.message_mib:g} MiB"))
    if hw.source:
        rows.append(("Source", hw.source))
    return "## Hardware\n\n" + _kv(rows)


def _ranked_row(label: str, e: Estimate) -> list[object]:
    L, m, t = e.layout, e.memory_gib, e.time_s
    tot = f"{m.total:.1f}" + ("" if e.fits else " ✗")
    return [label, L.tp, L.dp, L.pp, L.vpp, L.cp, L.ep, L.etp, "y" if L.sp else "n", _zero(L), L.micro_batch,
            L.grad_accum, L.recompute,
            f"{m.weights:.1f}", f"{m.grads:.1f}", f"{m.optimizer:.1f}", f"{m.activations:.1f}", f"{m.buffers:.1f}",
            f"{m.reserve:.1f}", tot,
            f"{t.compute:.3f}", f"{t.tp:.3f}", f"{t.cp:.3f}", f"{t.ep:.3f}", f"{t.dp:.3f}", f"{t.pp_bubble:.3f}",
            f"{t.pp_p2p:.3f}", f"{t.optimizer:.3f}", f"{e.step_time_s:.3f}",
            f"{e.tokens_per_s_per_gpu:,.0f}", f"{e.mfu:.1%}", e.bottleneck]


def _ranked_section(res: SolveResult, hw: HardwareSpec) -> str:
    headers = [h for h, _ in RANKED_COLUMNS]
    right = set(range(1, 12)) | set(range(13, len(headers) - 1))
    out = ["## Ranked layouts (predicted)", ""]
    if not res.plans:
        out.append("**No layout fits.**")
        out += [""] + [f"- {line}" for line in res.explanation]
        if res.heuristic:
            out += ["", "The rules-of-thumb layout, for reference:", "",
                    _table(headers, [_ranked_row("heur.", res.heuristic.estimate)], right)]
        return "\n".join(out)
    rows = [_ranked_row(str(p.rank), p.estimate) for p in res.plans]
    if res.heuristic:
        rows.append(_ranked_row("heur.", res.heuristic.estimate))
    out.append(f"Fastest layouts that fit in {hw.hbm_gib:.1f} GiB, ranked by predicted step time "
               "(✗ after the total: does not fit).")
    out += ["", _table(headers, rows, right)]
    return "\n".join(out)


def _legend_section() -> str:
    return "### Column legend\n\n" + _table(["Column", "Description"], [list(c) for c in RANKED_COLUMNS])


def _figures_section(images: dict[str, str], res: SolveResult) -> str:
    if not images:
        return ""
    out = ["## Figures", ""]
    link = {k: f"<{v}>" if " " in v else v for k, v in images.items()}
    if "memory" in images:
        out += [f"![Per-GPU memory of the top layouts]({link['memory']})", "",
                "Memory per GPU of the fullest pipeline stage, by term; the dashed line is the HBM capacity.", ""]
    if "pareto" in images:
        pts = _points(res)
        front = ", ".join(p.label for p in pareto_front([q for q in pts if q.estimate.fits]))
        out += [f"![Step time against peak memory]({link['pareto']})", "",
                "Predicted step time against per-GPU peak memory of every listed layout and the rules-of-thumb "
                f"layout (✗: does not fit); the line joins the Pareto front of the layouts that fit ({front or 'none'}): "
                "no other fitting layout is both faster and smaller."
                + (" The star is the best layout." if res.plans else ""), ""]
    return "\n".join(out).rstrip()


def _memory_details(est: Estimator, e: Estimate) -> dict[str, str]:
    """What each memory term of ``e`` counts, with the numbers of its fullest stage."""
    L, tr, hw, prof = e.layout, est.training, est.hardware, est.profile
    stages = {s.index: s for s in split_stages(L.stage_layers)}
    st = stages.get(e.worst_stage, stages[0])
    dense, expert = stage_params(prof, st, L)
    sd, se = shard_groups(L)
    z = L.zero_stage

    def shard(active: bool) -> str:
        if not active:
            return f"not sharded (ZeRO-{z})"
        return f"÷{sd} over DP·CP" + (f", experts ÷{se} over EDP" if expert else "") + f" (ZeRO-{z})"

    params = f"{_b(dense)} dense params on this GPU (stage ÷TP {L.tp})" + (
        f" + {_b(expert)} expert (÷EP·ETP {L.ep * L.etp})" if expert else "")
    inflight = inflight_layer_microbatches(st, L)
    act = (f"micro-batch {L.micro_batch} × {tr.seq_len // L.cp:,} tokens (seq ÷CP {L.cp}); {inflight:g} "
           f"micro-batch(es) in flight on stage {st.index} ({st.n_layers} layers); recompute {L.recompute}")
    if st.is_last:
        act += "; + logits of one micro-batch (last stage)"
    return {
        "weights": f"{params} × {tr.weight_bytes} B; " + shard(z >= 3),
        "grads": f"{tr.grad_bytes} B/param; " + shard(z >= 2),
        "optimizer": f"{tr.optimizer_bytes} B/param (master weights + 2 Adam moments); " + shard(z >= 1),
        "activations": act,
        "buffers": MEMORY_LEGEND["buffers"],
        "reserve": f"{hw.reserve_gib:g} GiB fixed + {hw.fragmentation:.0%} of the modelled memory",
    }


def _detail_section(title: str, est: Estimator, e: Estimate, hw: HardwareSpec, tr: TrainingSpec) -> str:
    L = e.layout
    out = [f"## {title}: {L.short()}", ""]
    split = "/".join(map(str, L.stage_layers)) if L.stage_layers else "even"
    out.append(f"EDP {L.edp}; min_gpus = PP·max(TP·CP, EP·ETP) = {L.min_gpus()}; layers per stage {split}.")
    out += ["", f"### Memory per GPU — pipeline stage {e.worst_stage} of {L.pp} (the fullest)", ""]
    det = _memory_details(est, e)
    rows = [[k, f"{v:.2f}", det[k]] for k, v in e.memory_gib.to_dict().items() if k != "total"]
    verdict = "fits" if e.fits else "**DOES NOT FIT**"
    rows.append(["**total**", f"**{e.memory_gib.total:.2f}**",
                 f"of {hw.hbm_gib:.1f} GiB HBM ({e.memory_gib.total / hw.hbm_gib:.0%} used) — {verdict}"])
    out.append(_table(["Term", "GiB", "Detail"], rows, {1}))
    out += ["", "### Step time (critical path of the slowest stage)", ""]
    step = e.step_time_s
    trows = []
    for k, v in e.time_s.to_dict().items():
        if k == "offload" and not L.offload_activations:
            continue
        what = TIME_LEGEND[k]
        if k == "pp_bubble" and L.pp > 1:
            frac = bubble_fraction(L.pp, L.vpp, L.grad_accum)
            what += f" = ({L.pp}−1)/({L.vpp}·{L.grad_accum}+{L.pp}−1) = {frac:.1%}"
        trows.append([k, f"{v:.4f}", f"{v / step:.1%}", what])
    trows.append(["**step**", f"**{step:.4f}**", "100%", ""])
    out.append(_table(["Term", "Seconds", "Share", "What it counts"], trows, {1, 2}))
    t = e.time_s
    comm = t.tp + t.cp + t.ep + t.dp + t.pp_p2p
    out += ["", f"- Step time: {step:.3f} s = compute {t.compute:.3f} + exposed communication {comm:.3f} + "
                f"bubble {t.pp_bubble:.3f} + optimizer {t.optimizer:.3f}",
            f"- Throughput: {e.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, {e.model_tflops_per_gpu:,.0f} model "
            f"TFLOP/s/GPU, MFU {e.mfu:.1%} (of the {tr.precision} dense peak {hw.peak_tflops(tr.precision):,.0f} "
            "TFLOP/s)",
            f"- Bottleneck: {e.bottleneck} ({TIME_LEGEND[e.bottleneck]})"]
    out += [f"- Note: {n}" for n in e.notes]
    return "\n".join(out)


def _heuristic_section(res: SolveResult) -> str:
    h = res.heuristic
    out = ["## Comparison with the rules-of-thumb layout", ""]
    if h is None:
        out.append("No rules-of-thumb layout: " + "; ".join(res.heuristic_reasons) if res.heuristic_reasons
                   else "No rules-of-thumb layout was computed.")
        return "\n".join(out)
    rows = []
    if res.plans:
        rows.append(["autopar #1", res.plans[0].layout.short(), res.plans[0].estimate])
    rows.append(["rules of thumb", h.layout.short(), h.estimate])
    out.append(_table(["", "Layout", "Step s", "Tot GiB", "Fits", "tok/s/GPU", "MFU", "Bottleneck"],
                      [[n, s, f"{e.step_time_s:.3f}", f"{e.memory_gib.total:.1f}", "yes" if e.fits else "no",
                        f"{e.tokens_per_s_per_gpu:,.0f}", f"{e.mfu:.1%}", e.bottleneck] for n, s, e in rows],
                      {2, 3, 5, 6}))
    he = h.estimate
    if res.plans and he.fits:
        out.append("")
        best = res.plans[0].estimate
        speedup = he.step_time_s / best.step_time_s
        out.append(f"Predicted speedup of autopar's best over the rules-of-thumb layout: **{speedup:.2f}×** "
                   f"({he.step_time_s:.3f} → {best.step_time_s:.3f} s/step, "
                   f"{best.tokens_per_s_per_gpu / he.tokens_per_s_per_gpu - 1:+.1%} tokens/s/GPU).")
    elif res.plans:
        out += ["", f"The rules-of-thumb layout does not fit ({he.memory_gib.total:.1f} GiB > {he.hbm_gib:.1f}), so "
                    "it is no baseline: no speedup is claimed over it."]
    if res.heuristic_reasons:
        out += ["", "Rules it followed:", ""] + [f"- {r}" for r in res.heuristic_reasons]
    return "\n".join(out)


def _advice_section(advice: list[str]) -> str:
    out = ["## What to try next", ""]
    if not advice:
        out.append("No advice: no valid single-step change of the best layout was found.")
    else:
        out.append("Single-step changes of the best layout, each predicted with the same model:")
        out.append("")
        out += [f"{i}. {a}" for i, a in enumerate(advice, 1)]
    return "\n".join(out)


def _solver_section(res: SolveResult) -> str:
    rows = [("Method", res.method), ("Status", res.status), ("Optimality gap", f"{res.gap:.2%}"),
            ("Search time", f"{res.solve_s:.2f} s"), ("Space", f"{res.space_size:,} layouts over {res.meshes} "
                                                               "meshes (before validity rules)"),
            ("Layouts listed", str(len(res.plans)))]
    out = ["## Solver", "", _kv(rows)]
    if res.explanation:
        out += ["", "Why nothing fits:", ""] + [f"- {line}" for line in res.explanation]
    if res.notes:
        out += ["", "Notes:", ""] + [f"- {n}" for n in res.notes]
    return "\n".join(out)


def _summary(res: SolveResult, hw: HardwareSpec) -> str:
    if not res.plans:
        return f"**No layout fits** ({res.method}, status {res.status}); see Solver below."
    b = res.plans[0].estimate
    lines = [f"- Best layout: **{b.layout.short()}**",
             f"- Predicted step time {b.step_time_s:.3f} s, {b.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, "
             f"MFU {b.mfu:.1%}, {b.memory_gib.total:.1f} of {hw.hbm_gib:.1f} GiB per GPU, bottleneck "
             f"{b.bottleneck}"]
    if len(res.plans) > 1:
        steps = [p.estimate.step_time_s for p in res.plans]
        lines.append(f"- {len(res.plans)} layouts listed, step time {min(steps):.3f}–{max(steps):.3f} s")
    if res.heuristic and res.heuristic.estimate.fits:
        lines.append(f"- {res.heuristic.estimate.step_time_s / b.step_time_s:.2f}× as fast as the rules-of-thumb "
                     f"layout ({res.heuristic.layout.short()})")
    elif res.heuristic:
        lines.append(f"- The rules-of-thumb layout ({res.heuristic.layout.short()}) does not fit "
                     f"({res.heuristic.estimate.memory_gib.total:.1f} of {hw.hbm_gib:.1f} GiB), so it is no baseline")
    lines.append(f"- Search: {res.method}, {res.status_text()}, {res.solve_s:.2f} s")
    return "\n".join(lines)


def _points(res: SolveResult) -> list[Point]:
    pts = [Point(f"#{p.rank}", p.estimate) for p in res.plans]
    if res.heuristic:
        pts.append(Point("heuristic", res.heuristic.estimate))
    return pts


def render_markdown(result: SolveResult, model: ModelSpec, hardware: HardwareSpec, training: TrainingSpec,
                    gpus: int, *, advice: list[str], images: dict[str, str] | None = None) -> str:
    """The report as Markdown text. ``images`` maps 'memory' / 'pareto' to the figure paths to link
    (relative to the report)."""
    res, hw = result, hardware
    title = f"# autopar layout analysis — {model.name} on {gpus} × {hw.name}"
    parts = [title, _summary(res, hw), _model_section(model, training), _training_section(model, training),
             _hardware_section(hw, training, gpus), _ranked_section(res, hw)]
    if res.plans or res.heuristic:
        parts.append(_legend_section())
    fig = _figures_section(images or {}, res)
    if fig:
        parts.append(fig)
    if res.plans:
        est = Estimator(model, hw, training, gpus)
        parts.append(_detail_section("#1 in detail", est, res.plans[0].estimate, hw, training))
    parts += [_heuristic_section(res), _advice_section(advice), _solver_section(res),
              "---\n\n*" + APPROX_NOTE + " Memory and step times are predictions of an analytical model, not "
              "measurements; measure the chosen layout before committing a long run.*"]
    return "\n\n".join(parts) + "\n"


def _write(path: Path, data: bytes, overwrite: bool) -> None:
    try:
        with open(path, "wb" if overwrite else "xb") as f:
            f.write(data)
    except FileExistsError:
        raise AutoparInputError(f"{path} already exists; not overwriting it (choose another report path or "
                                "pass overwrite=True)") from None


def write_report(result: SolveResult, model: ModelSpec | str | Path, hardware: HardwareSpec | str | Path,
                 training: TrainingSpec, gpus: int, path: Path | str, *, advice: list[str],
                 overwrite: bool = False, max_bars: int = 8) -> list[Path]:
    """Write the Markdown report to ``path`` and its figures beside it (``<stem>_memory.png``,
    ``<stem>_pareto.png``); return the paths written, report first.

    Raises AutoparInputError, before writing anything, if any of those files exists (unless
    ``overwrite``) or ``path`` is a folder. The figures are left out when there is no layout to draw
    (nothing fits and no rules-of-thumb layout); the memory figure shows the first ``max_bars`` layouts
    plus the rules-of-thumb one."""
    model, hardware = load_model(model), load_hardware(hardware)
    md_path, mem_path, par_path = report_paths(path)
    points = _points(result)
    targets = [md_path] + ([mem_path, par_path] if points else [])
    for p in targets:
        if p.is_dir():
            raise AutoparInputError(f"{p} is a folder; give a file name for the report, e.g. {p / 'report.md'}")
        if p.exists() and not overwrite:
            raise AutoparInputError(f"{p} already exists; not overwriting it (choose another report path or "
                                    "pass overwrite=True)")
    md_path.parent.mkdir(parents=True, exist_ok=True)
    images: dict[str, str] = {}
    written: list[Path] = []
    if points:
        hw = hardware.hbm_gib
        name = f"{model.name} on {gpus} × {hardware.name}"
        bars = [q for q in points if q.label != "heuristic"][:max_bars] + \
               [q for q in points if q.label == "heuristic"]
        best = points[0] if result.plans else None
        figs = ((mem_path, "memory", memory_png(bars, hw, f"Memory per GPU — {name}")),
                (par_path, "pareto", pareto_png(points, hw, best, f"Step time vs memory — {name}")))
        for fpath, key, data in figs:
            _write(fpath, data, overwrite)
            written.append(fpath)
            images[key] = fpath.name
    text = render_markdown(result, model, hardware, training, gpus, advice=advice, images=images)
    _write(md_path, text.encode("utf-8"), overwrite)
    return [md_path, *written]
