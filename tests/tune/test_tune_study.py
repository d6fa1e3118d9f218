"""The study's bookkeeping, with a runner that answers at once (real runs are in test_tune_workers.py and
test_tune_finds_best.py): the budget, the seeds, the memory constraint, failures, resume, Ctrl-C, other studies."""

from __future__ import annotations

import json
import socket

import optuna
import pytest
from optuna.trial import TrialState

from autopar.cost import Estimator
from autopar.errors import AutoparInputError
from autopar.specs import ModelSpec, TrainingSpec
from autopar.specs.loaders import load_hardware
from autopar.tune import TuneInterrupted, format_summary, plan_document, read_plan_document, tune
from autopar.tune._space import TuneSpace
from autopar.tune._study import ATTR_SPACE

from .conftest import CPU_TRAIN, FAST, TINY, BookRunner


def _tune(runner, storage, trials, **kw):
    kw.setdefault("study", "s")
    return tune(kw.pop("model", TINY), kw.pop("hardware", "h100_sxm"), kw.pop("training", CPU_TRAIN),
                kw.pop("gpus", 2), kw.pop("options", FAST), trials=trials, storage=storage, backend="gloo",
                runner=runner, progress=lambda m: None, **kw)


def _trials(storage, study="s"):
    return optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)


def test_budget_is_real_runs_and_the_solver_seeds_come_first(sqlite_url):
    r = BookRunner()
    res = _tune(r, sqlite_url, 6, seeds=3, confirm=0)
    assert len(r.calls) == 6 == res.runs == res.budget
    space = TuneSpace.from_dict(optuna.load_study(study_name="s", storage=sqlite_url).user_attrs[ATTR_SPACE])
    assert [lay.model_dump() for lay in r.calls[:3]] == [
        lay.model_dump() for lay in (r_ for r_ in (_resolved(space, p) for p in space.seeds[:3]))]
    ran = [x.layout for x in res.records if x.ran]
    assert len(ran) == len(set(ran)) == 6                   # a layout already run is never run again
    assert [x.seeded for x in res.records if x.seeded] == [1, 2, 3]
    best = max((x for x in res.records if x.outcome == "measured"), key=lambda x: x.measured_tokens_per_s)
    assert res.best_trial.number == best.number and res.best.layout.short() == best.layout
    assert res.best.source == "measured"


def _resolved(space, params):
    from autopar.specs.layout import resolve_layout
    return resolve_layout(space.layout(params, 2), TINY, CPU_TRAIN, 2)


def test_layouts_predicted_not_to_fit_are_never_run(sqlite_url):
    mid = ModelSpec(name="mid", num_layers=8, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=16,
                    vocab_size=32000)
    tr = TrainingSpec(seq_len=4096, global_batch=16)
    hw = load_hardware("h100_sxm").model_copy(update={"name": "small_hbm", "hbm_gib": 12.0})
    r = BookRunner()
    res = _tune(r, sqlite_url, 8, model=mid, training=tr, hardware=hw, seeds=2, scale=None)
    est = Estimator(mid, hw, tr, 2)
    assert len(r.calls) == 8 and all(est.estimate(lay).fits for lay in r.calls)
    assert 0 < res.space_runnable < res.space_size
    oom = [t for t in _trials(sqlite_url) if t.user_attrs.get("outcome") == "skipped"]
    for t in oom:
        assert t.user_attrs["reason"].startswith("predicted OOM") and t.constraints["memory_gib_over_hbm"] > 0
    ran = [t for t in _trials(sqlite_url) if t.user_attrs.get("outcome") == "measured"]
    assert all(t.constraints["memory_gib_over_hbm"] <= 0 for t in ran)


