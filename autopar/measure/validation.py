"""Predicted vs measured throughput on published training runs (``data/published_runs.csv``).

Each row gives a model, a system, a layout and a **measured** throughput. The comparison is on
tokens/s/GPU, taken from the row in this order:
  1. ``tokens_per_s_per_gpu`` when the source prints it;
  2. else ``global_batch · seq_len / (step_time_s · gpus)`` when the source prints the step time;
  3. else the source's model TFLOP/s/GPU divided by **that source's own FLOP accounting** per token:
     - Megatron-LM 2021 (rows ``mlm21-``): Narayanan et al. 2021, arXiv 2104.04473, eq. 3, which counts
       activation recomputation: F/token = 96·l·h²·(1 + s/(6h) + V/(16·l·h));
     - Megatron-Core (rows ``mcore08-``, ``moezoo-``): ``num_floating_point_operations`` of
       megatron/training/training.py: F/token = 12·l·h²·[(1 + g/a + c·s/h)·(a·d/h) + (f/h)·k·γ + f_sh/h·γ
       + V/(2·l·h)], γ = 3/2 for gated MLPs, 1 otherwise, no recomputation. c = 1 (full s×s attention) in
       Megatron-Core r0.8 (the ``mcore08-`` rows, 2024); c = 1/2 for the 2025 Megatron-MoE ModelZoo runs
       (``moezoo-``), whose Megatron-LM counts causal self-attention at half (``causal_self_attn``); c = 1 for
       NeMo's long-sequence runs (``nemolong-``, hold-out), whose NeMo llama2/llama3 formula (NVIDIA/NeMo@v2.3.0rc2
       nemo/utils/flops_formulas.py: l·h²·(12 + 12g/a + 18f/h + 12s/h + 6V/(l·h))) is this one term for term;
     - anything else (Llama 3 405B): autopar's own model FLOPs (an approximation, flagged in the output).
Each row names the software stack it ran (column ``stack``, a ``stacks/`` file; blank: ``megatron_core``, as every
source before stacks existed) and the knobs the source states (column ``knobs``, :func:`autopar.specs.stack.
parse_knobs`): their TrainingSpec switches and the stack's own fitted constants price the row. Blank-stack rows keep
TP communication overlap off unless the notes say ``--tp-comm-overlap``.
Row fields the source leaves empty are filled with stated defaults (micro-batch 1, no recompute,
non-interleaved pipeline, SP on when TP > 1 except in 2021 Megatron-LM which predates SP, ZeRO-1 except
Megatron-LM 2021's plain DDP) and each filled field is listed with the row.
"""

from __future__ import annotations

import csv
import re
import io
import math
from dataclasses import dataclass, field
from itertools import combinations, product
from pathlib import Path

from autopar.cost import Estimator
from autopar.errors import AutoparInputError
from autopar.measure.record import Comparison, PairOrder, max_abs_error, mean_abs_error, pair_order
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import RECOMPUTE_MODULES, Layout, balanced_stage_layers, resolve_layout
from autopar.specs.bounds import BOUNDS, bound_note, limit
from autopar.specs.loaders import build_spec, load_hardware, load_model, load_stack, read_text_file, zoo_dir
from autopar.specs.model import ModelSpec
from autopar.specs.stack import parse_knobs
from autopar.specs.training import TrainingSpec

try:
    DEFAULT_CSV = zoo_dir("data") / "published_runs.csv"   # autopar/_zoo/data in a wheel, data/ in a checkout
except AutoparInputError:                                  # reported when validate runs without --csv
    DEFAULT_CSV = Path("published_runs.csv")
# The out-of-sample check: Megatron-Bridge's releases before 26.06 (data/published_runs_holdout_skipped.txt). It is
# only ever predicted: no fit reads it (is_holdout_csv), so its error stays an honest out-of-sample figure.
HOLDOUT_CSV = DEFAULT_CSV.with_name("published_runs_holdout.csv")


def is_holdout_csv(path: Path | str) -> bool:
    """True for the shipped hold-out file or any file of that name (a copy of it)."""
    p = Path(path)
    if p.name == HOLDOUT_CSV.name:
        return True
    try:
        return p.exists() and HOLDOUT_CSV.exists() and p.samefile(HOLDOUT_CSV)
    except OSError:
        return False


