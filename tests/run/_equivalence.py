"""Shared check of the runner's equivalence tests: a layout's losses against the single-process run."""

from __future__ import annotations

import os
from unittest import mock

import pytest

from autopar.specs.layout import Layout
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec


def assert_losses_match(spec: ModelSpec, layout: dict, world: int, tr: TrainingSpec, steps: int = 3):
    """Run ``spec`` on one process and on ``world`` processes with ``layout`` (SGD, so Adam's normalisation
    cannot hide a wrong gradient); the losses must agree at rtol 1e-5. Returns (reference, parallel) results."""
    from autopar.run.launch import run_layout
    from autopar.run.worker import OPTIMIZER_ENV
    with mock.patch.dict(os.environ, {OPTIMIZER_ENV: "sgd"}):
        ref = run_layout(spec, Layout(), tr, world=1, steps=steps, timeout_s=180)
        got = run_layout(spec, Layout(**layout), tr, world=world, steps=steps, timeout_s=180)
    assert ref.ok, (ref.failure, ref.log_path)
    assert got.ok, (got.failure, got.log_path)
    assert got.losses == pytest.approx(ref.losses, rel=1e-5), spec.name
    return ref, got
