"""Plain-text report of a tuning study: predicted vs measured for every trial, then the winner."""

from __future__ import annotations

import math

from autopar.measure.record import rank_agreement
from autopar.tune._result import FAILED, INTERRUPTED, MEASURED, REPEAT, SKIPPED, TrialRecord, TuneResult


def _f(v: float | None, spec: str) -> str:
    return format(v, spec) if v is not None and math.isfinite(v) else "-"


def run_numbers(records: list[TrialRecord]) -> dict[int, int]:
    """Study trial number -> run number (1, 2, ... in the study's order) of the trials that ran: the budget counts
    runs, so a proposal that was not run (a repeat, an invalid or predicted-OOM layout) gets no run number."""
    ran = sorted(r.number for r in records if r.ran)
    return {n: i + 1 for i, n in enumerate(ran)}


def _ref(number: int | None, runs: dict[int, int]) -> str:
    return f"run {runs[number]}" if number in runs else f"trial #{number}"


def _status(r: TrialRecord, runs: dict[int, int] | None = None) -> str:
    runs = runs or {}
    if r.outcome == MEASURED:
        return "measured" + (f" (re-measure of {_ref(r.remeasure_of, runs)})" if r.remeasure_of is not None else "")
    if r.outcome == FAILED:
        return f"FAILED: {r.reason}"
    if r.outcome == REPEAT:
        return f"not run: repeat of {_ref(r.repeat_of, runs)}"
    if r.outcome == SKIPPED:
        return f"not run: {r.reason}"
    if r.outcome == INTERRUPTED:
        return f"{r.reason} (queued again)"
    return r.state.lower()


# columns of the trials table, and the order in which a narrow terminal drops them (last first)
_OPTIONAL = ("seed", "pred GiB", "meas GiB", "pred tok/s", "meas tok/s", "err")


def format_trials(result: TuneResult, width: int | None = None) -> str:
    """One row per proposal: its run number (none for a proposal not run), predicted and measured step time,
    tokens/s and memory, and what happened. With ``width``, columns are dropped (a line names them) until the
    table fits; if even the required ones do not, each row prints as one record per line, wrapped at ``width``."""
    import textwrap
    runs = run_numbers(result.records)
    heads = ["run", "seed", "layout", "pred s", "meas s", "err", "pred tok/s", "meas tok/s", "pred GiB", "meas GiB",
             "result"]
    rows = [[str(runs[r.number]) if r.number in runs else "-", _f(r.seeded, "d") if r.seeded else "",
             r.layout or "", _f(r.predicted_step_s, ".4g"), _f(r.measured_step_s, ".4g"), _f(r.step_err, "+.0%"),
             _f(r.predicted_tokens_per_s, ",.0f"), _f(r.measured_tokens_per_s, ",.0f"),
             _f(r.predicted_mem_gib, ".2f"), _f(r.measured_mem_gib, ".3f"), _status(r, runs)]
            for r in result.records]
    cols = list(range(len(heads)))
    widths = [max([len(heads[i])] + [len(row[i]) for row in rows]) for i in cols]
    result_col = len(heads) - 1

    def need(cs: list[int]) -> int:   # the result column wraps under itself: count 12 characters of it
        return sum(min(widths[i], 12) if i == result_col else widths[i] for i in cs) + 2 * (len(cs) - 1)

    dropped = []
    for name in reversed(_OPTIONAL):
        if width is None or need(cols) <= width:
            break
        cols.remove(heads.index(name))
        dropped.append(name)
    if width is not None and need(cols) > width:
        lines = textwrap.wrap(f"trials (one record per row: too wide for a table at {width} columns)", width)
        for row in rows:
            text = "; ".join(f"{h} {v}" for h, v in zip(heads, row) if v not in ("", "-"))
            lines += textwrap.wrap(text, width=max(width, 20), subsequent_indent="  ", break_on_hyphens=False)
        return "\n".join(lines)

    def line(cells: list[str]) -> str:
        out = []
        for i in cols:
            c = cells[i]
            out.append(c.ljust(widths[i]) if heads[i] in ("layout", "result") else c.rjust(widths[i]))
        return "  ".join(out).rstrip()

    lines = [line(heads)]
    indent = sum(widths[i] + 2 for i in cols[:-1])
    for row in rows:
        text = line(row)
        if width is not None and len(text) > width:   # wrap the result column under itself
            first, *rest = textwrap.wrap(row[result_col], width=max(width - indent, 12), break_on_hyphens=False)
            text = line(row[:result_col] + [first]) + "".join("\n" + " " * indent + r for r in rest)
        lines.append(text)
    if dropped:
        lines += textwrap.wrap(f"not shown at {width} columns: {', '.join(reversed(dropped))} (--json shows them)",
                               width)
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
                 f"({_ref(b.number, run_numbers(recs))}" + (f"; fastest of its {n_runs} runs" if n_runs > 1 else "")
                 + ")")
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
