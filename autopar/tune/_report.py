"""Plain-text report of a tuning study: predicted vs measured for every trial, then the winner."""

from __future__ import annotations

import math

from autopar.measure.record import rank_agreement
from autopar.tune._result import FAILED, INTERRUPTED, MEASURED, REPEAT, SKIPPED, TrialRecord, TuneResult


def _f(v: float | None, spec: str) -> str:
    return format(v, spec) if v is not None and math.isfinite(v) else "-"


def _status(r: TrialRecord) -> str:
    if r.outcome == MEASURED:
        return "measured" + (f" (re-measure of #{r.remeasure_of})" if r.remeasure_of is not None else "")
    if r.outcome == FAILED:
        return f"FAILED: {r.reason}"
    if r.outcome == REPEAT:
        return f"repeat of #{r.repeat_of} (not run)"
    if r.outcome == SKIPPED:
        return f"not run: {r.reason}"
    if r.outcome == INTERRUPTED:
        return f"{r.reason} (queued again)"
    return r.state.lower()


def format_trials(result: TuneResult) -> str:
    """One row per trial: predicted and measured step time, tokens/s and memory, and what happened."""
    rows = result.records
    w = max([len(r.layout or "") for r in rows] + [6])
    head = (f"{'#':>3} {'seed':>4} {'layout':<{w}} {'pred s':>9} {'meas s':>9} {'err':>7} {'pred tok/s':>11} "
            f"{'meas tok/s':>11} {'pred GiB':>8} {'meas GiB':>8}  result")
    lines = [head]
    for r in rows:
        lines.append(f"{r.number:>3} {_f(r.seeded, 'd') if r.seeded else '':>4} {r.layout or '':<{w}} "
                     f"{_f(r.predicted_step_s, '9.4g')} {_f(r.measured_step_s, '9.4g')} {_f(r.step_err, '+7.0%')} "
                     f"{_f(r.predicted_tokens_per_s, '11,.0f')} {_f(r.measured_tokens_per_s, '11,.0f')} "
                     f"{_f(r.predicted_mem_gib, '8.2f')} {_f(r.measured_mem_gib, '8.3f')}  {_status(r)}")
    return "\n".join(lines)


def format_summary(result: TuneResult) -> str:
    """Runs used, space size, the winner against the solver's predicted best, rank agreement."""
    recs = result.records
    measured = [r for r in recs if r.outcome == MEASURED]
    failed = sum(r.outcome == FAILED for r in recs)
    not_run = {k: sum(r.outcome == k for r in recs) for k in (REPEAT, SKIPPED)}
    seeded = sum(bool(r.seeded) and r.ran for r in recs)
    again = sum(r.remeasure_of is not None and r.ran for r in recs)
    lines = [f"runs: {result.runs} of the study's {result.budget} ({len(measured)} measured, {failed} failed; "
             f"{seeded} seeded from the solver's ranking, {again} re-measuring runner-ups); proposals not run: "
             f"{not_run[REPEAT]} repeats, {not_run[SKIPPED]} invalid or predicted not to fit",
             f"space: {len(result.structures)} parallel structure(s) from the solver ({', '.join(result.structures)}) "
             f"x step knobs = {result.space_size} layouts, {result.space_runnable} valid and predicted to fit"]
    b = result.best_trial
    if b is None:
        lines.append("no layout was measured successfully yet")
        return "\n".join(lines)
    n_runs = sum(r.layout == b.layout for r in measured)
    lines.append(f"best measured: {b.layout} — {b.measured_tokens_per_s:,.0f} tokens/s, {b.measured_step_s:.4g} s/step "
                 f"(trial #{b.number}" + (f"; fastest of its {n_runs} runs" if n_runs > 1 else "") + ")")
    pb = result.predicted_best
    if pb is not None and pb.measured_tokens_per_s:
        gain = b.measured_tokens_per_s / pb.measured_tokens_per_s - 1
        lines.append(f"solver's predicted best: {pb.layout} — measured {pb.measured_tokens_per_s:,.0f} tokens/s; "
                     f"the tuned plan is {gain:+.1%} " + ("(the same layout)" if pb.number == b.number else "faster"))
    fastest: dict[str, TrialRecord] = {}
    for r in measured:          # each layout by its fastest run
        if r.layout not in fastest or r.measured_tokens_per_s > fastest[r.layout].measured_tokens_per_s:
            fastest[r.layout] = r
    if len(fastest) >= 2:
        rows = [r.comparison() for r in fastest.values()]
        tau = rank_agreement([r.predicted for r in rows], [r.measured for r in rows])
        if math.isfinite(tau):
            lines.append(f"rank agreement, predicted vs measured step time ({len(rows)} layouts): Kendall tau-b "
                         f"{tau:+.2f}")
    return "\n".join(lines)
