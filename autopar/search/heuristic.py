"""Rules-of-thumb baseline: the layout the rules document recommends, repaired to validity.

This is the baseline the solver must beat. Every rule comes from
the project's reference note ``parallelism-strategy-rules.md`` ("the rules"), applied literally, section by section:

1. **Decision by Model Size.**
   *Dense models* by total parameters (the table): < 1B DP only; 1-10B TP 2-4; 10-70B TP 4-8 + PP 2-4;
   70-175B TP 8 + PP 4-8; 175-500B TP 8 + PP 8-16 + CP 2; above 500B the table is extrapolated (PP range
   doubles per class, TP stays 8, CP 2) and the reasons say so. Where the table gives a range, the degree
   is picked by where the size sits inside its class on a log scale (bottom half of 70-175B -> PP 4).
   *MoE models*: a model that is one of the table's named rows (matched by name, and by total size within
   25%) gets that row (TP, PP, EP; Qwen3 235B-A22B also "CP=2 for pretrain"). Any other MoE model follows
   the table's *Key patterns*: TP by active parameters, EP by expert count, PP for depth; the thresholds
   are fitted to the table's rows and quoted in the reasons.
2. **Decision by Sequence Length.** < 2K standard; 2K-8K add SP; 8K-32K add CP 2; above 32K CP 4-8
   (CP 4 up to 64K, CP 8 above). CP from the size table and from the sequence table: the larger wins.
3. **Decision by Hardware Topology.** TP stays inside one NVLink domain. EP may span domains (the table's
   large-EP rows, EP 16-64 on 8-GPU HGX nodes, assume it; :func:`autopar.specs.layout.check_layout` allows it).
4. **Minimum GPU Count** / **Combined Parallelism Enablement.** min_gpus = PP·max(TP·CP, EP·ETP);
   DP = gpus/(TP·PP·CP) and EDP = gpus/(PP·EP·ETP) are implicit.
5. **Pitfalls.** 2: interleaved pipeline (VPP 2) whenever the stages allow it; 3: SP only with TP > 1;
   4: CP needs seq_len % (2·CP) == 0; 5: EP only on MoE models.

Then the target is **repaired** to the nearest layout that is valid on the actual GPU count and model:
the candidates are every TP, CP, PP, EP that divide the GPU count (TP also dividing heads and FFN and
fitting the NVLink domain, EP dividing the experts), ranked by how many halvings/doublings they are from
the target (ties keep TP, then CP, then PP closest and prefer the larger degree); the first one that
passes ``check_layout`` wins. Layers that do not divide by PP are split unevenly, the first and last stage
lighter, as Megatron-LM's ``--decoder-first/last-pipeline-num-layers`` allow (DeepSeek-V3: 61 layers on PP 16
-> 3, 4 x 14, 2). Fixed settings: micro-batch 1, ZeRO-1 (Megatron distributed optimizer), selective
recomputation. No cost model is used: like the table, the heuristic knows nothing about memory.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from itertools import product

from autopar.errors import AutoparInputError
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import Layout, check_layout, resolve_layout
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

__all__ = ["DENSE_TABLE", "MOE_TABLE", "Degrees", "heuristic_layout", "heuristic_layout_with_reasons"]

RULES = "parallelism-strategy-rules.md"
GB = 1e9  # parameters per "B" in the rules' tables

# Sequence-length table ("Decision by Sequence Length"), in tokens: 2K = 2048 etc. Interval ends are
# inclusive at the top (8K is still "2K-8K", 32K still "8K-32K"; "32K+" starts above 32K).
SP_FROM_SEQ = 2048
CP2_ABOVE_SEQ = 8192
CP4_ABOVE_SEQ = 32768
CP8_ABOVE_SEQ = 65536  # "CP=4-8" above 32K: CP 4 up to 64K, CP 8 beyond (our split of the range)

# Fixed step settings of the baseline.
MICRO_BATCH = 1
ZERO_STAGE = 1  # Megatron --use-distributed-optimizer
RECOMPUTE = "selective"
VPP_WHEN_POSSIBLE = 2  # pitfall 2: "use virtual_pipeline_model_parallel_size when possible"


@dataclass(frozen=True)
class Degrees:
    """The parallel degrees a rule asks for (before batch, pipeline split and step settings)."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1

    def min_gpus(self) -> int:
        return self.pp * max(self.tp * self.cp, self.ep * self.etp)

    def label(self) -> str:
        s = f"TP{self.tp} PP{self.pp}"
        if self.cp > 1:
            s += f" CP{self.cp}"
        if self.ep > 1:
            s += f" EP{self.ep}"
        if self.etp > 1:
            s += f" ETP{self.etp}"
        return s