@dataclass
class Case:
    """One published run turned into autopar inputs."""

    row_id: str
    model: ModelSpec
    hardware: HardwareSpec
    training: TrainingSpec
    layout: Layout
    gpus: int
    measured_tokens: float
    measured_from: str
    assumptions: list[str] = field(default_factory=list)
    stack: str = "megatron_core"
    measured_mem_gib: float | None = None


@dataclass(kw_only=True)
class RowResult(Comparison):
    """A published run: predicted vs measured tokens/s/GPU (``error`` = predicted / measured − 1)."""

    case: Case
    hbm_gib: float
    bottleneck: str
    quantity: str = "tokens_per_s_per_gpu"

    @property
    def predicted_tokens(self) -> float:
        return self.predicted

    @property
    def memory_gib(self) -> float:
        return self.predicted_mem_gib


@dataclass
class Report:
    rows: list[RowResult]
    skipped: list[tuple[str, str]]

    @property
    def mape(self) -> float:
        return mean_abs_error(self.rows)

    @property
    def max_abs_error(self) -> float:
        return max_abs_error(self.rows)

    @property
    def ranking(self) -> PairOrder:
        """Within-source pairs of runs ordered as measured (:func:`autopar.measure.record.pair_order`): a pair the
        model predicts equal counts as wrong."""
        return pair_order(self.rows, [GROUPINGS["source"](r.case) for r in self.rows])

    @property
    def predicted_oom(self) -> list[str]:
        return [r.case.row_id for r in self.rows if not r.fits]

    def breakdown(self) -> dict[str, dict[str, tuple[int, float, float]]]:
        """Error by group, for each way of grouping the rows: {grouping: {group: (rows, mean |err|, mean err)}}.
        Groupings: source (the row id's prefix), dense/MoE, precision, system, context length."""
        out: dict[str, dict[str, tuple[int, float, float]]] = {}
        for name, key in GROUPINGS.items():
            groups: dict[str, list[float]] = {}
            for r in self.rows:
                groups.setdefault(key(r.case), []).append(r.error)
            out[name] = {g: (len(v), sum(abs(e) for e in v) / len(v), sum(v) / len(v))
                         for g, v in sorted(groups.items())}
        return out


def _context_bucket(c: "Case") -> str:
    s = c.training.seq_len
    return "<= 4K" if s <= 4096 else "8K-16K" if s <= 16384 else "32K-64K" if s <= 65536 else "> 64K"


GROUPINGS = {
    "source": lambda c: c.row_id.split("-")[0],
    "dense/MoE": lambda c: "MoE" if c.model.is_moe else "dense",
    "precision": lambda c: c.training.precision,
    "system": lambda c: c.hardware.name,
    "stack": lambda c: c.stack,
    "context": _context_bucket,
}


def _int(row: dict[str, str], col: str, default: int | None = None) -> int | None:
    """A whole-number cell (blank: ``default``); anything else is an error naming the column."""
    v = row[col]
    if not v:
        return default
    try:
        return int(v)
    except ValueError:
        pass
    try:
        f = float(v)
    except ValueError:
        f = math.nan
    if not (math.isfinite(f) and f.is_integer()):
        raise AutoparInputError(f"column '{col}': expected a whole number, got '{v[:40]}'")
    return int(f)


def _count(row: dict[str, str], col: str) -> int:
    """A required positive whole-number cell."""
    v = _int(row, col)
    if v is None:
        raise AutoparInputError(f"column '{col}' is empty")
    if v < 1:
        raise AutoparInputError(f"column '{col}' must be at least 1, got {v}")
    return v


def _float(row: dict[str, str], col: str) -> float | None:
    """A positive finite number, or None for a blank cell."""
    v = row[col]
    if not v:
        return None
    try:
        f = float(v)
    except ValueError:
        raise AutoparInputError(f"column '{col}': expected a number, got '{v[:40]}'") from None
    if not (math.isfinite(f) and f > 0):
        raise AutoparInputError(f"column '{col}' must be a positive finite number, got '{v[:40]}'")
    return f


