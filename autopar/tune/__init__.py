"""Pre-run tuning: Optuna over the solver's best layouts, each trial a short real training run.

    result = autopar.tune("llama3_8b", "h100_sxm", None, 4, trials=20)   # training None: defaults for the machine
    result.best            # Plan of the layout measured fastest (its estimate: the cost model's prediction)
    result.best_trial      # its measurement (tokens/s, step time, memory)

The solver ranks layouts by the analytical cost model; the tuner keeps its K best distinct parallel structures
and lets Optuna's TPE sampler choose the structure and the step knobs (micro-batch, recompute, virtual stages,
ZeRO stage) trial by trial, maximising the tokens/s measured by :func:`autopar.run.launch.run_layout`.
The solver's predicted-best layouts are the first trials; layouts predicted not to fit are never run
(an Optuna constraint); runs that fail are recorded with their reason. The study lives in an Optuna storage
(SQLite file by default, any RDB URL or a journal file), so a study resumes where it stopped and several
workers can share it. The mechanics live in the private modules: ``_problem`` (what is run), ``_space`` (the
parameters), ``_storage`` (URLs, locks), ``_study`` (the loop), ``_report`` (the tables).

Importing this package imports neither torch nor optuna. The package is callable: ``autopar.tune(...)`` is
:func:`autopar.tune.tune` (``import autopar.tune`` binds the package to that name, so it forwards the call).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autopar.errors import AutoparInputError
from autopar.search.space import SearchOptions
from autopar.specs.hardware import HardwareSpec
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec
from autopar.tune._problem import CPU_SCALE, Problem, local_gpus, resolve_problem
from autopar.tune._report import format_summary, format_trials
from autopar.tune._result import TrialRecord, TuneResult, plan_document, read_plan_document
from autopar.tune._space import Structure, TuneSpace, space_from_plans
from autopar.tune._storage import DEFAULT_DB, parse_storage

__all__ = ["CPU_SCALE", "DEFAULT_DB", "Problem", "TrialRecord", "TuneInterrupted", "TuneResult", "TuneSpace",
           "format_summary", "format_trials", "local_gpus", "plan_document", "read_plan_document", "resolve_problem",
           "solve_space", "tune"]


class TuneInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM turned into KeyboardInterrupt) stopped the tuner. The study keeps every finished
    trial and the interrupted one is queued again; ``str(err)`` says where the study stands."""


def solve_space(problem: Problem, top_k: int, n_seeds: int, say: Callable[[str], None] | None = None) -> TuneSpace:
    """Solve ``problem`` and keep its ``top_k`` best distinct parallel structures.

    The solver's top plans often share one structure (they differ in micro-batch, recompute, ZeRO). So when the
    problem has at most 64 meshes (world-size factorisations), the best plan of every mesh the top plans miss
    is found by one more solve with that mesh pinned; above that, the top plans are asked for in doubling
    numbers (up to 8·top_k) until ``top_k`` structures appear."""
    from autopar.search import solve
    from autopar.search.space import build_space

    say = say or (lambda m: None)
    base = problem.options.__dict__

    def run(k: int, **pins: list[int]) -> Any:
        return solve(problem.model, problem.hardware, problem.training, problem.gpus,
                     SearchOptions(**{**base, **pins, "top_k": k}), explain=False, with_heuristic=False)

    res = run(top_k)
    plans, solve_s, calls = list(res.plans), res.solve_s, 1
    meshes = build_space(problem.model, problem.hardware, problem.training, problem.gpus, problem.options).meshes
    if len(meshes) <= 64:
        covered = {(p.layout.tp, p.layout.cp, p.layout.pp, p.layout.ep, p.layout.etp) for p in plans}
        for tp, cp, pp, ep, etp in meshes:
            if (tp, cp, pp, ep, etp) not in covered and _mesh_may_run(problem, tp, cp, pp, ep, etp):
                try:
                    r = run(1, tp=[tp], cp=[cp], pp=[pp], ep=[ep], etp=[etp])
                except AutoparInputError:
                    continue
                plans += r.plans
                solve_s, calls = solve_s + r.solve_s, calls + 1
    else:
        k = top_k
        while len({Structure.of(p.layout).key for p in plans}) < top_k and len(plans) >= k and k < 8 * top_k:
            k *= 2
            res = run(k)
            plans, solve_s, calls = list(res.plans), solve_s + res.solve_s, calls + 1
    plans.sort(key=lambda p: (p.estimate.step_time_s, p.layout.short()))
    if not plans:
        raise AutoparInputError(f"no layout of {problem.model.name} is predicted to fit {problem.gpus} GPU(s) of "
                                f"{problem.hardware.name} (seq {problem.training.seq_len}, global batch "
                                f"{problem.training.global_batch}): nothing to tune; `autopar solve` explains why")
    space = space_from_plans(plans, problem.options, problem.model, problem.gpus, top_k, n_seeds)
    space.solver = {"status": res.status, "plans": len(plans), "solves": calls, "solve_s": round(solve_s, 3)}
    say(f"solver: {calls} solve(s) in {solve_s:.1f} s, {len(plans)} plan(s) -> {len(space.structures)} parallel "
        f"structure(s), best predicted first: {', '.join(s.label(problem.gpus) for s in space.structures)}")
    return space