# ---- the rules' tables ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class DenseClass:
    """One row of the dense table: a size class [lo, hi) in billions and its recommended degrees."""

    lo_b: float
    hi_b: float
    label: str
    tp: tuple[int, int]
    pp: tuple[int, int]
    cp: int
    gpus: str

    def recommends(self) -> str:
        parts = []
        if self.tp == (1, 1) and self.pp == (1, 1) and self.cp == 1:
            return "DP only"
        parts.append(_range("TP", self.tp))
        if self.pp != (1, 1):
            parts.append(_range("PP", self.pp))
        if self.cp > 1:
            parts.append(f"CP{self.cp}")
        return " + ".join(parts + ["DP"])


DENSE_TABLE: tuple[DenseClass, ...] = (
    DenseClass(0, 1, "< 1B", (1, 1), (1, 1), 1, "1-8"),
    DenseClass(1, 10, "1-10B", (2, 4), (1, 1), 1, "8-16"),
    DenseClass(10, 70, "10-70B", (4, 8), (2, 4), 1, "16-64"),
    DenseClass(70, 175, "70-175B", (8, 8), (4, 8), 1, "64-256"),
    DenseClass(175, 500, "175-500B", (8, 8), (8, 16), 2, "256-1024"),
)


@dataclass(frozen=True)
class MoERow:
    """One named row of the MoE table. ``pattern`` is matched against the model name lower-cased with every
    non-alphanumeric character removed ("DeepSeek-V3" -> "deepseekv3")."""

    label: str
    pattern: str
    total_b: float
    active_b: float | None
    tp: int
    pp: int
    ep: int
    cp: int = 1
    note: str = ""


MOE_TABLE: tuple[MoERow, ...] = (
    MoERow("OLMoE 7B / 1B", r"olmoe", 7, 1, tp=1, pp=1, ep=8, note="EP only, fits single node"),
    MoERow("Moonlight 16B / 3B", r"moonlight", 16, 3, tp=2, pp=1, ep=8, note="small TP for shared layers"),
    MoERow("DeepSeek-V2 236B / 21B", r"deepseekv2(?!lite)", 236, 21, tp=1, pp=4, ep=32, note="no TP at all"),
    MoERow("GLM-4.5 Air 106B / 12B", r"glm45air", 106, 12, tp=1, pp=4, ep=8, note="no TP at all"),
    MoERow("Qwen3 30B-A3B", r"qwen3.*30ba3b", 30, 3, tp=4, pp=2, ep=4),
    MoERow("GLM-4.5 355B / 32B", r"glm45(?!air)", 355, 32, tp=2, pp=8, ep=16),
    MoERow("Qwen3 235B-A22B", r"qwen3.*235ba22b", 235, 22, tp=4, pp=16, ep=8, cp=2, note="CP=2 for pretrain"),
    MoERow("DeepSeek-V3 671B / 37B", r"deepseekv3", 671, 37, tp=2, pp=16, ep=64, note="TP=2, not 8"),
    MoERow("Kimi-K2 1T", r"kimik2", 1000, None, tp=2, pp=16, ep=32),
)
ROW_SIZE_TOLERANCE = 1.33  # a named row applies when total size is within x1.33 (about 25%) of the row's

# Derived MoE rules ("Key patterns"), thresholds fitted to the table's rows:
# TP by active params: rows with < 25B active use TP 1-2 ("TP can often stay at 1 or 2"), 32-37B active TP 2.
MOE_TP_BY_ACTIVE_B = ((25, 1), (75, 2), (150, 4), (math.inf, 8))
# EP by expert count: EP = num_experts / experts_per_gpu; the rows hold 4-32 experts per GPU, median 10 -> 8.
MOE_EXPERTS_PER_GPU = 8
# PP for depth: the rows use PP 1 below 20B total, 2 at 30B, 4 at 106-236B, 8 at 355B, 16 at 671B-1T.
MOE_PP_BY_TOTAL_B = ((20, 1), (100, 2), (300, 4), (600, 8), (math.inf, 16))


