"""Shared pieces of the tuner tests: a tiny dense model, a runner that answers without running (for the
bookkeeping tests only; the tests that show the tuner works use real runs), and a fresh SQLite storage."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from autopar.search.space import SearchOptions
from autopar.specs import Layout, ModelSpec, TrainingSpec

TINY = ModelSpec(name="tiny", num_layers=4, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
                 vocab_size=256)
CPU_TRAIN = TrainingSpec(seq_len=128, global_batch=8)
FAST = SearchOptions(time_limit_s=10)


class BookRunner:
    """Stands in for run_layout in the bookkeeping tests: a step time made up from the layout, failures on
    demand, and a log of every call. ``fail``: {predicate(layout) -> failure string or None}."""

    def __init__(self, fail=None, interrupt_at: int | None = None):
        self.calls: list[Layout] = []
        self.fail = fail or (lambda lay: None)
        self.interrupt_at = interrupt_at

    def __call__(self, model, layout, training, *, world, steps, warmup, timeout_s, seed, backend):
        self.calls.append(layout)
        if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
            raise KeyboardInterrupt
        failure = self.fail(layout)
        if failure:
            return SimpleNamespace(ok=False, failure=failure, wall_s=0.01, log_path=None)
        t = (0.1 * layout.tp ** 1.5 / layout.micro_batch ** 0.3 * {"none": 1.0, "selective": 1.05, "full": 1.3}
             [layout.recompute] * (0.9 if layout.pp > 1 else 1.0) * (1.0 + 0.02 * layout.vpp)
             * (1.0 + 0.01 * layout.zero_stage))
        return SimpleNamespace(ok=True, failure=None, step_time_s=t, tokens_per_s=training.tokens_per_step / t,
                               peak_mem_gib=[0.1] * world, wall_s=0.01, log_path=None)


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'tune.db'}"
