"""Shared pydantic base for every spec (unknown keys are errors, values are validated on assignment) and the
one function that builds a spec from a mapping with one-line error messages (used by the YAML loaders and by
the Hugging Face config mapping alike, so neither imports the other)."""

from __future__ import annotations

from functools import cached_property
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from autopar.errors import AutoparInputError
from autopar.specs.bounds import FIELD_BOUNDS, bound_note


class Spec(BaseModel):
    """Base class of all autopar input specs (MaxText-style: ``extra="forbid"``, so a typo is an error)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> Any:
        """pydantic's copy, less the values cached by ``functools.cached_property``: they were derived from the
        fields before the update (pydantic copies them along with the fields)."""
        copy = super().model_copy(update=update, deep=deep)
        for name in [k for k in copy.__dict__ if isinstance(getattr(type(copy), k, None), cached_property)]:
            del copy.__dict__[name]
        return copy


T = TypeVar("T", bound=BaseModel)


def format_validation_error(err: ValidationError, where: str) -> str:
    """One line per broken field: 'where: field a.b: message'."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (not a field of this spec; check the spelling)"
        elif e["type"] in ("less_than_equal", "too_long"):
            name = next((str(x) for x in reversed(e["loc"]) if str(x) in FIELD_BOUNDS), None)
            if name is not None:
                msg += f"; autopar's bound {bound_note(FIELD_BOUNDS[name])}"
        if e["type"] == "value_error":   # autopar's own validators: their message names the field(s)
            msg = msg.removeprefix("Value error, ")
            if not e["loc"]:                # a check across fields (model validator): no one field to name
                lines.append(f"{where}: {msg}")
                continue
        lines.append(f"{where}: field '{loc}': {msg}")
    return "; ".join(lines)


def build_spec(cls: type[T], data: Any, where: str) -> T:
    """``cls`` validated from the mapping ``data``; any failure is one AutoparInputError naming ``where``."""
    if not isinstance(data, dict):
        raise AutoparInputError(f"{where}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise AutoparInputError(format_validation_error(err, where)) from None
