"""The slice of the model one pipeline stage holds, as the term modules need it."""

from __future__ import annotations

from dataclasses import dataclass

from autopar.cost.profile import ModelProfile


@dataclass(frozen=True, slots=True)
class Stage:
    """Pipeline stage ``index`` of ``pp`` holding transformer layers [first, last)."""

    index: int
    pp: int
    first: int
    last: int

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
        return prof.layers.between(name, self.first, self.last)


def split_stages(stage_layers: tuple[int, ...]) -> list[Stage]:
    stages, start = [], 0
    for i, n in enumerate(stage_layers):
        stages.append(Stage(i, len(stage_layers), start, start + n))
        start += n
    return stages
