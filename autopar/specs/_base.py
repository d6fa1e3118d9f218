"""Shared pydantic base for every spec: unknown keys are errors, values are validated on assignment."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Spec(BaseModel):
    """Base class of all autopar input specs (MaxText-style: ``extra="forbid"``, so a typo is an error)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)