def test_failed_runs_are_recorded_with_their_reason_and_the_study_goes_on(sqlite_url):
    def fail(lay):
        if lay.micro_batch == 4:
            return "oom"
        if lay.tp == 2:
            return "crash: RuntimeError: boom"
        return None
    r = BookRunner(fail=fail)
    res = _tune(r, sqlite_url, 8, seeds=4)
    failed = [x for x in res.records if x.outcome == "failed"]
    assert failed and res.runs == 8 and len(r.calls) == 8
    assert {x.reason for x in failed} <= {"oom", "crash: RuntimeError: boom"}
    assert res.best is not None and res.best.layout.micro_batch != 4
    by_number = {t.number: t for t in _trials(sqlite_url)}
    for x in failed:
        t = by_number[x.number]
        assert t.state == TrialState.PRUNED and t.user_attrs["reason"] == x.reason
        assert (t.constraints.get("run_oom", 0) > 0) == (x.reason == "oom")


def test_rerunning_resumes_and_a_larger_budget_extends(sqlite_url):
    first = _tune(BookRunner(), sqlite_url, 3)
    again = BookRunner()
    same = _tune(again, sqlite_url, 3)
    assert again.calls == [] and [x.to_dict() for x in same.records] == [x.to_dict() for x in first.records]
    more = BookRunner()
    bigger = _tune(more, sqlite_url, 5)
    assert len(more.calls) == 2 and bigger.runs == 5 and bigger.budget == 5
    kept = {x.number: x.to_dict() for x in bigger.records}
    assert all(kept[x.number] == x.to_dict() for x in first.records)


def test_ctrl_c_keeps_the_study_and_the_same_call_resumes_it(sqlite_url):
    with pytest.raises(TuneInterrupted, match=r"study 's' in sqlite:///.*: 1 of 4 trial\(s\) run"):
        _tune(BookRunner(interrupt_at=2), sqlite_url, 4)
    trials = _trials(sqlite_url)
    stopped = [t for t in trials if t.user_attrs.get("outcome") == "interrupted"]
    assert len(stopped) == 1 and stopped[0].state == TrialState.FAIL
    queued = [t for t in trials if t.state == TrialState.WAITING]
    assert any(t.system_attrs.get("fixed_params") == stopped[0].params for t in queued)
    r = BookRunner()
    res = _tune(r, sqlite_url, 4)
    assert res.runs == 4 and len(r.calls) == 3
    assert r.calls[0].short() == stopped[0].user_attrs["layout"]      # the interrupted layout runs first


def test_a_trial_left_running_by_a_dead_worker_is_queued_again(sqlite_url):
    _tune(BookRunner(), sqlite_url, 2)
    study = optuna.load_study(study_name="s", storage=sqlite_url)
    study.enqueue_trial({"layout": 0, "mbs": 2})
    t = study.ask()                                       # takes the queued trial, as a worker would
    t.set_user_attr("worker", f"{socket.gethostname()}:999999999:1")
    r = BookRunner()
    res = _tune(r, sqlite_url, 3)
    assert len(r.calls) == 1 and r.calls[0].micro_batch == 2 and res.runs == 3
    gone = next(x for x in res.records if x.number == t.number)
    assert gone.outcome == "interrupted" and "its worker is gone" in gone.reason


def test_a_study_of_another_model_is_refused(sqlite_url):
    _tune(BookRunner(), sqlite_url, 1)
    other = TINY.model_copy(update={"name": "other", "hidden_size": 32})
    with pytest.raises(AutoparInputError, match=r"study 's' in sqlite:///.* belongs to another problem: model tiny "
                                                r"\(study\) vs other \(here\)"):
        _tune(BookRunner(), sqlite_url, 1, model=other)
    with pytest.raises(AutoparInputError, match=r"gpus 2 \(study\) vs 4 \(here\)"):
        _tune(BookRunner(), sqlite_url, 1, gpus=4)


def test_a_study_not_made_by_autopar_is_refused(sqlite_url):
    optuna.create_study(storage=sqlite_url, study_name="foreign")
    with pytest.raises(AutoparInputError, match="was not made by autopar tune"):
        _tune(BookRunner(), sqlite_url, 1, study="foreign")


def test_journal_file_storage(tmp_path):
    url = f"journal:{tmp_path / 'tune.log'}"
    assert _tune(BookRunner(), url, 3).runs == 3
    r = BookRunner()
    assert _tune(r, url, 4).runs == 4 and len(r.calls) == 1


