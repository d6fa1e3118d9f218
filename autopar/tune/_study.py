"""The tuning loop: one worker's share of an Optuna study whose trials are short real runs.

How a study is laid out (so that any number of workers, on any number of nodes, can share it):

- The worker that creates the study solves first, stores the problem's fingerprint and the search space in
  the study's user attributes, and enqueues the study's whole budget of trials as WAITING trials: first the
  solver's predicted-best layouts (fixed parameters), then empty ones that the TPE sampler fills in.
- Every worker takes WAITING trials one at a time (the storage hands each to exactly one worker; SQLite and
  journal files are serialised with a lock file) until none is left, so a study runs exactly its budget,
  whatever the number of workers, and a worker that joins late or restarts just takes what is left.
- A trial that does not run (breaks a layout rule, is predicted not to fit, or repeats a layout already run)
  is recorded with its reason, and a fresh WAITING trial replaces it: only real runs count against the budget.
- A trial whose worker stopped (Ctrl-C, SIGTERM, killed) is marked FAIL "interrupted" and its parameters are
  queued again: by the worker itself on Ctrl-C; otherwise by any other worker, which looks before taking each
  trial and while it waits for the others: the dead worker's process is gone on this host, or its heartbeat
  stopped (Optuna's RDB heartbeat with :func:`retry_stale_trial` as the stale-trial callback; for journals the
  same from the ``autopar:heartbeat`` user attribute), or it has run longer than its timeout allows.

Each trial's sampler is a TPESampler seeded from (seed, trial number): a study run alone is reproducible up to
the noise of the measurements, and workers running side by side never draw from the same random stream.
Memory feasibility is an Optuna constraint (``Trial.set_constraint``): the predicted memory above the HBM
size, and for a run that ran out of memory, ``run_oom`` = 1.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from autopar.cost import Estimator
from autopar.errors import AutoparInputError
from autopar.search.plan import Plan
from autopar.specs.layout import check_layout, resolve_layout
from autopar.tune._problem import Problem
from autopar.tune._result import FAILED, INTERRUPTED, MEASURED, RAN, REPEAT, SKIPPED, TrialRecord, TuneResult
from autopar.tune._space import TuneSpace
from autopar.tune._storage import GRACE_S, HEARTBEAT_S, StorageTarget, storage_lock

ATTR_PROBLEM = "autopar:problem"     # Problem.fingerprint()
ATTR_SPACE = "autopar:space"         # TuneSpace.to_dict()
ATTR_OPTIONS = "autopar:options"     # the search options the space was built with
ATTR_BUDGET = "autopar:trials"       # trials (runs) the study asks for
ATTR_READY = "autopar:ready"         # set once the queue is filled
READY_WAIT_S = 180.0                 # how long a worker waits for another one to finish creating the study
STALE_MARGIN_S = 600.0               # a trial running this long past its run timeout has lost its worker
ATTR_HEARTBEAT = "autopar:heartbeat"  # journals: time.time() of the running trial's worker's last heartbeat


@dataclass
class Settings:
    trials: int
    seed: int = 0
    steps: int = 6
    warmup: int = 2
    timeout_s: float = 300.0
    confirm: int = 0                 # last trials of the budget: re-measure the runner-up layouts
    max_not_run: int | None = None   # not-run proposals after which the study stops asking (default 10·trials, >= 50)
    heartbeat_s: int = HEARTBEAT_S   # a running trial's heartbeat interval ...
    grace_s: int = GRACE_S           # ... and the silence after which another worker queues it again


@dataclass
class _Counts:
    ran: int = 0
    not_run: int = 0
    waiting: int = 0
    running: int = 0
    ran_labels: set[str] = field(default_factory=set)


def _worker_id() -> str:
    """"host:pid:start:token": the process (its start time tells a reused pid apart) and this StudyWorker in it."""
    return f"{socket.gethostname()}:{os.getpid()}:{_proc_start(os.getpid())}:{uuid.uuid4().hex[:8]}"


def _proc_start(pid: int) -> str:
    """The start time (clock ticks since boot) of a live process; "?" when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return "?"
    return "?" if fields[0] in ("Z", "X") else fields[19]