def megatron2021_flops_per_token(m: ModelSpec, s: int) -> float:
    """Narayanan et al. 2021 eq. 3 divided by B·s (includes the recomputed forward pass)."""
    l, h, V = m.num_layers, m.hidden_size, m.vocab_size
    return 96.0 * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def megatron_core_flops_per_token(m: ModelSpec, s: int, causal: bool = False) -> float:
    """Megatron-Core's num_floating_point_operations divided by B·s (GQA, gated MLP, MoE top-k)."""
    l, h, a, g = m.num_layers, m.hidden_size, m.num_attention_heads, m.kv_heads
    gamma = 1.5 if m.gated_mlp else 1.0
    attn = (1 + g / a + (0.5 if causal else 1.0) * s / h) * (a * m.dim_per_head / h)
    if m.moe:
        n_moe = m.num_moe_layers
        mlp = ((l - n_moe) * m.ffn_hidden_size / h + n_moe * (m.moe.expert_ffn_hidden_size / h * m.moe.top_k
               + m.moe.num_shared_experts * m.moe.shared_ffn / h)) * gamma / l
    else:
        mlp = m.ffn_hidden_size / h * gamma
    return 12.0 * l * h * h * (attn + mlp + m.vocab_size / (2 * l * h))


def _recompute_choices() -> list[str]:
    """Every recompute policy: none, full, and each non-empty set of modules (the layout rules reject the sets
    that do not apply to the model)."""
    subsets = [",".join(c) for n in range(1, len(RECOMPUTE_MODULES) + 1) for c in combinations(RECOMPUTE_MODULES, n)]
    return ["none", "full", *subsets]


