"""The ``--json`` contract of ``autopar solve`` and ``autopar estimate`` as pydantic models.

``autopar schema solve|estimate`` prints the JSON Schema generated from these models; tests validate real ``--json``
output against them (``extra="forbid"``: a key the models do not name fails). ``SCHEMA_VERSION``
(autopar/cli/common.py) is written into every output and bumped when a key changes meaning or goes away.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from autopar.cli.common import SCHEMA_VERSION
from autopar.cost.result import MemoryBreakdown, TimeBreakdown
from autopar.specs.layout import Layout


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


# The breakdowns' keys are the cost model's own dataclass fields (MemoryBreakdown.to_dict adds its total).
MemoryOut = create_model(
    "MemoryOut", __base__=_Out,
    __doc__="GiB per GPU on the fullest pipeline stage (autopar/cost/legend.py MEMORY_LEGEND says what each counts).",
    **{f.name: (float, ...) for f in fields(MemoryBreakdown)}, total=(float, ...))
TimeOut = create_model(
    "TimeOut", __base__=_Out, __doc__="Seconds per step on the critical path (autopar/cost/legend.py TIME_LEGEND).",
    **{f.name: (float, ...) for f in fields(TimeBreakdown)})


# The resolved layout: Layout's fields (their types and descriptions), plus the expert data-parallel degree.
LayoutOut = create_model(
    "LayoutOut", __base__=_Out, __doc__="The resolved layout (autopar.specs.Layout) with its expert data-parallel degree.",
    **{name: (f.annotation, f) for name, f in Layout.model_fields.items()},
    edp=(int, Field(description="Expert data-parallel degree: dp·tp·cp / (ep·etp).")))


class EstimateOut(_Out):
    fits: bool
    hbm_gib: float
    memory_gib: MemoryOut
    step_time_s: float
    time_s: TimeOut
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float = Field(description="Model FLOPs utilisation, 0..1.")
    bottleneck: str
    worst_stage: int
    gpus: int
    layout: LayoutOut
    host_offload_gib: float
    notes: list[str]


class EstimateJson(EstimateOut):
    """``autopar estimate --json``."""
    schema_version: Literal[SCHEMA_VERSION]
    compute_by_kernel_s: dict[str, float] | None = Field(
        default=None, description="Compute seconds per step by kernel class (dense GEMM, attention core, ...).")
    interval: dict | None = Field(
        default=None, description="80% intervals of tokens_per_s_per_gpu, step_time_s and memory_gib from held-out "
                                  "errors by regime (data/error_bars.yaml; autopar/measure/intervals.py).")
    stack: dict | None = Field(default=None, description="The software stack and its knobs the prediction prices.")


class BudgetOut(_Out):
    """Training the given tokens at the plan's predicted throughput (autopar/search/budget.py)."""
    tokens: float
    gpus: int
    days: float
    gpu_hours: float
    cost: float | None


class PlanOut(_Out):
    rank: int
    source: str
    objective_s: float | None
    estimate: EstimateOut
    budget: BudgetOut | None = None


class SweepOut(_Out):
    gpus: int
    fits: bool
    step_time_s: float | None
    gpu_hours_per_1e12_tokens: float | None


class EmitOut(_Out):
    target: str = Field(description="The --emit target: megatron, bridge, torchtitan or env.")
    plan_rank: int | None = Field(description="The plan the settings are for: the fastest the launcher can run "
                                              "(None when it runs none).")
    text: str | None = Field(description="The launcher settings as a file holds them (the text output prints the "
                                         "same, its long comment lines wrapped to the terminal).")
    refusal: str | None = Field(description="Why the launcher cannot train this model at all (then no text).")
    refused: dict[str, list[str]] = Field(description="Reason -> ranks ('#2') of the faster plans it refused.")


class SolveJson(_Out):
    """``autopar solve --json``."""
    schema_version: Literal[SCHEMA_VERSION]
    gpus: int = Field(description="The GPU count of the plans (the chosen one with --gpus A-B).")
    status: str
    gap: float
    solve_s: float
    memory_margin: float = Field(description="Share of HBM the search kept free beyond the memory model "
                                             "(--memory-margin).")
    space_size: int
    meshes: int
    method: str
    plans: list[PlanOut]
    heuristic: PlanOut | None
    heuristic_reasons: list[str]
    explanation: list[str]
    notes: list[str]
    advice: list[str]
    batch_warning: str | None
    emit: EmitOut | None = Field(None, description="With --emit: the launcher settings of the best plan it runs.")
    gpu_sweep: list[SweepOut] | None = None
    interval: dict | None = Field(
        default=None, description="80% intervals of the best plan's throughput, step time and memory (held-out "
                                  "errors by regime, data/error_bars.yaml).")
    stack: dict | None = Field(default=None, description="The software stack and its knobs the plans price.")


SCHEMAS = {"solve": SolveJson, "estimate": EstimateJson}


def run(args: argparse.Namespace) -> int:
    print(json.dumps(SCHEMAS[args.output].model_json_schema(), indent=1))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schema", help="print the JSON Schema of a command's --json output",
                       description=__doc__.splitlines()[0])
    p.add_argument("output", choices=sorted(SCHEMAS), help="the command whose --json output to describe")
    p.set_defaults(func=run)
