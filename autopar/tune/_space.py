"""The tuner's search space: the solver's best parallel structures, times the step knobs the runner exposes.

A *structure* is the part of a layout that decides where each GPU's work goes: (tp, pp, cp, ep, etp, sp) and
the pipeline's stage split. The solver ranks full layouts; the tuner keeps the K best distinct structures
(asking the solver for more plans when its top K share structures) and lets Optuna choose, per trial:

- ``layout``: the structure, as its index in best-predicted-first order (categorical);
- ``mbs``: micro-batch size; ``recompute``: none | selective | full (or the pinned policies);
- ``vpp_pp<P>``: virtual stages, only for structures with pp = P > 1 and only the counts that split the layers;
- ``zero``: ZeRO stage 0-3 (3 = FSDP), only where data is sharded over more than one rank (dp or edp > 1);
  otherwise ZeRO-1 (every stage is the same run then).

A knob with a single choice is not a parameter. Choices come from the same :class:`SearchOptions` pins the
solver used, so the space is what the user allowed. Combinations that break a layout rule or are predicted not
to fit are part of the space but never run (see ``autopar.tune._study``).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Any

from autopar.search.plan import Plan
from autopar.search.space import SearchOptions
from autopar.specs.layout import RECOMPUTE_POLICIES, Layout, normalize_recompute
from autopar.specs.model import ModelSpec


@dataclass(frozen=True)
class Structure:
    """One parallel structure, with the stage split of the solver's best plan using it (None: even)."""

    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    sp: bool
    stage_layers: tuple[int, ...] | None = None
    moe: bool = False                          # expert weights are sharded over edp = gpus / (pp·ep·etp)

    @property
    def key(self) -> tuple:
        return (self.tp, self.pp, self.cp, self.ep, self.etp, self.sp, self.stage_layers)

    def dp(self, gpus: int) -> int:
        return gpus // (self.tp * self.cp * self.pp)

    def sharded(self, gpus: int) -> bool:
        """Data (dense dp, or expert edp for MoE) spread over more than one rank: the ZeRO stage matters."""
        return self.dp(gpus) > 1 or (self.moe and gpus // (self.pp * self.ep * self.etp) > 1)

    def label(self, gpus: int) -> str:
        parts = [f"TP{self.tp}"] + ([f"PP{self.pp}"] if self.pp > 1 else [])
        parts += [f"{n.upper()}{v}" for n, v in (("cp", self.cp), ("ep", self.ep), ("etp", self.etp)) if v > 1]
        parts.append(f"DP{self.dp(gpus)}")
        return " ".join(parts + (["SP"] if self.sp else []))

    @classmethod
    def of(cls, layout: Layout, moe: bool = False) -> Structure:
        even = layout.stage_layers is None or len(set(layout.stage_layers)) == 1
        return cls(layout.tp, layout.pp, layout.cp, layout.ep, layout.etp, bool(layout.sp),
                   None if even else tuple(layout.stage_layers), moe)


@dataclass
class TuneSpace:
    structures: list[Structure]
    mbs: list[int]
    recompute: list[str]
    zero: list[int]
    vpp: dict[int, list[int]]                  # pp -> virtual-stage counts that split the layers
    seeds: list[dict[str, Any]] = field(default_factory=list)   # params of solver plans, seeding order
    solver: dict[str, Any] = field(default_factory=dict)        # how the structures were found

    # ---- parameters <-> layouts -------------------------------------------------------------------------
    def vpp_choices(self, s: Structure) -> list[int]:
        return self.vpp.get(s.pp, [1]) if s.pp > 1 else [1]

    def suggest(self, trial: Any, gpus: int) -> dict[str, Any]:
        """Ask ``trial`` (an optuna.Trial) for every parameter this structure has; returns the params."""
        params: dict[str, Any] = {"layout": trial.suggest_categorical("layout", list(range(len(self.structures))))}
        s = self.structures[params["layout"]]
        for name, choices in self._knobs(s, gpus):
            params[name] = trial.suggest_categorical(name, choices)
        return params

    def _knobs(self, s: Structure, gpus: int) -> list[tuple[str, list]]:
        knobs: list[tuple[str, list]] = []
        if len(self.mbs) > 1:
            knobs.append(("mbs", self.mbs))
        if len(self.recompute) > 1:
            knobs.append(("recompute", self.recompute))
        if len(self.vpp_choices(s)) > 1:
            knobs.append((f"vpp_pp{s.pp}", self.vpp_choices(s)))
        if s.sharded(gpus) and len(self.zero) > 1:
            knobs.append(("zero", self.zero))
        return knobs

    def layout(self, params: dict[str, Any], gpus: int) -> Layout:
        """The (unresolved) layout a parameter set stands for."""
        s = self.structures[int(params["layout"])]
        # Unsharded data (dp = edp = 1): every ZeRO stage is the same run; take ZeRO-1 (the Layout default).
        zero = params.get("zero", self.zero[0] if s.sharded(gpus) or 1 not in self.zero else 1)
        return Layout(tp=s.tp, pp=s.pp, vpp=params.get(f"vpp_pp{s.pp}", self.vpp_choices(s)[0]), cp=s.cp, ep=s.ep,
                      etp=s.etp, sequence_parallel=s.sp, zero_stage=zero, fsdp=zero == 3,
                      micro_batch=params.get("mbs", self.mbs[0]), recompute=params.get("recompute", self.recompute[0]),
                      stage_layers=s.stage_layers)

    def params_for(self, layout: Layout, gpus: int) -> dict[str, Any] | None:
        """The parameters of ``layout`` in this space (None when it is outside the space)."""
        s = Structure.of(layout)
        idx = next((i for i, t in enumerate(self.structures) if t.key == s.key), None)
        if idx is None:
            return None
        t = self.structures[idx]
        values = {"mbs": layout.micro_batch, "recompute": layout.recompute, f"vpp_pp{t.pp}": layout.vpp,
                  "zero": layout.zero_stage}
        params: dict[str, Any] = {"layout": idx}
        for name, choices in self._knobs(t, gpus):
            if values[name] not in choices:
                return None
            params[name] = values[name]
        return params

    def all_params(self, gpus: int) -> list[dict[str, Any]]:
        """Every parameter set of the space (valid or not), structures in order."""
        out = []
        for i, s in enumerate(self.structures):
            knobs = self._knobs(s, gpus)
            for values in itertools.product(*(c for _, c in knobs)):
                out.append({"layout": i, **{n: v for (n, _), v in zip(knobs, values)}})
        return out

    # ---- storage ---------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"structures": [asdict(s) for s in self.structures], "mbs": self.mbs, "recompute": self.recompute,
                "zero": self.zero, "vpp": {str(k): v for k, v in self.vpp.items()}, "seeds": self.seeds,
                "solver": self.solver}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TuneSpace:
        structs = [Structure(**{**s, "stage_layers": tuple(s["stage_layers"]) if s.get("stage_layers") else None})
                   for s in d["structures"]]
        return cls(structs, list(d["mbs"]), list(d["recompute"]), list(d["zero"]),
                   {int(k): list(v) for k, v in d["vpp"].items()}, list(d.get("seeds", [])), dict(d.get("solver", {})))