def row_to_case(row: dict[str, str], hardware_override: dict[str, HardwareSpec] | None = None) -> Case:
    rid = row["id"]
    src = rid.split("-")[0]
    notes: list[str] = []
    model = load_model(row["model"])
    hw = (hardware_override or {}).get(row["system"]) or load_hardware(row["system"])
    gpus, seq, gb = _count(row, "gpus"), _count(row, "seq_len"), _count(row, "global_batch")
    if gpus > limit("gpus"):
        raise AutoparInputError(f"column 'gpus' = {gpus:,}: autopar's bound {bound_note('gpus')}")
    prec = row["precision"] or "bf16"
    if not row["precision"]:
        notes.append("precision n/f: bf16")
    half = "fp16" if prec == "fp16" else "bf16"
    routing = "dropless" if "dropless" in rid else "balanced"
    # The stack the run used (column 'stack', blank: Megatron-Core, as every source before stacks existed) with the
    # knobs the source states (column 'knobs', autopar.specs.stack.parse_knobs syntax): its TrainingSpec switches
    # and its fitted efficiency constants.
    stack = load_stack(row.get("stack") or "megatron_core")
    knobs = stack.with_knobs(parse_knobs(row.get("knobs", "")))
    kernels = knobs.training_fields()
    hw = stack.on(hw)
    if src == "mlm21":
        # Megatron-LM 2021 predates FlashAttention (2022) and the fused cross entropy: attention was batched GEMMs
        # around a fused scale-mask-softmax kernel, with attention dropout, and the loss plain vocab-parallel.
        # Its TP all-reduces were synchronous: the async all-reduce behind the weight-gradient GEMM came later
        # (NVIDIA/Megatron-LM cf7efd4f, 2021-09-02, --async-tensor-parallel-allreduce).
        kernels.update(attention_kernel="unfused", cross_entropy="unfused", tp_dgrad_overlap=False)
        notes.append("kernels (2021): unfused attention and cross entropy, synchronous TP all-reduces")
    tp, pp = _int(row, "tp", 1), _int(row, "pp", 1)
    text = row.get("notes", "")
    if not row.get("stack"):
        # Rows before stack files: TP communication overlap is a framework switch, on only where the source says the
        # run used it; so is the MoE all-to-all overlap (Megatron's combined 1F1B, --overlap-moe-expert-parallel-comm).
        # DP overlap (--overlap-grad-reduce, PyTorch DDP's bucketed all-reduce in 2021) and ring attention's KV
        # overlap are the frameworks' defaults: on. Rows with a stack state their switches in the 'knobs' column.
        kernels["tp_comm_overlap"] = "--tp-comm-overlap" in text
        kernels["ep_comm_overlap"] = "1f1b overlap" in text or "--overlap-moe-expert-parallel-comm" in text
    if not kernels["tp_comm_overlap"] and tp > 1:
        notes.append("TP comm overlap n/f: off")
    if model.is_moe and not kernels["ep_comm_overlap"] and _int(row, "ep", 1) > 1:
        notes.append("EP comm overlap n/f: off")
    fsdp = _int(row, "fsdp")
    if fsdp == 1 and pp > 1 and kernels.get("dp_impl") == "fsdp2" and kernels.get("pp_fsdp") == "per_step":
        # torchtitan's FSDP2 under PP keeps each stage's parameters gathered (parallelize_llama.py@9dec370
        # apply_fsdp: reshard_after_forward = False when pp_enabled) and the pipeline schedule skips the gradient
        # reduce-scatter until the last micro-batch (torch.distributed.pipelining stage.py backward_maybe_with_nosync:
        # set_requires_gradient_sync(False), set_reshard_after_backward(False)), so FSDP2 accumulates the unsharded
        # gradients in its reduce dtype, float32 (FSDPParam.to_accumulated_grad_if_needed; the fp32 itself is the
        # stack's data_parallel=fsdp2, TrainingSpec). In autopar's terms that is ZeRO-1 with fp32 gradients: unsharded
        # bf16 weights and fp32 gradients, sharded optimizer state, one all-gather and one fp32 reduce-scatter per
        # step (cost/dp.py prices it under pp_fsdp per_step).
        zero = 1
        notes.append("FSDP2 under PP: parameters kept gathered, fp32 gradients accumulated unsharded (ZeRO-1, fp32 "
                     "grads)")
    elif fsdp == 1:
        zero = 2 if "not resharded" in text else 3
    elif src == "mlm21":
        zero = 0          # 2021 Megatron-LM: plain DDP, no distributed optimizer
    else:
        zero = 1
        if fsdp is None:
            notes.append("sharding n/f: distributed optimizer (ZeRO-1)")
    training = build_spec(TrainingSpec, dict(seq_len=seq, global_batch=gb, precision=prec, weight_dtype=half,
                                             **({} if kernels.get("dp_impl") == "fsdp2" else {"grad_dtype": half}),
                                             moe_routing=routing if model.is_moe else "balanced",
                                             **kernels), "training")
    hw.peak_tflops(prec)       # a precision the chip lacks fails here, naming it
    vpp = _int(row, "vpp")
    choose_vpp = vpp is None and pp > 1
    if vpp is None:
        vpp = 1
    cp, ep, etp = _int(row, "cp", 1), _int(row, "ep", 1), _int(row, "etp", 1)
    mbs = _int(row, "micro_batch")
    if mbs is None:
        mbs = 1
        notes.append("micro_batch n/f: 1")
    sp_cell = row["sequence_parallel"]
    sp = None if not sp_cell else sp_cell in ("1", "true", "True")
    if src == "mlm21":
        sp = False
    rc = row["recompute"] or "none"
    choose_rc = not row["recompute"]
    stage = None
    if pp < 1 or vpp < 1:
        raise AutoparInputError(f"pp ({pp}) and vpp ({vpp}) must be at least 1")
    # The recipe's own split, where the source states one (Megatron --pipeline-model-parallel-layout), written in
    # the notes as 'pipeline split A/B/..': transformer layers per pipeline rank, its virtual chunks summed; the LM
    # head and MTP layers sit on the last rank, as autopar puts them.
    split_note = re.search(r"pipeline split (\d+(?:/\d+)+)", text)
    stated = split_note.group(1) if split_note else ""
    if stated:
        stage = tuple(int(x) for x in stated.split("/"))
        if len(stage) != pp or sum(stage) != model.num_layers or min(stage) < 1:
            raise AutoparInputError(f"{rid}: notes 'pipeline split {stated}' needs pp = {pp} positive layer counts "
                                    f"summing to the model's {model.num_layers} layers")
        notes.append(f"pipeline split stated by the recipe: {stated} layers")
    elif model.num_layers % (pp * vpp):
        stage = balanced_stage_layers(model.num_layers, pp, vpp)
        notes.append(f"uneven pipeline: {stage[0]}/{stage[1]}../{stage[-1]} layers" if stage else "")
    # "activation offloading required" without the modules: the offloaded share is chosen below like V.
    offload = "activation offloading" in text
    layout = build_spec(Layout, dict(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, micro_batch=mbs, zero_stage=zero,
                                     sequence_parallel=sp, recompute=rc, stage_layers=stage,
                                     offload_activations=1.0 if offload else 0), "layout")
    layout = resolve_layout(layout, model, training, gpus)
    if choose_vpp or choose_rc or offload:
        # The source ran the layout without printing V (often interleaved) or the recompute policy: fill them the
        # way autopar would for a user, with the fastest valid choice that fits by its own prediction (V in 1..8;
        # recompute: none, full or any set of the modules Megatron-Core can recompute; the offloaded share in
        # eighths when the source says it offloaded activations), and state it with the row.
        # The run fitted, so fitting comes first; then V >= 2 when the source says it ran interleaved.
        est = Estimator(model, hw, training, gpus)
        best = None
        interleaved = "interleaved" in text   # the source says V > 1 without giving it
        # Uneven virtual chunks: Megatron-LM's --pipeline-model-parallel-layout (2025, the moezoo rows) and Llama
        # 3's own pipeline (arXiv 2407.21783 sec. 3.3.2) have them; Megatron-Core r0.8 and NeMo 24.07 on it need
        # pp·V to divide the layers.
        vpps = [v for v in range(1, 9)
                if src in ("moezoo", "l3paper") or v == 1 or model.num_layers % (pp * v) == 0]
        choices = product(vpps if choose_vpp else [layout.vpp],
                          _recompute_choices() if choose_rc else [layout.recompute],
                          [k / 8 for k in range(1, 9)] if offload else [0.0])
        for v, policy, share in choices:
            split = stage if (stage is None or not choose_vpp or stated) else balanced_stage_layers(model.num_layers, pp, v)
            try:
                cand = resolve_layout(layout.model_copy(update={
                    "vpp": v, "stage_layers": split, "dp": None, "grad_accum": None, "recompute": policy,
                    "offload_activations": share}), model, training, gpus)
            except AutoparInputError:
                continue
            e = est.estimate(cand, resolved=True)
            key = (not e.fits, interleaved and v == 1, e.step_time_s)
            if best is None or key < best[0]:
                best = (key, cand)
        if best is None:
            raise AutoparInputError("no V, recompute policy or offloaded share makes the row's layout valid")
        layout = best[1]
        if choose_vpp:
            notes.append(f"vpp n/f: autopar's fastest valid V = {layout.vpp}" + (
                " (the source ran interleaved, but no V >= 2 fits autopar's memory model, which counts Megatron's "
                "in-flight micro-batches; the source's schedule must hold fewer)" if interleaved and layout.vpp == 1
                else ""))
        if choose_rc:
            notes.append(f"recompute n/f: autopar's fastest that fits = {layout.recompute}")
        if offload:
            notes.append(f"offloaded share n/f: autopar's fastest that fits = {layout.offload_activations:.0%}")

    tokens = _float(row, "tokens_per_s_per_gpu")
    step = _float(row, "step_time_s")
    tflops = _float(row, "model_tflops_per_gpu")
    if tokens:
        how = "tokens/s"
    elif step:
        tokens, how = gb * seq / (step * gpus), "step time"
    elif tflops:
        if src == "mlm21":
            f, how = megatron2021_flops_per_token(model, seq), "TFLOP/s ÷ Megatron-2021 eq.3"
        elif src in ("mcore08", "moezoo", "nemolong"):
            f = megatron_core_flops_per_token(model, seq, causal=src == "moezoo")
            how = "TFLOP/s ÷ Megatron-Core formula" + (" (causal)" if src == "moezoo" else "")
        else:
            f, how = model.training_flops_per_token(seq), "TFLOP/s ÷ autopar FLOPs (approx.)"
        tokens = tflops * 1e12 / f
    else:
        raise AutoparInputError(f"{rid}: no measured throughput (tokens/s, step time or TFLOP/s)")
    return Case(rid, model, hw, training, layout, gpus, tokens, how, [n for n in notes if n], stack=stack.name,
                measured_mem_gib=_float(row, "memory_gib"))