def _range(axis: str, r: tuple[int, int]) -> str:
    return f"{axis}{r[0]}" if r[0] == r[1] else f"{axis}{r[0]}-{r[1]}"


def _log2(x: float) -> float:
    return math.log2(x)


def _pick(r: tuple[int, int], frac: float) -> int:
    """Pick a power-of-two degree from the range r by the size's position ``frac`` in [0, 1) in its class."""
    lo, hi = r
    options = [lo]
    while options[-1] < hi:
        options.append(options[-1] * 2)
    return options[min(int(frac * len(options)), len(options) - 1)]


def _position(size_b: float, cls: DenseClass) -> float:
    """Where ``size_b`` sits inside its class on a log scale: 0 at the bottom, towards 1 at the top."""
    if cls.lo_b <= 0:
        return 0.0
    f = math.log(size_b / cls.lo_b) / math.log(cls.hi_b / cls.lo_b)
    return min(max(f, 0.0), 0.999)


def _dense_class(size_b: float) -> tuple[DenseClass, bool]:
    """The dense table's class for a size in billions; above 500B an extrapolated class (second value True).

    Extrapolation: each class above 500B is x(500/175) wider, its PP range doubles (the table's PP goes 2-4,
    4-8, 8-16), TP stays 8 (one NVLink node), CP stays 2, and the GPU range grows x4 as in the table."""
    for cls in DENSE_TABLE:
        if size_b < cls.hi_b:
            return cls, False
    r = 500 / 175
    j = max(1, math.ceil(math.log(size_b / 500) / math.log(r) - 1e-12))
    lo, hi = 500 * r ** (j - 1), 500 * r ** j
    cls = DenseClass(lo, hi, f"{lo:.0f}-{hi:.0f}B (extrapolated beyond the table's 500B)", (8, 8),
                     (16 * 2 ** (j - 1), 16 * 2 ** j), 2, f"{1024 * 4 ** (j - 1)}-{1024 * 4 ** j}")
    return cls, True


