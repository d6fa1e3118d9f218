"""Layout: one way to split a training run over GPUs, and every rule that makes a layout valid.

Vocabulary (as in torchtitan): an *axis* is a device-mesh axis (tp, cp, dp, pp, ep, etp); a *dim* is a
tensor dimension. Rank order is TP innermost, then CP, then DP, then PP outermost (Megatron-LM order
``tp-cp-ep-dp-pp``); the expert mesh EP×ETP re-slices the same GPUs of each pipeline stage
(Pangu Ultra MoE, arXiv 2504.14960; parallelism-strategy-rules.md, "Minimum GPU Count").

All validity rules live in :func:`check_layout`; its messages show the arithmetic that failed.
"""

from __future__ import annotations

import functools
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from autopar.errors import LayoutError
from autopar.specs._base import Spec
from autopar.specs.bounds import limit
from autopar.specs.hardware import HardwareSpec
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

# Recompute modules, named as Megatron-LM's --recompute-modules. "selective" is Korthikanti et al. 2022's
# selective recomputation (core attention only). Aliases map the short names used in published configs.
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp", "moe", "moe_act", "mla_up_proj", "shared_experts")
_RECOMPUTE_ALIASES = {"norm": "layernorm", "act": "moe_act", "attn": "core_attn", "selective": "core_attn"}
RECOMPUTE_POLICIES = ("none", "selective", "full")


def normalize_recompute(value: str) -> str:
    """'none' | 'full' | 'selective' | a comma list of modules -> canonical string (sorted module list)."""
    text = str(value).strip().lower().replace(" ", ",")
    if text in ("none", "full", "selective", ""):
        return text or "none"
    mods = set()
    for part in filter(None, text.split(",")):
        mod = _RECOMPUTE_ALIASES.get(part, part)
        if mod not in RECOMPUTE_MODULES:
            raise ValueError(f"unknown recompute module '{part}' (choose none, full, selective or a comma list of "
                             f"{', '.join(RECOMPUTE_MODULES)})")
        mods.add(mod)
    if mods == {"core_attn"}:
        return "selective"
    return ",".join(sorted(mods))


@functools.lru_cache(maxsize=256)
def _recompute_modules(recompute: str) -> frozenset[str]:
    """The modules a (normalised) ``Layout.recompute`` value recomputes; a pure function of the string, cached
    because the cost model asks for it several times per stage and estimate."""
    if recompute in ("none", "full"):
        return frozenset()
    if recompute == "selective":
        return frozenset({"core_attn"})
    return frozenset(recompute.split(","))