CSV_REQUIRED = ("id", "model", "system", "gpus", "seq_len", "global_batch", "tp", "pp")
CSV_OPTIONAL = ("precision", "vpp", "cp", "ep", "etp", "micro_batch", "fsdp", "sequence_parallel", "recompute",
                "tokens_per_s_per_gpu", "model_tflops_per_gpu", "step_time_s", "notes", "stack", "knobs", "memory_gib")


def load_cases(path: Path = DEFAULT_CSV, hardware_override: dict[str, HardwareSpec] | None = None
               ) -> tuple[list[Case], list[tuple[str, str]]]:
    """The runs of a CSV file as Cases, and (row id, reason) for every row that cannot be used: a short row, a
    blank or non-numeric cell where a number is needed, a value a spec rejects. A broken file (missing, not
    text, no header with the required columns) is an AutoparInputError."""
    if not str(path).strip():
        raise AutoparInputError("validation file: empty path")
    path = Path(path)
    if not path.exists():
        raise AutoparInputError(f"validation file not found: {path}")
    text = read_text_file(path).removeprefix("\ufeff")     # a byte-order mark (Excel's "CSV UTF-8") is no column
    reader = csv.DictReader(io.StringIO(text, newline=""))
    max_rows = limit("csv_rows")
    try:
        header = reader.fieldnames or []
        missing = [c for c in CSV_REQUIRED if c not in header]
        if missing:
            raise AutoparInputError(f"{path}: missing columns {', '.join(missing)}")
        cases, skipped = [], []
        rows = []
        for row in reader:          # counted before any is estimated: a file over the bound costs no work
            if len(rows) == max_rows:
                raise AutoparInputError(f"{path}: more than {BOUNDS['csv_rows']} rows; autopar validates at most "
                                        f"{BOUNDS['csv_rows']} ({BOUNDS['csv_rows'].why})")
            rows.append((reader.line_num, row))
        for line_num, row in rows:
            rid = (row.get("id") or "").strip() or f"line {line_num}"
            if None in row:
                skipped.append((rid, f"{len(header) + len(row[None])} cells, the header has {len(header)}"))
                continue
            if any(v is None for v in row.values()):
                have = sum(v is not None for v in row.values())
                skipped.append((rid, f"short row: {have} cells, the header has {len(header)}"))
                continue
            cells = {c: (row.get(c) or "").strip() for c in (*CSV_REQUIRED, *CSV_OPTIONAL)}
            cells["id"] = rid
            try:
                cases.append(row_to_case(cells, hardware_override))
            except AutoparInputError as err:
                skipped.append((rid, str(err)))
    except csv.Error as err:
        raise AutoparInputError(f"{path}: malformed CSV at line {reader.line_num}: {err}") from None
    return cases, skipped