def space_from_plans(plans: list[Plan], options: SearchOptions, model: ModelSpec, gpus: int, k: int,
                     n_seeds: int) -> TuneSpace:
    """The K best distinct structures of ``plans`` (ranked best first) and the knob choices of ``options``.

    Seeds: the best plan of each structure (in structure order), then the other plans by rank, as parameter
    sets, at most ``n_seeds``."""
    structures: list[Structure] = []
    for p in plans:
        s = Structure.of(p.layout, model.is_moe)
        if all(t.key != s.key for t in structures):
            structures.append(s)
    structures = structures[:k]
    rcs = list(dict.fromkeys(normalize_recompute(r) for r in (options.recompute or RECOMPUTE_POLICIES)))
    vpps = sorted(set(options.vpp or [1, 2, 4]))
    vpp: dict[int, list[int]] = {}
    for s in structures:
        if s.pp > 1 and s.pp not in vpp:
            even = s.stage_layers is None
            ok = [v for v in vpps if v == 1 or (even and model.num_layers % (s.pp * v) == 0)]
            vpp[s.pp] = ok or [1]
    space = TuneSpace(structures, sorted(set(options.mbs or [1, 2, 4])), rcs,
                      sorted(set(options.zero if options.zero is not None else [0, 1, 2, 3])), vpp)
    ordered: list[Plan] = []
    for s in structures:
        ordered += [p for p in plans if Structure.of(p.layout).key == s.key][:1]
    ordered += [p for p in plans if p not in ordered]
    seeds: list[dict[str, Any]] = []
    for p in ordered:
        params = space.params_for(p.layout, gpus)
        if params is not None and params not in seeds:
            seeds.append(params)
        if len(seeds) >= n_seeds:
            break
    space.seeds = seeds
    return space
