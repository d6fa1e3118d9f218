"""The size bounds (autopar/specs/bounds.py): each is enforced by the specs, documented with its reason, and far
enough above real models that the zoo and the published runs load."""

from __future__ import annotations

from pathlib import Path

import pytest
from annotated_types import Le
from pydantic import BaseModel

from autopar.errors import AutoparInputError
from autopar.specs import HardwareSpec, Layout, ModelSpec, TrainingSpec
from autopar.specs.bounds import BOUNDS, FIELD_BOUNDS, limit
from autopar.specs.hardware import Efficiency
from autopar.specs.loaders import build_spec, load_hardware, load_model, zoo_names
from autopar.specs.model import MLASpec, MoESpec
from autopar.measure.validation import load_cases

DOC = Path(__file__).resolve().parents[2] / "docs" / "input-bounds.md"
SPECS = (ModelSpec, MoESpec, MLASpec, TrainingSpec, Layout, HardwareSpec, Efficiency)


def _le(spec: type[BaseModel], field: str):
    meta = spec.model_fields[field].metadata
    return next((m.le for m in meta if isinstance(m, Le)), None)


@pytest.mark.parametrize("field, bound", sorted(FIELD_BOUNDS.items()))
def test_every_bounded_field_is_held_to_its_bound(field, bound):
    owners = [s for s in SPECS if field in s.model_fields]
    assert owners, f"{field} is no spec field"
    for spec in owners:
        if field == "stage_layers":
            continue    # a tuple: its entries and its length carry the bound
        assert _le(spec, field) == limit(bound), (spec.__name__, field)


def test_a_value_above_the_bound_names_the_field_and_the_bound():
    data = load_model("llama3_8b").model_dump()
    data["num_layers"] = limit("layers") + 1
    with pytest.raises(AutoparInputError, match=r"field 'num_layers'.*less than or equal to 1024.*DeepNet"):
        build_spec(ModelSpec, data, "m.yaml")
    with pytest.raises(AutoparInputError, match="seq_len x global_batch"):
        build_spec(TrainingSpec, {"seq_len": limit("seq_len"), "global_batch": limit("global_batch")}, "t")


def test_the_doc_lists_every_bound_with_its_reason():
    doc = DOC.read_text()
    for name, b in BOUNDS.items():
        value = f"{b.limit:,g}" if isinstance(b.limit, float) else f"{b.limit:,}"
        assert f"| `{name}` | {value} |" in doc and b.why in doc, name


def test_zoo_and_published_runs_sit_inside_the_bounds():
    models = [load_model(n) for n in zoo_names("models")]
    for n in zoo_names("hardware"):
        load_hardware(n)
    cases, skipped = load_cases()
    assert cases and not skipped, skipped
    # a real margin: the largest real value is far below each bound
    assert max(m.num_layers for m in models) * 4 <= limit("layers")
    assert max(m.hidden_size for m in models) * 4 <= limit("hidden")
    assert max(m.moe.num_experts for m in models if m.moe) * 4 <= limit("experts")
    assert max(c.gpus for c in cases) * 16 <= limit("gpus")
    assert max(c.training.seq_len for c in cases) * 16 <= limit("seq_len")
