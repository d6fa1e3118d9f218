"""The slice of the model one pipeline stage holds, as the term modules need it."""

from __future__ import annotations

from dataclasses import dataclass, field

from autopar.cost.layer_sums import ModelProfile

MEMO_KEY_TYPES = frozenset((str, int, float, bool, type(None)))   # values a memo key may hold (not numpy arrays)


def memoised(memo: dict | None, name: str, fields: tuple, price, *args):
    """``price(*args)``, kept in ``memo`` under (``name``, ``fields``) when there is a memo and every field is a plain
    value (:data:`MEMO_KEY_TYPES`); priced afresh otherwise (the search's grids hold numpy arrays). ``fields`` must
    name everything ``price`` reads that can differ between calls on the same memo: the callers' key tuples say
    which (tests/cost/test_estimator_cache.py fails a key that leaves one out)."""
    if memo is None or not MEMO_KEY_TYPES.issuperset(map(type, fields)):
        return price(*args)
    key = (name, fields)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = price(*args)
    return hit


@dataclass(frozen=True, slots=True)
class Stage:
    """Pipeline stage ``index`` of ``pp`` holding transformer layers [first, last)."""

    index: int
    pp: int
    first: int
    last: int
    sums: dict | None = None     # per-token totals of every per-layer quantity, filled once by the Estimator
    # results of pure functions of (this stage, a few plain-int layout degrees), hardware-free, that several terms of
    # one estimate need, each keyed by its function's name and those degrees (memory.stage_params); made with the sums
    memo: dict | None = field(default=None, compare=False, hash=False, repr=False)

    @property
    def n_layers(self) -> int:
        return self.last - self.first

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.pp - 1

    def sum(self, prof: ModelProfile, name: str) -> float:
        """Per-token total of a per-layer quantity over this stage's layers."""
        if self.sums is not None:
            return self.sums[name]
        return prof.layers.between(name, self.first, self.last)

    def with_sums(self, prof: ModelProfile) -> "Stage":
        lay = prof.layers
        return Stage(self.index, self.pp, self.first, self.last,
                     {k: lay.between(k, self.first, self.last) for k in lay.__dataclass_fields__}, {})


def split_stages(stage_layers: tuple[int, ...]) -> list[Stage]:
    stages, start = [], 0
    for i, n in enumerate(stage_layers):
        stages.append(Stage(i, len(stage_layers), start, start + n))
        start += n
    return stages
