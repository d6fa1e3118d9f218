"""The search space: candidate values of every layout axis for one problem, and the user's pins.

A *mesh* is one (tp, cp, pp, ep, etp) that factorises the world on both meshes (dp = N/(tp·cp·pp) and
edp = N/(pp·ep·etp) whole). Per mesh the step knobs are micro-batch, recompute, virtual stages and ZeRO.
Sequence parallelism is on exactly when tp > 1 unless pinned off: in the cost model it never costs time
(SP's all-gather + reduce-scatter move what TP's all-reduce moves) and always saves memory
(Korthikanti et al. 2022 sec. 4.2.2). Pipelines whose layers do not divide use the balanced uneven split of
:func:`autopar.specs.layout.default_stage_layers`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from autopar.defaults import (DEFAULT_MBS, DEFAULT_MEMORY_MARGIN, DEFAULT_VPP, DEFAULT_ZERO, MAX_CP, MAX_ETP,
                              MAX_TP_CROSS_DOMAIN, TP_DOMAINS)
from autopar.errors import AutoparInputError
from autopar.specs.bounds import BOUNDS, limit
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import RECOMPUTE_POLICIES, Layout, default_stage_layers, normalize_recompute
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

AXES = ("tp", "cp", "pp", "ep", "etp")
MAX_MEMORY_MARGIN = 0.5   # keeping more than half of HBM free is no longer a margin


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
    memory_margin: float = DEFAULT_MEMORY_MARGIN   # share of HBM kept free beyond the memory model (defaults.py)
    time_limit_s: float = 20.0
    workers: int = 2

    def __post_init__(self) -> None:
        """Check every option once, for every caller (the CLI's solve and tune, the library): one line per
        mistake naming the option, as AutoparInputError."""
        bounds = {"vpp": "vpp", "mbs": "micro_batch"}
        for k in ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs"):
            vals = getattr(self, k)
            if vals is None:
                continue
            top = limit(bounds.get(k, "degree"))
            bad = [v for v in vals if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= top]
            if bad or not vals:
                raise AutoparInputError(f"--{k}: values must be whole numbers from 1 to {top:,}, got {vals}")
        if not (isinstance(self.memory_margin, (int, float)) and 0.0 <= self.memory_margin <= MAX_MEMORY_MARGIN):
            raise AutoparInputError(f"--memory-margin: a share of HBM from 0 to {MAX_MEMORY_MARGIN}, got "
                                    f"{self.memory_margin}")
        if self.zero is not None and (not self.zero or any(z not in (0, 1, 2, 3) for z in self.zero)):
            raise AutoparInputError(f"--zero: ZeRO stages are 0, 1, 2 and 3, got {self.zero}")
        if self.recompute is not None:
            if not self.recompute:
                raise AutoparInputError("--recompute: no policy given")
            for r in self.recompute:
                try:
                    normalize_recompute(r)
                except ValueError as err:
                    raise AutoparInputError(f"--recompute: {err}") from None
        if self.max_tp is not None and not 1 <= self.max_tp <= limit("degree"):
            raise AutoparInputError(f"--max-tp must be from 1 to {limit('degree'):,}, got {self.max_tp}")
        if not 1 <= self.top_k <= limit("top_k"):
            raise AutoparInputError(f"--top-k must be from 1 to {limit('top_k'):,}, got {self.top_k}")
        if not (math.isfinite(self.time_limit_s) and 0 < self.time_limit_s <= limit("time_limit_s")):
            raise AutoparInputError(f"--time-limit must be finite, above 0 and at most {limit('time_limit_s'):,g} s, "
                                    f"got {self.time_limit_s}")
        if not 0 <= self.offload_activations <= 1:
            raise AutoparInputError(f"--offload-activations must be between 0 and 1, got {self.offload_activations}")

    def pinned(self) -> dict[str, list[int]]:
        return {k: v for k in ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "zero") if (v := getattr(self, k))}


def divisors(n: int) -> list[int]:
    """The divisors of n in increasing order, in O(sqrt n) steps."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


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
    # mesh index -> (tp, pp, cp, ep, etp, dp, sequence_parallel, stage_layers): what :meth:`layout` reads per mesh
    _mesh_fields: dict[int, tuple] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def usable_hbm_gib(self) -> float:
        """HBM a layout may fill: the capacity less ``options.memory_margin`` of it."""
        return self.hardware.hbm_gib * (1.0 - self.options.memory_margin)

    @property
    def size(self) -> int:
        """Layouts in the space before any rule is applied."""
        return len(self.meshes) * len(self.mbs) * len(self.recompute) * len(self.vpp) * len(self.zero)

    def layout(self, mesh_i: int, mbs: int, rc: str, vpp: int, zero: int) -> Layout:
        hit = self._mesh_fields.get(mesh_i)   # the search asks for tens of thousands of layouts of a few meshes
        if hit is None:
            tp, cp, pp, ep, etp = self.meshes[mesh_i]
            sp = self.options.sequence_parallel
            values = dict(tp=tp, pp=pp, vpp=1, cp=cp, ep=ep, etp=etp, dp=None)
            dp = self.gpus // _fast_layout(values).dense_ranks   # the Layout's own degrees
            hit = self._mesh_fields[mesh_i] = (tp, pp, cp, ep, etp, dp, tp > 1 if sp is None else sp,
                                               self.stage_layers(pp))
        tp, pp, cp, ep, etp, dp, sp, stage_layers = hit
        # its __dict__ is ``values`` (every field, in the class's order); grad_accum follows from dp
        return _fast_layout(dict(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, dp=dp, sequence_parallel=sp,
                                 zero_stage=zero, fsdp=zero == 3, hsdp_shard=None, micro_batch=mbs,
                                 grad_accum=max(1, self.training.global_batch // (dp * mbs)), recompute=rc,
                                 stage_layers=stage_layers, offload_activations=self.options.offload_activations))

    def stage_layers(self, pp: int) -> tuple[int, ...]:
        """Layers per pipeline stage at depth pp: the balanced split, or where none exists an even split that the
        layout rules reject, saying why."""
        return self.splits[pp] or (self.model.num_layers // pp,) * pp

    def layout_grid(self, meshes: list[int], shape: tuple[int, ...] | None, rc: str, *, micro_batch=1, vpp=1,
                    zero=0, grad_accum=None) -> Layout:
        """The layouts of several meshes of one pipeline depth (same pp) at once: the degrees as numpy arrays of
        ``shape`` (one entry per mesh on the first axis), the knobs as broadcastable arrays (``micro_batch``,
        ``vpp``, ``zero``; the gradient accumulation follows dp and the micro-batch). What the cost model's term
        functions take to fill the search's tables in one call. Not a valid pydantic Layout (arrays in int
        fields); only for the term functions that say they accept arrays. ``shape`` None: one mesh, its degrees
        plain ints (as the collective-time functions need). ``grad_accum``: the micro-batches per step given (the
        layouts' own, ``Tables.M``, for several meshes of the same degrees as far as the term reads them)."""
        values = dict(self.layout(meshes[0], 1, rc, 1, 0).__dict__)
        grid = _fast_layout(values)   # its __dict__ is ``values``, filled in below
        if shape is not None:
            deg = np.array([self.meshes[m] for m in meshes], np.int64).reshape((len(meshes), 5))
            tp, cp, _, ep, etp = (deg[:, i].reshape(shape) for i in range(5))   # pp: one for all (meshes[0]'s)
            sp = self.options.sequence_parallel
            values.update(tp=tp, cp=cp, ep=ep, etp=etp, sequence_parallel=tp > 1 if sp is None else sp)
            values["dp"] = self.gpus // grid.dense_ranks
        values.update(micro_batch=micro_batch, vpp=vpp, zero_stage=zero, fsdp=np.asarray(zero) == 3,
                      grad_accum=np.maximum(1, self.training.global_batch // (values["dp"] * np.asarray(micro_batch)))
                      if grad_accum is None else grad_accum)
        return grid


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
    if not 1 <= gpus <= limit("gpus"):
        raise AutoparInputError(f"gpus must be from 1 to {limit('gpus'):,} (got {gpus}; bound: {BOUNDS['gpus'].why})")
    o = options
    n = gpus
    divs = divisors(n)
    dom = hardware.nvlink_domain_size
    tp_cap = o.max_tp or (max(MAX_TP_CROSS_DOMAIN, dom) if o.allow_cross_domain else TP_DOMAINS * dom)
    cand = {
        "tp": [d for d in divs if d <= tp_cap],
        "cp": [d for d in divs if d <= MAX_CP],
        "pp": [d for d in divs if d <= model.num_layers],
        "ep": [d for d in divs if d <= (model.moe.num_experts if model.moe else 1)],
        "etp": [d for d in divs if d <= (MAX_ETP if model.moe else 1)],
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
                  mbs=sorted(set(o.mbs or DEFAULT_MBS)), recompute=list(dict.fromkeys(rcs)),
                  vpp=sorted(set(o.vpp or DEFAULT_VPP)),
                  zero=sorted(set(o.zero if o.zero is not None else DEFAULT_ZERO)))
    for pp in {m[2] for m in meshes}:
        space.splits[pp] = default_stage_layers(model, pp, 1, training.seq_len)
    return space