def test_the_winning_plan_document_round_trips(sqlite_url):
    res = _tune(BookRunner(), sqlite_url, 3)
    doc = json.loads(json.dumps(plan_document(res)))
    plan, model, training, gpus = read_plan_document(doc)
    assert plan.layout == res.best.layout and model == TINY and training == CPU_TRAIN and gpus == 2
    assert doc["measured"]["measured_tokens_per_s"] == res.best_trial.measured_tokens_per_s
    json.dumps(res.to_dict())


@pytest.mark.parametrize("kw, needle", [
    ({"trials": 0}, "trials must be"), ({"steps": 2, "warmup": 2}, "warmup"), ({"gpus": 0}, "gpus must be"),
    ({"storage": "nope://x"}, "unknown storage URL"),
])
def test_bad_arguments(kw, needle, sqlite_url):
    kw = {"storage": sqlite_url, "trials": 2, **kw}
    with pytest.raises(AutoparInputError, match=needle):
        _tune(BookRunner(), kw.pop("storage"), kw.pop("trials"), **kw)


def test_the_package_is_callable_as_autopar_tune(sqlite_url):
    import autopar
    import autopar.tune
    res = autopar.tune(TINY, "h100_sxm", CPU_TRAIN, 2, FAST, trials=2, storage=sqlite_url, backend="gloo",
                       runner=BookRunner(), progress=lambda m: None)
    assert res.runs == 2 and callable(autopar.tune) and autopar.tune.tune is not None


def test_the_last_trials_re_measure_a_runner_up_that_a_busy_machine_slowed_down(sqlite_url):
    from autopar.search.space import SearchOptions

    class Busy(BookRunner):             # the first run of the pipeline layout meets a busy machine
        def __call__(self, model, layout, training, **kw):
            res = super().__call__(model, layout, training, **kw)
            if layout.pp == 2 and sum(c.pp == 2 for c in self.calls) == 1:
                res.step_time_s *= 2.0
                res.tokens_per_s /= 2.0
            return res

    opts = SearchOptions(time_limit_s=10, cp=[1], mbs=[4], recompute=["none"], zero=[1], vpp=[1])
    r = Busy()
    res = _tune(r, sqlite_url, 4, options=opts, seeds=3, confirm=1)
    assert res.space_size == 3 and len(r.calls) == 4 == res.runs
    assert [c.pp for c in r.calls].count(2) == 2                     # the runner-up (pp2) was measured again
    again = next(x for x in res.records if x.remeasure_of is not None)
    assert again.layout == res.best_trial.layout and res.best.layout.pp == 2
    assert "fastest of its 2 runs" in format_summary(res)


def test_a_proposal_not_run_gets_no_run_number(sqlite_url):
    """Issue 22 #14: the trials table numbered a skipped repeat as a trial. Runs are numbered 1..runs in order; a
    repeat shows '-' and names the run it repeats; every line fits the width asked for."""
    from autopar.tune._report import format_trials, run_numbers
    res = _tune(BookRunner(), sqlite_url, 12, seeds=3, confirm=0)
    repeats = [r for r in res.records if r.outcome == "repeat"]
    assert repeats, "seed 0 proposes a repeat within 12 runs with this runner"
    runs = run_numbers(res.records)
    assert sorted(runs.values()) == list(range(1, res.runs + 1))
    for width in (None, 80, 40):
        text = format_trials(res, width)
        if width:
            assert all(len(ln) <= width for ln in text.splitlines())
    table = format_trials(res, 200).splitlines()
    for r in repeats:
        row = next(ln for ln in table if r.layout in ln and "not run" in ln)
        assert row.split()[0] == "-" and f"repeat of run {runs[r.repeat_of]}" in row
        assert res.records[[x.number for x in res.records].index(r.repeat_of)].layout == r.layout
    assert [ln.split()[0] for ln in table[1:] if ln.split()[0].isdigit()] == [str(i) for i in range(1, 13)]
