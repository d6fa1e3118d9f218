"""What a tuning study holds, read back from its trials: one :class:`TrialRecord` per trial, and the
:class:`TuneResult` with the winning plan."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autopar.measure.record import Comparison, relative_error
from autopar.search.plan import Plan
from autopar.specs.hardware import HardwareSpec
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

# Trial outcomes (user attribute "outcome"). Only "measured" and "failed" trials ran and count against the
# study's budget of trials; the others cost no run.
MEASURED = "measured"        # ran; Optuna state COMPLETE, value = measured tokens/s
FAILED = "failed"            # ran and failed (oom, crash, timeout, backend, unsupported); state PRUNED
SKIPPED = "skipped"          # not run: breaks a layout rule or predicted not to fit (constraint > 0); PRUNED
REPEAT = "repeat"            # not run: the same layout as an earlier trial, whose result it copies
INTERRUPTED = "interrupted"  # the worker stopped (Ctrl-C, killed) during the trial; state FAIL, re-queued
RAN = (MEASURED, FAILED)


@dataclass
class TrialRecord:
    """One trial: what was predicted, what was measured (or why nothing was)."""

    number: int
    state: str                                  # Optuna state: COMPLETE | PRUNED | FAIL | RUNNING
    outcome: str | None                         # one of the outcomes above (None while running)
    params: dict[str, Any]
    layout: str | None = None                   # Layout.short() of the resolved layout
    seeded: int | None = None                   # rank among the solver's seeds, when enqueued from them
    predicted_step_s: float | None = None
    predicted_tokens_per_s: float | None = None
    predicted_mem_gib: float | None = None
    measured_step_s: float | None = None
    measured_tokens_per_s: float | None = None
    measured_mem_gib: float | None = None       # the fullest rank
    reason: str | None = None                   # failure or skip reason
    repeat_of: int | None = None
    remeasure_of: int | None = None             # a re-measurement of the runner-up first run as this trial
    wall_s: float | None = None
    worker: str | None = None

    @property
    def ran(self) -> bool:
        return self.outcome in RAN

    @property
    def step_err(self) -> float | None:
        return relative_error(self.predicted_step_s, self.measured_step_s)

    def comparison(self) -> Comparison:
        """This trial as the shared predicted-vs-measured record (seconds per step)."""
        return Comparison(label=self.layout or f"trial {self.number}", predicted=self.predicted_step_s,
                          measured=self.measured_step_s, predicted_mem_gib=self.predicted_mem_gib,
                          measured_mem_gib=self.measured_mem_gib)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {"step_err": self.step_err}


@dataclass
class TuneResult:
    """A tuning study after this worker stopped. ``best`` is the plan measured fastest (``source`` "measured";
    its estimate is the cost model's prediction for that layout), ``best_trial`` its measurement."""

    study_name: str
    storage: str                                # URL, password masked
    model: ModelSpec                            # the model the runs built
    hardware: HardwareSpec
    training: TrainingSpec
    gpus: int
    best: Plan | None
    best_trial: TrialRecord | None
    records: list[TrialRecord]
    budget: int                                 # trials (runs) the study asks for
    space_size: int                             # parameter sets in the space
    space_runnable: int                         # ... that are valid and predicted to fit
    structures: list[str]
    predicted_best: TrialRecord | None = None   # the solver's best layout, as measured (when it ran)
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def runs(self) -> int:
        return sum(r.ran for r in self.records)

    def to_dict(self) -> dict[str, Any]:
        return {"study": self.study_name, "storage": self.storage, "model": self.model.model_dump(mode="json"),
                "hardware": self.hardware.name, "training": self.training.model_dump(mode="json"),
                "gpus": self.gpus, "budget": self.budget, "runs": self.runs, "space_size": self.space_size,
                "space_runnable": self.space_runnable, "structures": self.structures,
                "best": self.best.to_dict() if self.best else None,
                "best_trial": self.best_trial.to_dict() if self.best_trial else None,
                "predicted_best": self.predicted_best.to_dict() if self.predicted_best else None,
                "trials": [r.to_dict() for r in self.records], "elapsed_s": self.elapsed_s, "notes": self.notes}


PLAN_FORMAT = "autopar-tuned-plan/1"


def plan_document(result: TuneResult) -> dict[str, Any]:
    """The winning plan as a JSON document for launchers: the Plan (``Plan.from_dict``), its measurement,
    and the model, training and world size it was measured with. Raises ValueError when nothing was measured."""
    if result.best is None or result.best_trial is None:
        raise ValueError(f"study '{result.study_name}' has no successful measurement yet")
    return {"format": PLAN_FORMAT, "plan": result.best.to_dict(), "measured": result.best_trial.to_dict(),
            "model": result.model.model_dump(mode="json"), "training": result.training.model_dump(mode="json"),
            "hardware": result.hardware.name, "gpus": result.gpus, "study": result.study_name,
            "storage": result.storage, "notes": result.notes}


def read_plan_document(doc: dict[str, Any]) -> tuple[Plan, ModelSpec, TrainingSpec, int]:
    """(plan, model, training, gpus) from :func:`plan_document`'s output (already parsed from JSON)."""
    if doc.get("format") != PLAN_FORMAT:
        raise ValueError(f"not an autopar tuned plan (format {doc.get('format')!r}, expected {PLAN_FORMAT!r})")
    return (Plan.from_dict(doc["plan"]), ModelSpec.model_validate(doc["model"]),
            TrainingSpec.model_validate(doc["training"]), int(doc["gpus"]))
