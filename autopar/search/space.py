"""The search space: candidate values of every layout axis for one problem, and the user's pins.

A *mesh* is one (tp, cp, pp, ep, etp) that factorises the world on both meshes (dp = N/(tp·cp·pp) and
edp = N/(pp·ep·etp) whole). Per mesh the step knobs are micro-batch, recompute, virtual stages and ZeRO.
Sequence parallelism is on exactly when tp > 1 unless pinned off: in the cost model it never costs time
(SP's all-gather + reduce-scatter move what TP's all-reduce moves) and always saves memory
(Korthikanti et al. 2022 sec. 4.2.2). Pipelines whose layers do not divide use the balanced uneven split of
:func:`autopar.specs.layout.default_stage_layers`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autopar.errors import AutoparInputError
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import RECOMPUTE_POLICIES, Layout, default_stage_layers, normalize_recompute
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

AXES = ("tp", "cp", "pp", "ep", "etp")


@dataclass
class SearchOptions:
    """User pins and ranges. ``None`` = autopar chooses from its default candidates."""

    tp: list[int] | None = None
    pp: list[int] | None = None
    vpp: list[int] | None = None
    cp: list[int] | None = None
    ep: list[int] | None = None
    etp: list[int] | None = None
    mbs: list[int] | None = None
    zero: list[int] | None = None
    recompute: list[str] | None = None
    max_tp: int | None = None
    sequence_parallel: bool | None = None
    offload_activations: float = 0.0   # fraction of stored activations sent to host memory (pinned, not searched)
    allow_cross_domain: bool = False
    top_k: int = 5
    time_limit_s: float = 20.0
    workers: int = 2

    def pinned(self) -> dict[str, list[int]]:
        return {k: v for k in ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "zero") if (v := getattr(self, k))}


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass
class Space:
    """Candidate values per axis and the list of meshes (world-size factorisations)."""

    model: ModelSpec
    hardware: HardwareSpec
    training: TrainingSpec
    gpus: int
    options: SearchOptions
    meshes: list[tuple[int, int, int, int, int]] = field(default_factory=list)
    mbs: list[int] = field(default_factory=list)
    recompute: list[str] = field(default_factory=list)
    vpp: list[int] = field(default_factory=list)
    zero: list[int] = field(default_factory=list)
    splits: dict[int, tuple[int, ...] | None] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """Layouts in the space before any rule is applied."""
        return len(self.meshes) * len(self.mbs) * len(self.recompute) * len(self.vpp) * len(self.zero)

    def layout(self, mesh_i: int, mbs: int, rc: str, vpp: int, zero: int) -> Layout:
        tp, cp, pp, ep, etp = self.meshes[mesh_i]
        dp = self.gpus // (tp * cp * pp)
        sp = self.options.sequence_parallel
        return _fast_layout(dict(
            tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, dp=dp, sequence_parallel=(tp > 1 if sp is None else sp),
            zero_stage=zero, fsdp=zero == 3, hsdp_shard=None, micro_batch=mbs,
            grad_accum=max(1, self.training.global_batch // (dp * mbs)), recompute=rc,
            stage_layers=self.splits[pp] or (self.model.num_layers // pp,) * pp,
            offload_activations=self.options.offload_activations))


def _fast_layout(values: dict) -> Layout:
    """A Layout from values the search already validated (every field given), without pydantic's per-field
    construction cost — the table builder makes tens of thousands of them. Same object as model_construct."""
    obj = object.__new__(Layout)
    object.__setattr__(obj, "__dict__", values)
    object.__setattr__(obj, "__pydantic_fields_set__", set(values))
    object.__setattr__(obj, "__pydantic_extra__", None)
    object.__setattr__(obj, "__pydantic_private__", None)
    return obj


def build_space(model: ModelSpec, hardware: HardwareSpec, training: TrainingSpec, gpus: int,
                options: SearchOptions) -> Space:
    if gpus <= 0:
        raise AutoparInputError(f"gpus must be positive (got {gpus})")
    o = options
    n = gpus
    divs = divisors(n)
    dom = hardware.nvlink_domain_size
    tp_cap = o.max_tp or (max(64, dom) if o.allow_cross_domain else 2 * dom)
    cand = {
        "tp": [d for d in divs if d <= tp_cap],
        "cp": [d for d in divs if d <= 32],
        "pp": [d for d in divs if d <= model.num_layers],
        "ep": [d for d in divs if d <= (model.moe.num_experts if model.moe else 1)],
        "etp": [d for d in divs if d <= (8 if model.moe else 1)],
    }
    for ax in AXES:
        pins = getattr(o, ax)
        if pins:
            bad = [v for v in pins if v <= 0]
            if bad:
                raise AutoparInputError(f"--{ax}: values must be positive, got {bad}")
            # pins outside the structural candidates are kept so the solver can say which rule they break
            cand[ax] = sorted(set(pins))
    meshes = []
    for tp in cand["tp"]:
        for cp in cand["cp"]:
            for pp in cand["pp"]:
                if n % (tp * cp * pp):
                    continue
                for ep in cand["ep"]:
                    for etp in cand["etp"]:
                        if n % (pp * ep * etp) == 0:
                            meshes.append((tp, cp, pp, ep, etp))
    rcs = [normalize_recompute(r) for r in (o.recompute or RECOMPUTE_POLICIES)]
    space = Space(model, hardware, training, gpus, o, meshes,
                  mbs=sorted(set(o.mbs or [1, 2, 4])), recompute=list(dict.fromkeys(rcs)),
                  vpp=sorted(set(o.vpp or [1, 2, 4, 8])), zero=sorted(set(o.zero if o.zero is not None else [0, 1, 2, 3])))
    for pp in {m[2] for m in meshes}:
        space.splits[pp] = default_stage_layers(model, pp, 1, training.seq_len)
    return space