def _worker_gone(worker: str | None) -> bool:
    """True when ``worker`` ("host:pid:start[:token]") ran on this host and that process no longer exists."""
    if not worker:
        return False
    host, _, rest = worker.partition(":")
    pid, _, start = rest.partition(":")
    start = start.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    now = _proc_start(int(pid))
    return now == "?" or now != start


def retry_stale_trial(study: Any, trial: Any) -> None:
    """Optuna's heartbeat-stale trial callback (RDB storages): ``trial``'s worker stopped beating and Optuna
    failed it; queue its parameters again, as ``RetryFailedTrialCallback`` does, keeping only the attributes a
    re-queued trial keeps (its seed rank, a re-measurement's target) and which trial it retries."""
    attrs = dict(_seed_attr(trial.user_attrs) or {}, retry_of=trial.number)
    study.enqueue_trial(dict(trial.params), user_attrs=attrs)


@contextlib.contextmanager
def _heartbeat(storage: Any, tid: int, interval: float) -> Iterator[None]:
    """Beat for trial ``tid`` every ``interval`` seconds while the block runs: Optuna's ``record_heartbeat`` on an
    RDB storage with a heartbeat, else the ``autopar:heartbeat`` user attribute (journals). The beats stop with
    the block, or at the first failure (the trial finished, the storage went away)."""
    native = callable(getattr(storage, "record_heartbeat", None)) and storage.get_heartbeat_interval() is not None

    def beat() -> None:
        if native:
            storage.record_heartbeat(tid)
        else:
            storage.set_trial_user_attr(tid, ATTR_HEARTBEAT, time.time())

    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            try:
                beat()
            except Exception:   # the trial is finished or the storage is gone: nothing left to keep alive
                return

    beat()
    thread = threading.Thread(target=loop, name=f"autopar-heartbeat-{tid}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def _no_sigint() -> Iterator[None]:
    """Hold Ctrl-C off while the study's bookkeeping is written (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _fmt_rate(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _clock(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class StudyWorker:
    """One worker of a study: open (create or join), run trials until the queue is empty, read the result."""

    def __init__(self, problem: Problem, target: StorageTarget, storage: Any, study_name: str, settings: Settings,
                 runner: Callable[..., Any], make_space: Callable[[], TuneSpace],
                 say: Callable[[str], None]):
        self.p, self.target, self.storage, self.name, self.s = problem, target, storage, study_name, settings
        self.runner, self.make_space, self.say = runner, make_space, say
        self.est = Estimator(problem.model, problem.hardware, problem.training, problem.gpus)
        self.worker = _worker_id()
        self.t0 = time.monotonic()
        self.notes: list[str] = []
        self.space: TuneSpace | None = None
        self.study: Any = None
        self.study_id: int | None = None
        self.created = False
        self.runnable: dict[str, dict] = {}
        self.space_size = 0
        self.current_trial: Any = None
        self._not_run_streak = 0
        self.max_not_run = settings.max_not_run or max(50, 10 * settings.trials)

    # ---- opening ---------------------------------------------------------------------------------------
    def _exists(self) -> bool:
        try:
            self.storage.get_study_id_from_name(self.name)
            return True
        except KeyError:
            return False

    def open(self) -> None:
        import optuna

        space = None if self._exists() else self.make_space()     # solve outside the lock
        with storage_lock(self.target), _no_sigint():
            try:
                self.study = optuna.create_study(storage=self.storage, study_name=self.name, direction="maximize")
                self.created = True
            except optuna.exceptions.DuplicatedStudyError:
                self.study = optuna.load_study(study_name=self.name, storage=self.storage)
            self.study_id = self.storage.get_study_id_from_name(self.name)
            if self.created:
                self.space = space or self.make_space()
                self._fill_new_study()
            else:
                self._join()
            self._requeue_stale()
        self._index_space()

    def _fill_new_study(self) -> None:
        st, sid = self.storage, self.study_id
        st.set_study_user_attr(sid, ATTR_PROBLEM, self.p.fingerprint())
        st.set_study_user_attr(sid, ATTR_OPTIONS, _options_dict(self.p))
        st.set_study_user_attr(sid, ATTR_SPACE, self.space.to_dict())
        confirm = min(self.s.confirm, max(0, self.s.trials - 2))
        seeds = self.space.seeds[: self.s.trials - confirm]
        for i, params in enumerate(seeds):
            self.study.enqueue_trial(params, user_attrs={"seed_rank": i + 1})
        for _ in range(self.s.trials - len(seeds) - confirm):
            self.study.enqueue_trial({})
        for _ in range(confirm):
            self.study.enqueue_trial({}, user_attrs={"confirm": True})
        st.set_study_user_attr(sid, ATTR_BUDGET, self.s.trials)
        st.set_study_user_attr(sid, ATTR_READY, True)
        self.say(f"study '{self.name}' in {self.target.display}: new, {self.s.trials} trial(s): "
                 f"{len(seeds)} seeded with the solver's predicted-best layouts, "
                 f"{self.s.trials - len(seeds) - confirm} chosen by TPE, {confirm} re-measuring the runner-ups")

    def _join(self) -> None:
        deadline = time.monotonic() + READY_WAIT_S
        attrs = self.storage.get_study_user_attrs(self.study_id)
        while not attrs.get(ATTR_READY):
            if ATTR_PROBLEM in attrs:
                self._check_problem(attrs[ATTR_PROBLEM])
            if self.target.is_file or time.monotonic() > deadline:
                if ATTR_PROBLEM not in attrs and not self.storage.get_all_trials(self.study_id, deepcopy=False):
                    raise AutoparInputError(
                        f"study '{self.name}' in {self.target.display} was not made by autopar tune (it has no "
                        "autopar problem record): choose another --study name")
                if ATTR_SPACE not in attrs:
                    raise AutoparInputError(f"study '{self.name}' in {self.target.display} is not an autopar tune "
                                            "study (no search space stored): choose another --study name")
                break                      # its creator stopped half-way: take over with what is stored
            time.sleep(1.0)
            attrs = self.storage.get_study_user_attrs(self.study_id)
        self._check_problem(attrs[ATTR_PROBLEM])
        self.space = TuneSpace.from_dict(attrs[ATTR_SPACE])
        if attrs.get(ATTR_OPTIONS) != _options_dict(self.p):
            self.notes.append("the study's search space was fixed when it was created; this run's search options "
                              "(pins, --top-k) differ and are not used")
        budget = int(attrs.get(ATTR_BUDGET, 0))
        c = self._counts()
        if self.s.trials > budget or not attrs.get(ATTR_READY):
            missing = self.s.trials - c.ran - c.waiting - c.running
            for _ in range(max(0, missing)):
                self.study.enqueue_trial({})
            self.storage.set_study_user_attr(self.study_id, ATTR_BUDGET, max(budget, self.s.trials))
            self.storage.set_study_user_attr(self.study_id, ATTR_READY, True)
        self.say(f"study '{self.name}' in {self.target.display}: resuming, {c.ran} of "
                 f"{max(budget, self.s.trials)} trial(s) run, {c.waiting} queued, {c.running} running elsewhere")

    def _check_problem(self, stored: dict) -> None:
        mine = self.p.fingerprint()
        if stored == mine:
            return
        diffs = []
        for key in ("model", "model_sha", "hardware", "gpus", "seq_len", "global_batch", "precision"):
            if stored.get(key) != mine.get(key):
                diffs.append(f"{key} {stored.get(key)} (study) vs {mine.get(key)} (here)")
        raise AutoparInputError(f"study '{self.name}' in {self.target.display} belongs to another problem: "
                                + "; ".join(diffs) + ". Choose another --study name, or the study's own model, "
                                "hardware, --gpus and training flags")

    def _requeue_stale(self) -> int:
        """Trials left RUNNING by a worker that is gone: mark them interrupted and queue their parameters again.
        Returns how many were queued again."""
        import optuna
        from optuna.trial import TrialState
        with warnings.catch_warnings():      # "experimental" in Optuna 5
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            before = len(self.storage.get_all_trials(self.study_id, deepcopy=False, states=(TrialState.FAIL,)))
            optuna.storages.fail_stale_trials(self.study)   # RDB heartbeat: FAIL + retry_stale_trial
            requeued = len(self.storage.get_all_trials(self.study_id, deepcopy=False,
                                                       states=(TrialState.FAIL,))) - before
        if requeued:
            self.say(f"{requeued} trial(s) whose worker's heartbeat stopped (over {self.s.grace_s} s): queued again")
        for t in self.storage.get_all_trials(self.study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            why = self._stale(t)
            if why is None:
                continue
            worker = t.user_attrs.get("worker")
            tid = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, t.number)
            try:
                self.storage.set_trial_user_attr(tid, "outcome", INTERRUPTED)
                self.storage.set_trial_user_attr(tid, "reason", f"interrupted: {why} ({worker})")
                self.study.enqueue_trial(dict(t.params), user_attrs=_seed_attr(t.user_attrs))
                self.study.tell(t.number, state=TrialState.FAIL)
                self.say(f"trial #{t.number} was left running ({why}); queued again")
                requeued += 1
            except Exception:      # another worker got there first
                continue
        return requeued

    def _stale(self, t: Any) -> str | None:
        """Why the RUNNING trial ``t`` has lost its worker, or None while it may still be running. Called only
        between this worker's own trials, so a trial under this worker's own id is one it abandoned (a storage
        write that failed as it finished)."""
        worker = t.user_attrs.get("worker")
        if worker == self.worker:
            return "abandoned by this worker"
        if _worker_gone(worker):
            return "its worker is gone"
        beat = t.user_attrs.get(ATTR_HEARTBEAT)
        silent = time.time() - float(beat) if isinstance(beat, (int, float)) else 0.0
        if silent > self.s.grace_s:
            return f"no heartbeat for {silent:.0f} s"
        limit = float(t.user_attrs.get("timeout_s", self.s.timeout_s)) + STALE_MARGIN_S
        age = (datetime.now() - t.datetime_start).total_seconds() if t.datetime_start else 0.0
        if age > limit:
            return f"running {age:.0f} s, past its timeout"
        return None

    def _index_space(self) -> None:
        """Label every parameter set; keep those that are valid and predicted to fit (the runnable space)."""
        params = self.space.all_params(self.p.gpus)
        self.space_size = len(params)
        for ps in params:
            lay = self.space.layout(ps, self.p.gpus)
            if check_layout(lay, self.p.model, self.p.training, self.p.gpus):
                continue
            r = resolve_layout(lay, self.p.model, self.p.training, self.p.gpus)
            if self.est.estimate(r, resolved=True).fits:
                self.runnable.setdefault(r.short(), ps)

    # ---- the loop --------------------------------------------------------------------------------------
    def _counts(self) -> _Counts:
        from optuna.trial import TrialState
        c = _Counts()
        for t in self.storage.get_all_trials(self.study_id, deepcopy=False):
            outcome = t.user_attrs.get("outcome")
            if t.state == TrialState.WAITING:
                c.waiting += 1
            elif t.state == TrialState.RUNNING:
                c.running += 1
            elif outcome in RAN:
                c.ran += 1
                if t.user_attrs.get("layout"):
                    c.ran_labels.add(t.user_attrs["layout"])
            elif outcome in (SKIPPED, REPEAT):
                c.not_run += 1
        return c

    def _claim(self, confirm_only: bool = False) -> int | None:
        """Take the next WAITING trial (the storage gives each to one worker). None when the queue is empty.
        Order: trials with parameters (the solver's seeds, interrupted trials queued again), then the empty ones
        for TPE, then the re-measurements, which need the others' results."""
        from optuna.exceptions import UpdateFinishedTrialError
        from optuna.trial import TrialState
        waiting = self.storage.get_all_trials(self.study_id, deepcopy=False, states=(TrialState.WAITING,))
        waiting.sort(key=lambda t: (2 if t.user_attrs.get("confirm") else 0 if t.system_attrs.get("fixed_params")
                                    else 1, t.number))
        for t in waiting:
            if confirm_only and not t.user_attrs.get("confirm"):
                continue
            tid = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, t.number)
            try:
                if self.storage.set_trial_state_values(tid, state=TrialState.RUNNING):
                    return tid
            except UpdateFinishedTrialError:
                continue
        return None

    def _measured(self) -> dict[str, list[Any]]:
        """Measured trials by layout label, in trial order."""
        out: dict[str, list[Any]] = {}
        for t in self.storage.get_all_trials(self.study_id, deepcopy=False):
            if t.user_attrs.get("outcome") == MEASURED:
                out.setdefault(t.user_attrs["layout"], []).append(t)
        return out

    def _prepare_confirm(self, tid: int) -> None:
        """A re-measurement slot: fix its parameters to the runner-up layout measured the fewest times (the best
        layout's own luck cannot lower it: each layout counts its fastest run; a runner-up measured while the
        machine was busy can still overtake). With nothing measured yet it stays an ordinary TPE trial."""
        t = self.storage.get_trial(tid)
        if not t.user_attrs.get("confirm") or t.system_attrs.get("fixed_params"):
            return
        runs = self._measured()
        for other in self.storage.get_all_trials(self.study_id, deepcopy=False):   # re-measurements under way
            label = other.user_attrs.get("confirm_layout")
            if other.state.name == "RUNNING" and label in runs:
                runs[label] = runs[label] + [other]
        ranked = sorted(runs, key=lambda k: -max(x.user_attrs.get("measured_tokens_per_s", 0.0) for x in runs[k]))
        pool = ranked[1:3] or ranked[:1]
        if not pool:
            return
        label = min(pool, key=lambda k: (len(runs[k]), ranked.index(k)))
        first = runs[label][0]
        self.storage.set_trial_system_attr(tid, "fixed_params", dict(first.params))
        self.storage.set_trial_user_attr(tid, "confirm_layout", label)
        self.storage.set_trial_user_attr(tid, "confirm_of", first.number)

    def run(self) -> None:
        """Run trials until the queue is empty, the study has its budget, or the space is covered; then wait for
        the trials other workers run, taking over any whose worker dies meanwhile."""
        while True:
            self._run_queue()
            if not self._wait_for_others():
                return

    def _run_queue(self) -> None:
        while True:
            with storage_lock(self.target), _no_sigint():
                self._requeue_stale()
                c = self._counts()
                if c.ran >= self.s.trials:
                    break
                covered = bool(self.runnable) and not set(self.runnable) - c.ran_labels
                if self._not_run_streak >= 25:
                    self.notes.append("stopped: the sampler proposed 25 layouts in a row that were already run or "
                                      "cannot run (the space is nearly covered)")
                    break
                tid = self._claim(confirm_only=covered)
                if tid is not None:
                    self._prepare_confirm(tid)
            if tid is None:
                if covered:
                    self.notes.append(f"every runnable layout of the space ({len(self.runnable)}) has run: the "
                                      "space is covered")
                break
            self._trial(tid, c.ran + c.running + 1)

    def _wait_for_others(self) -> bool:
        """Wait for the trials other workers are still running, so that every worker reports the whole study.
        True as soon as one of them is queued again (its worker died: this worker runs it), False when none is
        left running."""
        from optuna.trial import TrialState
        told = False
        while True:
            with storage_lock(self.target), _no_sigint():
                if self._requeue_stale() and self._counts().ran < self.s.trials:
                    return True
            live = [t.number for t in self.storage.get_all_trials(self.study_id, deepcopy=False,
                                                                  states=(TrialState.RUNNING,))
                    if self._stale(t) is None]
            if not live:
                return False
            if not told:
                numbers = ", ".join(f"#{n}" for n in live)
                self.say(f"waiting for {len(live)} trial(s) running in other workers ({numbers})")
                told = True
            time.sleep(1.0)

    def _sampler(self, number: int) -> Any:
        import optuna
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=(self.s.seed * 1_000_003 + number) % 2**31,
                                              n_startup_trials=max(2, min(10, self.s.trials // 5)),
                                              multivariate=True, group=True, constant_liar=True)

    def _trial(self, tid: int, i: int) -> None:
        import optuna
        number = self.storage.get_trial_number_from_id(tid)
        self.study.sampler = self._sampler(number)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            trial = optuna.trial.Trial(self.study, tid)
        self.current_trial = trial
        try:
            with _heartbeat(self.storage, tid, self.s.heartbeat_s):
                self._evaluate(trial, number, i)
        except KeyboardInterrupt:
            with _no_sigint():
                self._interrupt(trial, "interrupted (Ctrl-C / SIGTERM)")
            raise
        except Exception as err:
            with _no_sigint():
                self._interrupt(trial, f"interrupted by an error: {type(err).__name__}: {err}")
            raise
        finally:
            self.current_trial = None

    def _evaluate(self, trial: Any, number: int, i: int) -> None:
        from optuna.trial import TrialState
        p, gpus = self.p, self.p.gpus
        trial.set_user_attr("worker", self.worker)
        trial.set_user_attr("timeout_s", self.s.timeout_s)
        params = self.space.suggest(trial, gpus)
        layout = self.space.layout(params, gpus)
        seed_rank = trial.user_attrs.get("seed_rank")
        tag = f"seed {seed_rank}" if seed_rank else ""   # the study's trial number is no run number: not shown
        problems = check_layout(layout, p.model, p.training, gpus)
        if problems:
            trial.set_user_attr("layout", self.space.structures[params["layout"]].label(gpus) + f" {params}")
            trial.set_constraint("layout_rules", float(len(problems)))
            return self._not_run(trial, SKIPPED, "invalid: " + "; ".join(problems), tag)
        resolved = resolve_layout(layout, p.model, p.training, gpus)
        label = resolved.short()
        e = self.est.estimate(resolved, resolved=True)
        excess = e.memory_gib.total - e.hbm_gib
        for k, v in (("layout", label), ("predicted_step_s", e.step_time_s),
                     ("predicted_tokens_per_s", p.training.tokens_per_step / e.step_time_s),
                     ("predicted_mem_gib", e.memory_gib.total)):
            trial.set_user_attr(k, v)
        trial.set_constraint("memory_gib_over_hbm", excess)
        if not e.fits:
            return self._not_run(trial, SKIPPED, f"predicted OOM: {e.memory_gib.total:.2f} GiB > "
                                                 f"{e.hbm_gib:.2f} GiB HBM", tag)
        if trial.user_attrs.get("confirm_of") is not None:
            tag += f" re-measure of trial #{trial.user_attrs['confirm_of']}"
        else:
            prior = self._prior_run(label, number, float(trial.user_attrs.get("timeout_s", self.s.timeout_s)))
            if prior is not None:
                return self._repeat(trial, prior, tag)
        self._not_run_streak = 0
        seed = f" {tag.strip()}" if tag.strip() else ""
        self.say(f"[trial {i}/{self.s.trials}{seed}] {label}: predicted {e.step_time_s:.4g} s/step; running "
                 f"{self.s.steps} steps ...")
        res = self.runner(p.model, resolved, p.training, world=gpus, steps=self.s.steps, warmup=self.s.warmup,
                          timeout_s=self.s.timeout_s, seed=0, backend=p.backend)
        trial.set_user_attr("wall_s", round(float(getattr(res, "wall_s", 0.0) or 0.0), 3))
        elapsed = _clock(time.monotonic() - self.t0)
        if res.ok:
            mems = [m for m in (res.peak_mem_gib or []) if m is not None]
            trial.set_user_attr("measured_step_s", float(res.step_time_s))
            trial.set_user_attr("measured_tokens_per_s", float(res.tokens_per_s))
            trial.set_user_attr("measured_mem_gib", float(max(mems)) if mems else None)
            trial.set_user_attr("outcome", MEASURED)
            self.study.tell(trial, float(res.tokens_per_s))
            best = self._best_so_far()
            self.say(f"    measured {res.step_time_s:.4g} s/step, {res.tokens_per_s:,.0f} tokens/s; best so far "
                     f"{_fmt_rate(best[1])} tokens/s (#{best[0]}); elapsed {elapsed}")
        else:
            reason = res.failure or "failed"
            if reason == "oom":
                trial.set_constraint("run_oom", 1.0)
            trial.set_user_attr("reason", reason)
            trial.set_user_attr("outcome", FAILED)
            self.study.tell(trial, state=TrialState.PRUNED)
            self.say(f"    failed: {reason}" + (f" (log: {res.log_path})" if getattr(res, "log_path", None) else "")
                     + f"; elapsed {elapsed}")

    def _prior_run(self, label: str, number: int, timeout_s: float) -> Any:
        """The earliest finished trial that ran ``label`` (waiting for one that another worker is running)."""
        from optuna.trial import TrialState
        deadline = time.monotonic() + timeout_s + 120.0
        while True:
            running = False
            for t in self.storage.get_all_trials(self.study_id, deepcopy=False):
                if t.number == number or t.user_attrs.get("layout") != label:
                    continue
                if t.user_attrs.get("outcome") in RAN:
                    return t
                if t.state == TrialState.RUNNING and "predicted_step_s" in t.user_attrs:
                    running = True
            if not running or time.monotonic() > deadline:
                return None
            time.sleep(1.0)

    def _repeat(self, trial: Any, prior: Any, tag: str) -> None:
        ua = prior.user_attrs
        for k in ("measured_step_s", "measured_tokens_per_s", "measured_mem_gib"):
            if ua.get(k) is not None:
                trial.set_user_attr(k, ua[k])
        trial.set_user_attr("repeat_of", prior.number)
        what = (f"measured {ua['measured_tokens_per_s']:,.0f} tokens/s" if ua.get("outcome") == MEASURED
                else f"failed: {ua.get('reason')}")
        self._not_run(trial, REPEAT, f"same layout as trial #{prior.number} ({what})", tag)

    def _not_run(self, trial: Any, outcome: str, reason: str, tag: str) -> None:
        """Record a trial that does not run and put a fresh WAITING trial in its place (budget = real runs)."""
        from optuna.trial import TrialState
        self._not_run_streak += 1
        with storage_lock(self.target), _no_sigint():
            c = self._counts()
            if c.not_run < self.max_not_run:
                self.study.enqueue_trial({})
            elif c.not_run == self.max_not_run:
                self.notes.append(f"{self.max_not_run} proposals could not run or repeated a layout already run; "
                                  "no more replacements are queued")
            trial.set_user_attr("reason", reason)
            trial.set_user_attr("outcome", outcome)
            self.study.tell(trial, state=TrialState.PRUNED)
        if outcome == SKIPPED:
            self.say(f"    proposal{' (' + tag + ')' if tag else ''} {trial.user_attrs.get('layout', '')}: not run, "
                     f"{reason}")

    def _interrupt(self, trial: Any, reason: str) -> None:
        from optuna.trial import TrialState
        try:
            trial.set_user_attr("outcome", INTERRUPTED)
            trial.set_user_attr("reason", reason)
            self.study.enqueue_trial(dict(trial.params), user_attrs=_seed_attr(trial.user_attrs))
            self.study.tell(trial, state=TrialState.FAIL)
        except Exception:          # the storage itself is the problem; the next worker re-queues the trial
            pass

    def _best_so_far(self) -> tuple[int | None, float | None]:
        best: tuple[int | None, float | None] = (None, None)
        for t in self.storage.get_all_trials(self.study_id, deepcopy=False):
            v = t.user_attrs.get("measured_tokens_per_s") if t.user_attrs.get("outcome") == MEASURED else None
            if v is not None and (best[1] is None or v > best[1]):
                best = (t.number, v)
        return best

    # ---- reading the study back ------------------------------------------------------------------------
    def progress_line(self) -> str:
        c = self._counts()
        best = self._best_so_far()
        return (f"study '{self.name}' in {self.target.display}: {c.ran} of "
                f"{int(self.storage.get_study_user_attrs(self.study_id).get(ATTR_BUDGET, self.s.trials))} trial(s) "
                f"run, {c.waiting} queued; best {_fmt_rate(best[1])} tokens/s"
                + (f" (trial #{best[0]})" if best[0] is not None else ""))

    def result(self) -> TuneResult:
        from optuna.trial import TrialState
        records = []
        for t in self.storage.get_all_trials(self.study_id, deepcopy=False):
            if t.state == TrialState.WAITING:
                continue
            ua = t.user_attrs
            outcome, reason = ua.get("outcome"), ua.get("reason")
            if outcome is None and t.state == TrialState.FAIL:   # failed by Optuna's heartbeat check
                outcome, reason = INTERRUPTED, "interrupted: its worker's heartbeat stopped; queued again"
            records.append(TrialRecord(
                number=t.number, state=t.state.name, outcome=outcome, params=dict(t.params),
                layout=ua.get("layout"), seeded=ua.get("seed_rank"), predicted_step_s=ua.get("predicted_step_s"),
                predicted_tokens_per_s=ua.get("predicted_tokens_per_s"), predicted_mem_gib=ua.get("predicted_mem_gib"),
                measured_step_s=ua.get("measured_step_s") if ua.get("outcome") == MEASURED else None,
                measured_tokens_per_s=ua.get("measured_tokens_per_s") if ua.get("outcome") == MEASURED else None,
                measured_mem_gib=ua.get("measured_mem_gib") if ua.get("outcome") == MEASURED else None,
                reason=reason, repeat_of=ua.get("repeat_of"), remeasure_of=ua.get("confirm_of"),
                wall_s=ua.get("wall_s"),
                worker=ua.get("worker")))
        measured = [r for r in records if r.outcome == MEASURED]
        best_rec = max(measured, key=lambda r: (r.measured_tokens_per_s, -r.number), default=None)
        best_plan = None
        if best_rec is not None:
            lay = resolve_layout(self.space.layout(best_rec.params, self.p.gpus), self.p.model, self.p.training,
                                 self.p.gpus)
            best_plan = Plan(1, self.est.estimate(lay, resolved=True), "measured")
        predicted = None
        if self.space.seeds:     # the solver's best layout, by its fastest run
            first = next((r for r in records if r.params == self.space.seeds[0] and r.outcome == MEASURED), None)
            if first is not None:
                predicted = max((r for r in measured if r.layout == first.layout),
                                key=lambda r: (r.measured_tokens_per_s, -r.number))
        budget = int(self.storage.get_study_user_attrs(self.study_id).get(ATTR_BUDGET, self.s.trials))
        return TuneResult(self.name, self.target.display, self.p.model, self.p.hardware, self.p.training, self.p.gpus,
                          best_plan, best_rec, records, budget, self.space_size, len(self.runnable),
                          [s.label(self.p.gpus) for s in self.space.structures], predicted,
                          time.monotonic() - self.t0, list(self.p.notes) + self.notes)


def _seed_attr(user_attrs: dict) -> dict | None:
    """The attributes a trial queued again keeps: its seed rank, or that it re-measures a runner-up."""
    keep = {k: user_attrs[k] for k in ("seed_rank", "confirm", "confirm_layout", "confirm_of") if k in user_attrs}
    return keep or None


def _options_dict(p: Problem) -> dict:
    return {k: v for k, v in p.options.__dict__.items() if k not in ("time_limit_s", "workers")}
