"""Plan: one ranked layout with its prediction, serialisable to JSON and back."""

from __future__ import annotations

from dataclasses import dataclass

from autopar.cost.result import Estimate, MemoryBreakdown, TimeBreakdown
from autopar.specs.layout import Layout


@dataclass
class Plan:
    rank: int
    estimate: Estimate
    source: str                     # cpsat | exhaustive | heuristic | measured
    objective_s: float | None = None  # the solver's integer objective, in seconds

    @property
    def layout(self) -> Layout:
        return self.estimate.layout

    def to_dict(self) -> dict:
        return {"rank": self.rank, "source": self.source, "objective_s": self.objective_s,
                "estimate": self.estimate.to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        e = d["estimate"]
        lay = {k: v for k, v in e["layout"].items() if k != "edp"}
        if lay.get("stage_layers") is not None:
            lay["stage_layers"] = tuple(lay["stage_layers"])
        est = Estimate(
            layout=Layout(**lay), gpus=e["gpus"], fits=e["fits"], hbm_gib=e["hbm_gib"],
            memory_gib=MemoryBreakdown(**{k: v for k, v in e["memory_gib"].items() if k != "total"}),
            time_s=TimeBreakdown(**e["time_s"]), tokens_per_s_per_gpu=e["tokens_per_s_per_gpu"],
            model_tflops_per_gpu=e["model_tflops_per_gpu"], mfu=e["mfu"], bottleneck=e["bottleneck"],
            worst_stage=e["worst_stage"], notes=tuple(e.get("notes", ())))
        return cls(d["rank"], est, d["source"], d.get("objective_s"))