def _norm_name(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _nearest_divisor(n: int, target: int) -> int:
    """The divisor of n closest to target in log2 distance (ties: the larger)."""
    return min(_divisors(n), key=lambda d: (abs(_log2(d / target)), -d))


# ---- step 1: model size ----------------------------------------------------------------------------------
def _dense_target(model: ModelSpec, reasons: list[str]) -> Degrees:
    size_b = model.total_params / GB
    cls, extrapolated = _dense_class(size_b)
    f = _position(size_b, cls)
    tp, pp = _pick(cls.tp, f), _pick(cls.pp, f)
    text = (f"dense {size_b:.1f}B in {cls.label} -> {cls.recommends()} "
            f"({RULES}, Decision by Model Size, dense table; GPUs {cls.gpus})")
    if cls.tp[0] != cls.tp[1] or cls.pp[0] != cls.pp[1]:
        text += f"; {size_b:.1f}B sits {f:.0%} into the class on a log scale -> TP{tp} PP{pp}"
    reasons.append(text)
    if extrapolated:
        reasons.append(f"{size_b:.0f}B is above the table's last row (175-500B: TP8 + PP8-16 + CP2): extrapolated "
                       "by doubling the PP range per class as the table does, keeping TP8 and CP2")
    reasons.append("dense model: EP1, ETP1 (pitfall 5: EP is only for MoE models)")
    return Degrees(tp=tp, pp=pp, cp=cls.cp)


def _match_moe_row(model: ModelSpec, reasons: list[str]) -> MoERow | None:
    key = _norm_name(model.name)
    size_b = model.total_params / GB
    for row in MOE_TABLE:
        if re.search(row.pattern, key):
            ratio = size_b / row.total_b
            if 1 / ROW_SIZE_TOLERANCE <= ratio <= ROW_SIZE_TOLERANCE:
                return row
            reasons.append(f"name '{model.name}' matches the MoE table's row '{row.label}' but its {size_b:.1f}B "
                           f"total is not within 25% of {row.total_b:.0f}B: not that model, rules derived instead")
            return None
    return None


def _moe_target(model: ModelSpec, reasons: list[str]) -> Degrees:
    assert model.moe is not None
    total_b, active_b = model.total_params / GB, model.active_params / GB
    n_exp = model.moe.num_experts
    row = _match_moe_row(model, reasons)
    if row is not None:
        text = (f"MoE {model.name} ({total_b:.1f}B total / {active_b:.1f}B active) is the MoE table's row "
                f"'{row.label}' -> TP{row.tp} PP{row.pp} EP{row.ep}")
        if row.cp > 1:
            text += f" + CP{row.cp}"
        if row.note:
            text += f" ({row.note})"
        reasons.append(text + f" ({RULES}, Decision by Model Size, MoE table)")
        return Degrees(tp=row.tp, pp=row.pp, ep=row.ep, cp=row.cp)

    tp = next(t for limit, t in MOE_TP_BY_ACTIVE_B if active_b < limit)
    ep_goal = max(n_exp // MOE_EXPERTS_PER_GPU, min(n_exp, MOE_EXPERTS_PER_GPU))
    ep = _nearest_divisor(n_exp, ep_goal)
    pp = next(p for limit, p in MOE_PP_BY_TOTAL_B if total_b < limit)
    reasons.append(
        f"MoE {model.name} ({total_b:.1f}B total / {active_b:.1f}B active, {n_exp} experts) is not a named row of "
        f"the MoE table -> its key patterns ({RULES}, Decision by Model Size, MoE models): "
        f"TP by active params ({active_b:.1f}B active -> TP{tp}; rows under 25B active use TP1-2, 32-37B TP2); "
        f"EP by expert count (EP = experts / experts-per-GPU = {n_exp}/{MOE_EXPERTS_PER_GPU}, at least "
        f"min(experts, 8), nearest divisor of {n_exp} -> EP{ep}; the rows hold 4-32 experts per GPU, median 10); "
        f"PP for depth ({total_b:.0f}B total -> PP{pp}, {model.num_layers} layers; the rows use PP1 below 20B, "
        "2 to 100B, 4 to 300B, 8 to 600B, 16 above)")
    reasons.append("ETP1 (rules: ETP is rarely used)")
    return Degrees(tp=tp, pp=pp, ep=ep)


# ---- step 2: sequence length -----------------------------------------------------------------------------
def _sequence_cp(seq: int) -> tuple[int, str]:
    if seq > CP8_ABOVE_SEQ:
        return 8, "32K+ -> CP4-8 (CP8 above 64K); consider a2a+p2p for large CP"
    if seq > CP4_ABOVE_SEQ:
        return 4, "32K+ -> CP4-8 (CP4 up to 64K); consider a2a+p2p for large CP"
    if seq > CP2_ABOVE_SEQ:
        return 2, "8K-32K -> add CP2"
    if seq >= SP_FROM_SEQ:
        return 1, "2K-8K -> add SP, no CP"
    return 1, "< 2K -> standard TP + PP + DP, no SP, no CP"


def _apply_sequence_rules(t: Degrees, training: TrainingSpec, reasons: list[str]) -> Degrees:
    seq = training.seq_len
    cp, why = _sequence_cp(seq)
    text = f"sequence {seq} in {why} ({RULES}, Decision by Sequence Length)"
    if t.cp > cp:
        text += f"; the size rule already asks CP{t.cp}, kept"
    reasons.append(text)
    return replace(t, cp=max(t.cp, cp))


# ---- step 3: topology ----------------------------------------------------------------------------------
def _apply_topology(t: Degrees, hardware: HardwareSpec, reasons: list[str]) -> Degrees:
    dom = hardware.nvlink_domain_size
    if t.tp > dom:
        reasons.append(f"topology: TP{t.tp} would leave the NVLink domain ({dom} GPUs on {hardware.name}) -> "
                       f"TP <= {dom} ({RULES}, Decision by Hardware Topology: keep TP within one NVLink domain)")
        t = replace(t, tp=dom)
    else:
        reasons.append(f"topology: TP{t.tp} stays inside the NVLink domain ({dom} GPUs on {hardware.name}) "
                       f"({RULES}, Decision by Hardware Topology)")
    if t.ep * t.etp > dom:
        reasons.append(f"topology: EP{t.ep}·ETP{t.etp} = {t.ep * t.etp} spans NVLink domains ({dom} GPUs on "
                       f"{hardware.name}): kept (the rules only keep TP inside the domain; the table's large-EP rows "
                       "put EP across nodes, with the dispatch crossing the network once per node)")
    return t


# ---- step 4: a concrete layout for some degrees ---------------------------------------------------------
def _stage_split(num_layers: int, pp: int) -> tuple[int, ...] | None:
    """Layers per pipeline stage; None when they divide evenly.

    Uneven: every middle stage gets c = ceil(L/pp) layers and the first and last stages share the rest, the
    last one lighter (it also holds the LM head and MTP) -- Megatron-LM's --decoder-first-pipeline-num-layers /
    --decoder-last-pipeline-num-layers shape (DeepSeek-V3, 61 layers on 16 stages: 3, 4 x 14, 2). When that
    leaves the first or last stage empty, the extra layers go to the middle stages instead."""
    if num_layers % pp == 0:
        return None
    if num_layers < pp:
        raise ValueError(f"{num_layers} layers cannot fill {pp} pipeline stages")
    c = -(-num_layers // pp)
    rest = num_layers - (pp - 2) * c
    if rest >= 2:
        first = -(-rest // 2)
        return (first,) + (c,) * (pp - 2) + (rest - first,)
    base, extra = divmod(num_layers, pp)
    stages = [base] * pp
    order = list(range(1, pp - 1)) + [0, pp - 1]
    for i in order[:extra]:
        stages[i] += 1
    return tuple(stages)


def _build(d: Degrees, model: ModelSpec, training: TrainingSpec, gpus: int) -> Layout:
    """The baseline's Layout for degrees d: uneven stages when needed, VPP 2 when possible, SP by the rules."""
    n = model.num_layers
    stages = _stage_split(n, d.pp) if d.pp <= n else None
    per_stage = stages if stages is not None else (n // d.pp,) * d.pp
    dense = d.tp * d.cp * d.pp
    dp = gpus // dense if gpus % dense == 0 else 0
    micro_batches = training.global_batch // (dp * MICRO_BATCH) if dp else 0
    vpp = 1
    if (d.pp > 1 and all(s >= VPP_WHEN_POSSIBLE and s % VPP_WHEN_POSSIBLE == 0 for s in per_stage)
            and micro_batches and micro_batches % d.pp == 0):
        vpp = VPP_WHEN_POSSIBLE
    return Layout(tp=d.tp, pp=d.pp, vpp=vpp, cp=d.cp, ep=d.ep, etp=d.etp,
                  sequence_parallel=d.tp > 1 and training.seq_len >= SP_FROM_SEQ,
                  zero_stage=ZERO_STAGE, micro_batch=MICRO_BATCH, recompute=RECOMPUTE, stage_layers=stages)


# ---- step 5: repair to the nearest valid layout ---------------------------------------------------------
def _axis_candidates(model: ModelSpec, hardware: HardwareSpec, training: TrainingSpec,
                     gpus: int) -> dict[str, list[int]]:
    """Per-axis values that can be valid on their own: a quick filter; check_layout judges every combination."""
    dom = hardware.nvlink_domain_size
    divs = _divisors(gpus)
    a, g = model.num_attention_heads, model.kv_heads
    tps = [d for d in divs if d <= dom and a % d == 0 and (model.mla or g % d == 0 or d % g == 0)]
    cps = [d for d in divs if d == 1 or training.seq_len % (2 * d) == 0]
    pps = [d for d in divs if d <= model.num_layers]
    eps = [d for d in divs if model.moe.num_experts % d == 0] if model.moe else [1]
    return {"tp": tps, "cp": cps, "pp": pps, "ep": eps}


def _axis_problems(axis: str, v: int, model: ModelSpec, hardware: HardwareSpec, training: TrainingSpec,
                   gpus: int) -> list[str]:
    """Why one degree alone cannot be used (empty: only the combination fails)."""
    p = []
    if gpus % v:
        p.append(f"{gpus} GPUs not divisible by {v}")
    dom = hardware.nvlink_domain_size
    if axis == "tp":
        if model.num_attention_heads % v:
            p.append(f"{model.num_attention_heads} heads not divisible by {v}")
        if model.num_dense_layers and model.ffn_hidden_size % v:
            p.append(f"ffn_hidden_size {model.ffn_hidden_size} not divisible by {v}")
        if model.moe and model.moe.num_shared_experts and model.moe.shared_ffn % v:
            p.append(f"shared expert FFN {model.moe.shared_ffn} not divisible by {v}")
        if model.mla is None and model.kv_heads % v and v % model.kv_heads:
            p.append(f"{model.kv_heads} KV heads and {v} do not divide one another")
        if v > dom:
            p.append(f"beyond the NVLink domain ({dom})")
    elif axis == "cp":
        if v > 1 and training.seq_len % (2 * v):
            p.append(f"seq_len {training.seq_len} not divisible by 2·CP = {2 * v}")
    elif axis == "pp":
        if v > model.num_layers:
            p.append(f"more stages than the {model.num_layers} layers")
    elif axis == "ep":
        if model.moe and model.moe.num_experts % v:
            p.append(f"{model.moe.num_experts} experts not divisible by {v}")
    return p


def _distance_key(c: Degrees, t: Degrees) -> tuple:
    """Rank of a candidate: total halvings/doublings from the target, then TP, CP, PP, EP closest, then larger."""
    ds = [abs(_log2(getattr(c, a) / getattr(t, a))) for a in ("tp", "cp", "pp", "ep")]
    return (round(sum(ds), 9), *(round(x, 9) for x in ds), -c.tp, -c.cp, -c.pp, -c.ep)


def _repair(t: Degrees, model: ModelSpec, hardware: HardwareSpec, training: TrainingSpec, gpus: int,
            reasons: list[str]) -> Layout:
    B = training.global_batch
    cand = _axis_candidates(model, hardware, training, gpus)
    combos = []
    for tp, cp, pp, ep in product(cand["tp"], cand["cp"], cand["pp"], cand["ep"]):
        dense = tp * cp * pp
        if gpus % dense or gpus % (pp * ep * t.etp) or pp * max(tp * cp, ep * t.etp) > gpus:
            continue
        if B % ((gpus // dense) * MICRO_BATCH):
            continue
        combos.append(Degrees(tp=tp, pp=pp, cp=cp, ep=ep, etp=t.etp))
    combos.sort(key=lambda c: _distance_key(c, t))

    target_layout = _build(t, model, training, gpus)
    target_problems = check_layout(target_layout, model, training, gpus, hardware, allow_cross_domain_tp=False)
    for c in combos:
        layout = _build(c, model, training, gpus)
        if check_layout(layout, model, training, gpus, hardware, allow_cross_domain_tp=False):
            continue
        if c != t:
            changes = []
            for axis in ("tp", "cp", "pp", "ep"):
                tv, cv = getattr(t, axis), getattr(c, axis)
                if tv != cv:
                    why = _axis_problems(axis, tv, model, hardware, training, gpus)
                    changes.append(f"{axis.upper()} {tv} -> {cv}" + (f" ({'; '.join(why)})" if why else ""))
            reasons.append(
                f"repair: the rules' target {t.label()} is not valid for {model.name} on {gpus} GPUs "
                f"({'; '.join(target_problems) or 'no valid layout with these degrees'}) -> nearest valid "
                f"{c.label()}: {', '.join(changes)} (fewest halvings/doublings from the target; ties keep TP, "
                "CP, PP closest and prefer the larger degree; memory is not checked: the heuristic has no cost "
                "model)")
        return resolve_layout(layout, model, training, gpus, hardware, allow_cross_domain_tp=False)

    raise AutoparInputError(
        f"no valid heuristic layout for {model.name} on {gpus} GPUs (global batch {B}, seq_len {training.seq_len}, "
        f"{hardware.name}): the rules' target {t.label()} breaks: {'; '.join(target_problems) or 'see below'}; and "
        f"no TP in {cand['tp']}, CP in {cand['cp']}, PP in {cand['pp']}, EP in {cand['ep']} gives a valid layout "
        f"(dp = gpus/(tp·cp·pp) must divide the global batch {B} and min_gpus = pp·max(tp·cp, ep·etp) must fit "
        f"{gpus} GPUs)")


# ---- reasons for the final layout -------------------------------------------------------------------------
def _describe(layout: Layout, model: ModelSpec, training: TrainingSpec, gpus: int, reasons: list[str]) -> None:
    L, seq = layout, training.seq_len
    if L.tp == 1:
        reasons.append("TP1 -> no sequence parallel (pitfall 3: SP requires TP > 1)")
    elif L.sp:
        reasons.append(f"sequence {seq} >= 2K with TP{L.tp} -> sequence parallel on ({RULES}, Decision by "
                       "Sequence Length; pitfall 3)")
    else:
        reasons.append(f"sequence {seq} < 2K -> standard TP{L.tp}, sequence parallel off (rules' table)")
    n, stages = model.num_layers, L.layers_per_stage(model.num_layers)
    if L.pp > 1:
        if len(set(stages)) > 1:
            reasons.append(f"{n} layers do not divide by PP{L.pp} -> uneven stages {'/'.join(map(str, stages))}, "
                           "first and last stage lighter (Megatron --decoder-first/last-pipeline-num-layers)")
        else:
            reasons.append(f"{n} layers / PP{L.pp} = {stages[0]} layers per stage")
        if L.vpp > 1:
            chunks = "/".join(str(s // L.vpp) for s in sorted(set(stages), reverse=True))
            reasons.append(f"pitfall 2 (PP without interleaving has large bubbles) -> interleaved schedule, "
                           f"VPP{L.vpp}: {chunks} layers per virtual stage")
        else:
            micro = training.global_batch // (L.dp * L.micro_batch)
            why = ("the stages do not all split into 2 equal virtual chunks" if any(s % 2 for s in stages)
                   else f"{micro} micro-batches per step are not a multiple of PP{L.pp}")
            reasons.append(f"pitfall 2 asks for interleaving when possible; the baseline does not interleave here "
                           f"({why}) -> VPP1")
    reasons.append(f"min_gpus = PP·max(TP·CP, EP·ETP) = {L.pp}·max({L.tp}·{L.cp}, {L.ep}·{L.etp}) = {L.min_gpus()} "
                   f"<= {gpus} GPUs ({RULES}, Minimum GPU Count)")
    text = f"DP = {gpus}/(TP·CP·PP) = {gpus}/{L.dense_ranks} = {L.dp}"
    if model.is_moe:
        text += f"; EDP = {gpus}/(PP·EP·ETP) = {gpus}/{L.expert_ranks} = {L.edp}"
    reasons.append(text + f" ({RULES}, Combined Parallelism Enablement: DP size is always implicit); gradient "
                   f"accumulation = {training.global_batch}/(DP·micro-batch) = {L.grad_accum}")
    reasons.append("micro-batch 1, ZeRO-1 (Megatron distributed optimizer), recompute selective (core attention, "
                   "Korthikanti et al. 2022): the baseline's fixed step settings")


# ---- public API ----------------------------------------------------------------------------------------------
def heuristic_layout_with_reasons(model: ModelSpec, hardware: HardwareSpec, training: TrainingSpec,
                                  gpus: int) -> tuple[Layout, list[str]]:
    """The rules' layout for ``model`` on ``gpus`` GPUs of ``hardware``, resolved, with one reason per rule.

    The layout passes ``check_layout(layout, model, training, gpus, hardware, allow_cross_domain_tp=False)``.
    Raises :class:`AutoparInputError` when no valid layout exists near the rules' target."""
    if gpus <= 0:
        raise AutoparInputError(f"gpus must be positive (got {gpus})")
    reasons: list[str] = []
    target = _moe_target(model, reasons) if model.is_moe else _dense_target(model, reasons)
    target = _apply_sequence_rules(target, training, reasons)
    target = _apply_topology(target, hardware, reasons)
    layout = _repair(target, model, hardware, training, gpus, reasons)
    _describe(layout, model, training, gpus, reasons)
    return layout, reasons


def heuristic_layout(model: ModelSpec, hardware: HardwareSpec, training: TrainingSpec, gpus: int) -> Layout:
    """The rules' layout (see :func:`heuristic_layout_with_reasons`), without the reasons."""
    return heuristic_layout_with_reasons(model, hardware, training, gpus)[0]