_MESH_RULES = ("world size", "min_gpus", "tensor parallel", "sequence parallel", "context parallel", "experts")


def _mesh_may_run(problem: Problem, tp: int, cp: int, pp: int, ep: int, etp: int) -> bool:
    """Whether a mesh passes the layout rules that no step knob can fix (head counts, experts, sequence)."""
    from autopar.specs.layout import Layout, check_layout_groups
    lay = Layout(tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, sequence_parallel=problem.options.sequence_parallel)
    broken = check_layout_groups(lay, problem.model, problem.training, problem.gpus)
    return not any(group in _MESH_RULES for group, _ in broken)


def tune(model: ModelSpec | str | Path, hardware: HardwareSpec | str | Path,
         training: TrainingSpec | dict[str, Any] | None, gpus: int, options: SearchOptions | None = None, *,
         trials: int = 20, top_k: int = 8, storage: str | None = None, study: str | None = None, seed: int = 0,
         steps: int = 8, warmup: int = 2, timeout_s: float = 300.0, backend: str = "auto",
         scale: dict[str, int] | str | None = "auto", seeds: int | None = None, confirm: int | None = None,
         progress: Callable[[str], None] | None = None, runner: Callable[..., Any] | None = None,
         heartbeat: tuple[int, int] | None = None) -> TuneResult:
    """Measure the solver's best layouts with short real runs and let Optuna find the fastest.

    ``gpus`` is the world size of every run (one node: torchrun ``--nproc-per-node``). Without GPUs the runs are
    gloo processes on the CPU and, with ``scale="auto"``, a model larger than :data:`CPU_SCALE` is scaled down
    (the result's notes say so); ``scale`` may also be a dict of ``scale_model`` arguments or None.
    ``training`` None (or a dict of TrainingSpec fields laid over it): seq 128 and 4 sequences per rank on the
    CPU, else seq 4096 and the GPT-3 batch for the model.
    ``options``: the solver's pins (its ``top_k`` is replaced by the tuner's). ``top_k``: distinct parallel
    structures kept from the solver. ``trials``: real runs the study makes in total, over all its workers and
    sessions (a larger number on a later call extends the study). ``seeds``: trials seeded from the solver's
    ranking (default min(top_k, trials // 2), at least 1). ``confirm``: the last trials of the budget re-measure
    the runner-up layouts, each layout counting its fastest run, so that one run slowed down by a busy machine
    does not decide (default min(2, trials // 5)). ``storage``: an Optuna storage URL (default
    ``sqlite:///autopar-tune.db`` in the current folder) or ``journal:FILE``; ``study``: its name (default:
    derived from the problem, so the same call resumes the same study). ``steps``/``warmup``/``timeout_s``:
    per run. ``progress`` receives progress lines (default: stderr). ``runner`` replaces
    :func:`autopar.run.launch.run_layout` (tests). ``heartbeat``: (interval, grace period) in seconds after which a
    running trial whose worker stopped beating is queued again (default: ``_storage.HEARTBEAT_S``, ``GRACE_S``).

    Raises AutoparInputError for bad input (unknown storage URL, unreachable database, a study that belongs to
    another problem) and TuneInterrupted on Ctrl-C, after the study has been left resumable."""
    import logging

    for name, v, low in (("trials", trials, 1), ("top_k", top_k, 1), ("steps", steps, 1)):
        if not isinstance(v, int) or v < low:
            raise AutoparInputError(f"{name} must be a whole number >= {low} (got {v})")
    if warmup < 0 or warmup >= steps:
        raise AutoparInputError(f"warmup ({warmup}) must be at least 0 and below steps ({steps})")
    if timeout_s <= 0:
        raise AutoparInputError(f"timeout_s must be positive (got {timeout_s})")
    say = progress or (lambda m: print(m, file=sys.stderr, flush=True))
    target = parse_storage(storage)                       # unknown URL: fails before any work
    problem = resolve_problem(model, hardware, training, gpus, options, scale=scale, backend=backend)
    try:
        import optuna
    except ImportError:
        raise AutoparInputError("autopar tune needs optuna: pip install 'autopar[profile]'") from None
    if runner is None:
        from autopar.run.launch import run_layout as runner
    from autopar.tune._storage import open_storage, storage_lock
    from autopar.tune._study import Settings, StudyWorker, retry_stale_trial
    storage_notes: list[str] = []
    with storage_lock(target):      # opened before anything is printed: a storage error is the only line
        st = open_storage(target, retry_stale_trial, heartbeat, storage_notes)
    for n in problem.notes + storage_notes:
        say(f"note: {n}")
    say(f"autopar tune: {problem.describe()}")

    problem.options = SearchOptions(**{**problem.options.__dict__, "top_k": top_k})   # part of the study's identity
    n_seeds = seeds if seeds is not None else max(1, min(top_k, trials // 2))
    n_confirm = confirm if confirm is not None else min(2, trials // 5)
    if n_confirm < 0 or n_seeds < 0:
        raise AutoparInputError(f"seeds ({n_seeds}) and confirm ({n_confirm}) must be at least 0")
    name = study or problem.default_study_name()
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(logging.WARNING)
    worker = None
    try:
        settings = Settings(trials, seed, steps, warmup, timeout_s, n_confirm)
        if heartbeat is not None:
            settings.heartbeat_s, settings.grace_s = heartbeat
        worker = StudyWorker(problem, target, st, name, settings, runner,
                             lambda: solve_space(problem, top_k, n_seeds, say), say)
        worker.open()
        for n in worker.notes:
            say(f"note: {n}")
        worker.run()
        return worker.result()
    except _storage_errors() as err:       # the database or journal failed under the study (a disk, a server)
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise AutoparInputError(f"the study storage {target.display} failed: {type(err).__name__}: "
                                f"{first[:300]}") from None
    except KeyboardInterrupt:
        where = f"study '{name}' in {target.display}"
        try:
            if worker is not None and worker.study_id is not None:
                where = worker.progress_line()
        except Exception:
            pass
        raise TuneInterrupted(f"{where}; run the same command to resume") from None
    finally:
        optuna.logging.set_verbosity(level)


def _storage_errors() -> tuple[type[BaseException], ...]:
    """Exceptions a storage raises when its database or file fails mid-study (not autopar's bugs)."""
    errors: list[type[BaseException]] = []
    try:
        import sqlalchemy.exc
        errors.append(sqlalchemy.exc.SQLAlchemyError)
    except ImportError:
        pass
    import json
    errors.append(json.JSONDecodeError)   # a journal damaged while the study ran
    return tuple(errors)


class _CallableModule(types.ModuleType):
    """``autopar.tune`` is this package and the function at once: ``import autopar.tune`` binds the package to
    the name ``autopar.tune``, so the package itself forwards a call to :func:`tune`."""

    def __call__(self, *args: Any, **kwargs: Any) -> TuneResult:
        return tune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