class Layout(Spec):
    """Parallel degrees and step settings. ``dp`` and ``grad_accum`` may be left None: they are derived
    from the GPU count and the global batch by :func:`resolve_layout`."""

    tp: int = Field(default=1, gt=0, le=limit("degree"),
                    description="Tensor-parallel degree (Megatron column/row split).")
    pp: int = Field(default=1, gt=0, le=limit("degree"), description="Pipeline-parallel stages.")
    vpp: int = Field(default=1, gt=0, le=limit("vpp"),
                     description="Virtual stages per pipeline rank (interleaved 1F1B).")
    cp: int = Field(default=1, gt=0, le=limit("degree"),
                    description="Context-parallel degree (sequence split, ring attention).")
    ep: int = Field(default=1, gt=0, le=limit("degree"), description="Expert-parallel degree (MoE only).")
    etp: int = Field(default=1, gt=0, le=limit("degree"), description="Expert tensor-parallel degree (MoE only).")
    dp: int | None = Field(default=None, gt=0, le=limit("degree"),
                           description="Data-parallel degree; None = gpus / (tp·pp·cp).")
    sequence_parallel: bool | None = Field(
        default=None, description="Megatron sequence parallelism; None = on exactly when tp > 1.")
    zero_stage: int = Field(default=1, ge=0, le=3,
                            description="ZeRO stage over DP: 0 DDP, 1 optimizer (Megatron distributed "
                                        "optimizer), 2 + gradients, 3 + parameters.")
    fsdp: bool = Field(default=False, description="Parameters sharded FSDP-style (torch FSDP2); implies ZeRO-3.")
    hsdp_shard: int | None = Field(default=None, gt=0, le=limit("degree"),
                                   description="HSDP: shard over groups of this many DP ranks, replicate across.")
    micro_batch: int = Field(default=1, gt=0, le=limit("micro_batch"),
                             description="Sequences per micro-batch per DP rank.")
    grad_accum: int | None = Field(default=None, gt=0, le=limit("global_batch"),
                                   description="Micro-batches per step per DP rank; None = B / (dp·micro_batch).")
    recompute: str = Field(default="none", description="none | selective | full | comma list of modules "
                                                       f"({', '.join(RECOMPUTE_MODULES)}).")
    stage_layers: tuple[Annotated[int, Field(ge=0, le=limit("layers"))], ...] | None = Field(
        default=None, max_length=limit("layers"),
        description="Transformer layers per pipeline stage (uneven split); None = even.")
    offload_activations: float = Field(
        default=0.0, ge=0, le=1,
        description="Fraction of the stored layer activations sent to host memory in the forward pass and brought "
                    "back for the backward pass: 1 = all (Megatron-Core --cpu-offloading, torch save_on_cpu), less = "
                    "some modules (Megatron-Core fine-grained activation offloading), 0 = none.")

    @field_validator("recompute", mode="before")
    @classmethod
    def _norm_recompute(cls, v: object) -> str:
        return normalize_recompute(str(v))

    @model_validator(mode="after")
    def _fsdp_is_zero3(self) -> "Layout":
        if (self.fsdp or self.hsdp_shard) and self.zero_stage != 3:
            object.__setattr__(self, "zero_stage", 3)
        return self

    # ---- derived (each also works on the search's grids, whose degrees are numpy arrays) --------------------
    @property
    def dense_ranks(self) -> int:
        """tp·cp·pp: the GPUs one data-parallel replica of the dense layers spans (dp = gpus / dense_ranks)."""
        return self.tp * self.cp * self.pp

    @property
    def expert_ranks(self) -> int:
        """pp·ep·etp: the GPUs one expert-data-parallel replica of the routed experts spans (edp = gpus /
        expert_ranks)."""
        return self.pp * self.ep * self.etp

    @property
    def sp(self) -> bool:
        return self.tp > 1 if self.sequence_parallel is None else self.sequence_parallel

    @property
    def edp(self) -> int:
        """Expert data-parallel degree: gpus / (pp·ep·etp) = dp·tp·cp / (ep·etp)."""
        assert self.dp is not None, "resolve the layout first"
        return self.dp * self.tp * self.cp // (self.ep * self.etp)

    @property
    def world(self) -> int:
        assert self.dp is not None, "resolve the layout first"
        return self.dp * self.dense_ranks

    @property
    def recompute_modules(self) -> frozenset[str]:
        return _recompute_modules(self.recompute)

    def min_gpus(self) -> int:
        """Smallest world that runs this layout at dp = edp = 1: PP·max(TP·CP, EP·ETP)."""
        return self.pp * max(self.tp * self.cp, self.ep * self.etp)

    def layers_per_stage(self, num_layers: int) -> tuple[int, ...]:
        """``stage_layers`` if given, else the balanced split by layer count (even when the layers divide;
        see :func:`balanced_stage_layers`). A resolved layout always carries its split."""
        if self.stage_layers is not None:
            return self.stage_layers
        return balanced_stage_layers(num_layers, self.pp, self.vpp) or (num_layers // self.pp,) * self.pp

    def short(self) -> str:
        """Compact one-line label, e.g. 'TP2 PP16 EP64 DP8 mbs1 GA16 sel'."""
        parts = [f"TP{self.tp}"]
        if self.pp > 1:
            parts.append(f"PP{self.pp}" + (f"v{self.vpp}" if self.vpp > 1 else ""))
        for name in ("cp", "ep", "etp"):
            if getattr(self, name) > 1:
                parts.append(f"{name.upper()}{getattr(self, name)}")
        parts.append(f"DP{self.dp}")
        if self.sp:
            parts.append("SP")
        shard = "FSDP" if self.fsdp else (f"HSDP{self.hsdp_shard}" if self.hsdp_shard else f"Z{self.zero_stage}")
        parts += [shard, f"mbs{self.micro_batch}", f"GA{self.grad_accum}", f"rc:{self.recompute}"]
        if self.offload_activations:
            parts.append(f"offload{self.offload_activations:.0%}")
        if self.stage_layers and len(set(self.stage_layers)) > 1:
            parts.append("layers=" + "/".join(map(str, self.stage_layers)))
        return " ".join(parts)


def balanced_stage_layers(num_layers: int, pp: int, vpp: int = 1) -> tuple[int, ...] | None:
    """Layers per stage when num_layers does not divide evenly by pp·vpp: the middle stages take
    ceil(L/pp) layers and the remainder is split between the first and the last stage (Megatron-LM's
    --decoder-first/last-pipeline-num-layers; Llama 3 405B drops one layer from each end, arXiv 2407.21783
    sec. 3.3.2). With vpp > 1 a stage's virtual chunks may differ by one layer (Megatron-LM's
    --pipeline-model-parallel-layout; a chunk may hold only the embedding or the loss, as with
    --account-for-embedding/loss-in-pipeline-split). None when no such split exists."""
    if num_layers % (pp * vpp) == 0:
        return (num_layers // pp,) * pp
    if pp == 1:
        return (num_layers,)
    per = -(-num_layers // pp)
    rest = num_layers - per * (pp - 2)
    first = rest // 2
    last = rest - first
    if first < 1 or last > per:
        return None
    return (first, *([per] * (pp - 2)), last)


def default_stage_layers(model: ModelSpec, pp: int, vpp: int = 1, seq_len: int = 4096) -> tuple[int, ...] | None:
    """The split autopar uses when a layout gives no ``stage_layers`` (``solve``, ``estimate`` and the library
    alike). Layers of one kind: :func:`balanced_stage_layers` by layer count. Hybrid models (layers of different
    token mixers, :attr:`ModelSpec.is_hybrid`): :func:`cost_balanced_stage_layers` over each layer's forward
    FLOPs at ``seq_len``, with the LM head (and MTP) on the last stage. None when no split exists (more stages
    than layers)."""
    if model.num_layers < pp:
        return None
    if pp > 1 and model.is_hybrid:
        costs = [model.layer_forward_flops_per_token(i, seq_len) for i in range(model.num_layers)]
        tail = model.head_forward_flops_per_token() + model.mtp_forward_flops_per_token(seq_len)
        return cost_balanced_stage_layers(costs, pp, tail)
    return balanced_stage_layers(model.num_layers, pp, vpp)


def cost_balanced_stage_layers(costs: list[float], pp: int, last_extra: float = 0.0) -> tuple[int, ...]:
    """Contiguous split of layers with per-layer ``costs`` into pp non-empty stages that minimises the costliest
    stage (the pipeline's critical path, Narayanan et al. 2021 sec. 3.5), the last stage carrying ``last_extra``
    as well (the LM head). The linear-partition problem, solved exactly: bisection on the stage-cost bound with a
    greedy check (packing from the last layer backwards; fewer stages than pp are split further, which never
    raises the maximum), to a relative tolerance of 1e-9."""
    n = len(costs)
    if not 1 <= pp <= n:
        raise ValueError(f"cannot split {n} layers into {pp} non-empty stages")

    def pack(bound: float) -> list[int] | None:
        sizes, acc, cnt = [], last_extra, 0
        for c in reversed(costs):
            if cnt and acc + c > bound:
                sizes.append(cnt)
                acc, cnt = 0.0, 0
            if acc + c > bound:
                return None
            acc, cnt = acc + c, cnt + 1
        sizes.append(cnt)
        return sizes[::-1] if len(sizes) <= pp else None

    lo, hi = max(max(costs), costs[-1] + last_extra), sum(costs) + last_extra
    while hi - lo > 1e-9 * hi:
        mid = (lo + hi) / 2
        if pack(mid) is None:
            lo = mid
        else:
            hi = mid
    sizes = pack(hi)
    assert sizes is not None
    while len(sizes) < pp:   # split the stage with the most layers (n >= pp guarantees one has 2+)
        j = max(range(len(sizes)), key=lambda k: sizes[k])
        sizes[j:j + 1] = [sizes[j] // 2, sizes[j] - sizes[j] // 2]
    return tuple(sizes)


def max_vpp(stage_layers: tuple[int, ...]) -> int:
    """The most virtual stages a split allows: each virtual stage needs a layer, except that the first and the last
    pipeline stage may give one virtual stage to the embedding or the loss alone (Megatron-LM
    --account-for-embedding/loss-in-pipeline-split)."""
    return _max_vpp(tuple(stage_layers))


@functools.lru_cache(maxsize=256)
def _max_vpp(stage_layers: tuple[int, ...]) -> int:
    """:func:`max_vpp`, kept per split (every layout check asks it)."""
    last = len(stage_layers) - 1
    return min(x + (1 if i in (0, last) else 0) for i, x in enumerate(stage_layers)) if stage_layers else 1


def batch_valid(global_batch, dp, micro_batch):
    """The 'batch' rule of :func:`check_layout_groups`: dp·micro_batch divides the global batch. Plain numbers or
    broadcastable numpy arrays (the search's tables)."""
    return global_batch % (dp * micro_batch) == 0


def interleaving_valid(pp, vpp, grad_accum, vpp_max):
    """The 'interleaving' rules of :func:`check_layout_groups` together: vpp = 1, or pp > 1 with the micro-batches
    per step (``grad_accum``) a multiple of pp (the interleaved 1F1B schedule, Narayanan et al. 2021, arXiv
    2104.04473 sec. 2.2.2) and at most ``vpp_max`` (:func:`max_vpp` of the split) virtual stages per pipeline stage.
    Plain numbers or broadcastable numpy arrays (the search's tables)."""
    return (vpp == 1) | ((pp > 1) & (grad_accum % pp == 0) & (vpp <= vpp_max))


def check_layout(layout: Layout, model: ModelSpec, training: TrainingSpec, gpus: int,
                 hardware: HardwareSpec | None = None, allow_cross_domain_tp: bool = True) -> list[str]:
    """Every broken validity rule of a layout, as messages showing the numbers (empty = valid)."""
    return [msg for _, msg in check_layout_groups(layout, model, training, gpus, hardware, allow_cross_domain_tp)]


def check_layout_groups(layout: Layout, model: ModelSpec, training: TrainingSpec, gpus: int,
                        hardware: HardwareSpec | None = None,
                        allow_cross_domain_tp: bool = True) -> list[tuple[str, str]]:
    """Every validity rule of a layout, in one place. Returns the list of broken rules (empty = valid).

    ``hardware`` enables the topology rules (TP and ETP inside one NVLink domain) unless
    ``allow_cross_domain_tp``: estimate accepts cross-domain TP (it is slow, not wrong); solve forbids it.
    Expert parallelism may span domains (EP·ETP beyond the NVLink domain, as DeepSeek-V3 runs EP 64 on 8-GPU
    H100 nodes, arXiv 2412.19437 sec. 3.1); its dispatch is priced hierarchically (autopar.cost.ep)."""
    L = layout
    p: list[tuple[str, str]] = []
    group = "world size"

    def add(msg: str) -> None:
        p.append((group, msg))

    if gpus <= 0:
        return [(group, f"gpus must be positive (got {gpus})")]
    # World size and the two meshes.
    dense = L.dense_ranks
    if gpus % dense:
        add(f"gpus ({gpus}) not divisible by tp·cp·pp = {L.tp}·{L.cp}·{L.pp} = {dense}")
    dp = L.dp if L.dp is not None else (gpus // dense if gpus % dense == 0 else None)
    if L.dp is not None and L.dp * dense != gpus:
        add(f"dp·tp·cp·pp = {L.dp}·{L.tp}·{L.cp}·{L.pp} = {L.dp * dense} != gpus ({gpus})")
    group = "min_gpus"
    if L.min_gpus() > gpus:
        add(f"min_gpus = pp·max(tp·cp, ep·etp) = {L.pp}·max({L.tp * L.cp}, {L.ep * L.etp}) = "
                 f"{L.min_gpus()} > gpus ({gpus})")
    group = "world size"
    expert = L.expert_ranks
    if gpus % expert:
        add(f"gpus ({gpus}) not divisible by pp·ep·etp = {L.pp}·{L.ep}·{L.etp} = {expert} (edp must be whole)")
    group = "tensor parallel"
    # Tensor parallel.
    # Each block states its divisibility rules (autopar.blocks; ModelSpec.layout_rules, broken_rules).
    for why in model.broken_rules(("tp",), L.tp, L.cp, L.ep, L.etp):
        add(why)
    group = "sequence parallel"
    if L.sequence_parallel and L.tp == 1:
        add("sequence_parallel needs tp > 1 (SP splits the activations TP would otherwise replicate)")
    if L.sp and (training.seq_len // L.cp) % L.tp:
        add(f"sequence parallel: seq_len/cp = {training.seq_len // L.cp} not divisible by tp ({L.tp})")
    group = "context parallel"
    # Context parallel: load-balanced (zig-zag) ring attention splits each sequence in 2·cp chunks.
    if L.cp > 1 and training.seq_len % (2 * L.cp):
        add(f"seq_len ({training.seq_len}) % (2·cp) = {training.seq_len} % {2 * L.cp} != 0")
    if L.cp > 1 and training.linear_cp == "all_to_all":
        # the all-to-all hands each of the tp·cp ranks whole heads (Megatron-Core MambaContextParallel, GatedDeltaNet)
        for why in model.broken_rules(("tp·cp", "cp"), L.tp, L.cp, L.ep, L.etp):
            add(why)
    group = "experts"
    # Experts.
    if not model.is_moe:
        if L.ep > 1:
            add(f"ep = {L.ep} but {model.name} is dense: expert parallel needs an MoE model")
        if L.etp > 1:
            add(f"etp = {L.etp} but {model.name} is dense: expert tensor parallel needs an MoE model")
    else:
        for why in model.broken_rules(("ep", "etp"), L.tp, L.cp, L.ep, L.etp):
            add(why)
    group = "pipeline layers"
    # Pipeline.
    n = model.num_layers
    if L.vpp > 1 and L.pp == 1:
        group = "interleaving"
        add(f"vpp = {L.vpp} needs pp > 1")
    group = "pipeline layers"
    if L.stage_layers is None:
        if n % (L.pp * L.vpp) and default_stage_layers(model, L.pp, L.vpp, training.seq_len) is None:
            add(f"num_layers ({n}) not divisible by pp·vpp = {L.pp}·{L.vpp} = {L.pp * L.vpp}, and no balanced "
                f"uneven split exists (ceil({n}/{L.pp}) = {-(-n // L.pp)} layers on each middle stage leave "
                f"{n - -(-n // L.pp) * (L.pp - 2)} for the first and last); give stage_layers")
    else:
        s = L.stage_layers
        if len(s) != L.pp:
            add(f"stage_layers has {len(s)} entries, pp is {L.pp}")
        if sum(s) != n:
            add(f"stage_layers sum to {sum(s)}, num_layers is {n}")
        if any(x < 1 for x in s):
            add(f"every pipeline stage needs at least one layer; got {list(s)}")
        elif L.vpp > max_vpp(s):
            group = "interleaving"
            add(f"vpp = {L.vpp} virtual stages per pipeline stage need more layers than stage_layers {list(s)} "
                f"hold (at most vpp = {max_vpp(s)}: a layer per virtual stage, the first and last stage may give "
                "one to the embedding or the loss alone)")
    group = "batch"
    # Batch.
    B = training.global_batch
    if dp:
        if not batch_valid(B, dp, L.micro_batch):
            add(f"global_batch ({B}) not divisible by dp·micro_batch = {dp}·{L.micro_batch} = "
                     f"{dp * L.micro_batch}")
        elif L.grad_accum is not None and dp * L.micro_batch * L.grad_accum != B:
            add(f"dp·micro_batch·grad_accum = {dp}·{L.micro_batch}·{L.grad_accum} = "
                     f"{dp * L.micro_batch * L.grad_accum} != global_batch ({B})")
        elif L.vpp > 1 and (B // (dp * L.micro_batch)) % L.pp:
            # Megatron-LM@d98e8a64ddf3 megatron/core/pipeline_parallel/schedules.py:1160-1180 (the interleaved
            # schedule raises unless PP <= micro-batches and micro-batches % PP is 0 or >= PP, with its default
            # microbatch_group_size_per_vp_stage = PP); torchtitan's Interleaved1F1B needs the same
            group = "interleaving"
            add(f"interleaved schedule: micro-batches per step ({B // (dp * L.micro_batch)}) must be a "
                     f"multiple of pp ({L.pp})")
    group = "sharding"
    # Sharding.
    if L.hsdp_shard is not None and dp and dp % L.hsdp_shard:
        add(f"dp ({dp}) not divisible by hsdp_shard ({L.hsdp_shard})")
    group = "recompute"
    if "mla_up_proj" in L.recompute_modules and model.mla is None:
        add("recompute module 'mla_up_proj' needs an MLA model")
    if {"moe", "moe_act", "shared_experts"} & L.recompute_modules and not model.is_moe:
        add(f"recompute modules {sorted({'moe', 'moe_act', 'shared_experts'} & L.recompute_modules)} "
                 "need an MoE model")
    group = "topology"
    # Topology.
    if hardware is not None and not allow_cross_domain_tp:
        dom = hardware.nvlink_domain_size
        if L.tp > dom:
            add(f"tp ({L.tp}) exceeds the NVLink domain ({dom} GPUs on {hardware.name})")
        if L.etp > dom:
            add(f"etp ({L.etp}) exceeds the NVLink domain ({dom} GPUs on {hardware.name})")
    if L.offload_activations and hardware is not None and hardware.host_link_gbps is None:
        add(f"activation offloading needs host_link_gbps (GPU<->host bandwidth) in the hardware file of {hardware.name}")
    return p


def resolve_layout(layout: Layout, model: ModelSpec, training: TrainingSpec, gpus: int,
                   hardware: HardwareSpec | None = None, allow_cross_domain_tp: bool = True) -> Layout:
    """Validate and fill in dp, grad_accum, sequence_parallel and stage_layers (when not given: the split
    :func:`default_stage_layers` picks, the one ``solve`` searches). Raises LayoutError."""
    problems = check_layout(layout, model, training, gpus, hardware, allow_cross_domain_tp)
    if problems:
        raise LayoutError(problems)
    dp = gpus // layout.dense_ranks
    ga = training.global_batch // (dp * layout.micro_batch)
    return layout.model_copy(update={
        "dp": dp, "grad_accum": ga, "sequence_parallel": layout.sp,
        "stage_layers": layout.stage_layers or default_stage_layers(model, layout.pp, layout.vpp, training.seq_len)})