def evaluate(cases: list[Case], hardware_override: dict[str, HardwareSpec] | None = None) -> list[RowResult]:
    out = []
    for c in cases:
        hw = (hardware_override or {}).get(c.hardware.name, c.hardware)
        est = Estimator(c.model, hw, c.training, c.gpus).estimate(c.layout, resolved=True)
        out.append(RowResult(label=c.row_id, case=c, predicted=est.tokens_per_s_per_gpu, measured=c.measured_tokens,
                             fits=est.fits, predicted_mem_gib=est.memory_gib.total, hbm_gib=est.hbm_gib,
                             measured_mem_gib=c.measured_mem_gib,
                             bottleneck=est.bottleneck))
    return out


def validate(path: Path = DEFAULT_CSV, hardware_override: dict[str, HardwareSpec] | None = None) -> Report:
    """Every usable row of the runs CSV estimated and compared. AutoparInputError when no row is usable (a
    header-only file, or every row skipped): there is no error to report then."""
    cases, skipped = load_cases(path, hardware_override)
    if not cases:
        raise AutoparInputError(f"{path}: no usable row to validate ({len(skipped)} skipped"
                                + (f"; {summarize_skipped(skipped, 1)[0]}" if skipped else "") + ")")
    return Report(evaluate(cases, hardware_override), skipped)


def summarize_skipped(skipped: list[tuple[str, str]], max_reasons: int = 20) -> list[str]:
    """One line per distinct skip reason, most frequent first, with how many rows it took and the first ids; at
    most ``max_reasons`` lines plus one that counts the rest (10^6 rows naming one unknown model are one line)."""
    by_reason: dict[str, list[str]] = {}
    for rid, why in skipped:
        by_reason.setdefault(why, []).append(rid)
    ranked = sorted(by_reason.items(), key=lambda kv: -len(kv[1]))
    lines = []
    for why, ids in ranked[:max_reasons]:
        shown = ", ".join(ids[:3]) + (f" and {len(ids) - 3:,} more" if len(ids) > 3 else "")
        lines.append(f"skipped {shown}: {why}" if len(ids) == 1 else f"skipped {len(ids):,} rows ({shown}): {why}")
    rest = ranked[max_reasons:]
    if rest:
        lines.append(f"... and {sum(len(ids) for _, ids in rest):,} more rows skipped for {len(rest):,} other "
                     "reasons (--json lists every row)")
    return lines
