"""`autopar solve`: the best layout first (speed, memory headroom, time and cost to train, launch settings), then
the ranked layouts that fit; the rules-of-thumb reasoning and the breakdown under --explain."""

from __future__ import annotations

import argparse
from pathlib import Path

from autopar.cli.common import (SCHEMA_VERSION, add_emit_args, add_problem_args, add_search_args, count, dump_json,
                                fraction, interval_line, load_problem, prediction_intervals, search_options)
from autopar.cost.legend import APPROX_NOTE
from autopar.defaults import MEMORY_MARGIN_SOURCE
from autopar.errors import AutoparInputError


def _budget_cells(budget) -> list[str]:
    cells = [f"{budget.days:,.1f}", f"{budget.gpu_hours:,.0f}"]
    if budget.cost is not None:
        cells.append(f"{budget.cost:,.0f}")
    return cells


def _console(stderr: bool = False):
    """The rich console (imported here: `solve --json` never needs rich, and importing it costs 20 ms)."""
    from autopar.cli.render import console
    return console(stderr=stderr)


def _search(args, model, hw, training, opts, err):
    """Solve at one GPU count, or at each count of a range and keep the one the objective prefers."""
    from autopar.search import solve
    from autopar.search.budget import gpu_counts, parse_gpu_range

    lo, hi = parse_gpu_range(str(args.gpus))
    progress = None if args.json else (lambda m: err.print(f"[dim]… {m}[/dim]"))
    if lo == hi:
        return lo, solve(model, hw, training, lo, opts, method=args.search, progress=progress), []
    rows = []
    for n in gpu_counts(lo, hi):
        err.print(f"[dim]… {n} GPUs[/dim]") if not args.json else None
        res = solve(model, hw, training, n, opts, method=args.search)
        if res.plans:
            rows.append((n, res, _budget(args, res.plans[0])))
        else:
            rows.append((n, res, None))
    fitting = [r for r in rows if r[2] is not None]
    if not fitting:
        return hi, rows[-1][1], rows
    score = _objective(args)
    best = min(fitting, key=lambda r: score(r[2]))
    return best[0], best[1], rows


def _objective(args):
    """What --objective minimises, from a plan's :func:`autopar.search.budget.training_budget`: wall time to train, or
    GPU-hours (time x GPUs). The GPU-count sweep and the stack-knob search rank by this same key."""
    return (lambda b: b.seconds) if args.objective == "time" else (lambda b: b.gpu_hours)


def _budget(args, plan):
    """The training budget of ``plan`` that :func:`_objective` scores (the token count does not change the choice)."""
    from autopar.search.budget import training_budget
    return training_budget(plan.estimate, args.tokens or 1e12, args.gpu_hour_price or 1.0)


def _search_knobs(args, model, hw, training, opts, err):
    """:func:`_search` for each setting of the stack's free knobs (``free`` in the stack file, less the ones --knobs
    fixes), keeping the setting whose best plan --objective prefers (:func:`_objective`, as the GPU-count sweep
    ranks); the chosen knobs go to args.stack_knobs (what the output and --emit report). Returns :func:`_search`'s
    (gpus, result, sweep) and then the TrainingSpec with the chosen knobs' switches and whether there was a choice
    to make."""
    from autopar.specs.stack import parse_knobs
    choices = args.stack_spec.knob_choices(parse_knobs(args.knobs or ""))
    if len(choices) <= 1:
        return (*_search(args, model, hw, training, opts, err), training, False)
    best, score = None, _objective(args)
    for knobs in choices:
        if err is not None:
            err.print("[dim]… stack knobs " + ", ".join(f"{k}={getattr(knobs, k)}" for k in args.stack_spec.free)
                      + "[/dim]")
        tr = training.model_copy(update=knobs.training_fields())
        found = _search(args, model, hw, tr, opts, err)
        plans = found[1].plans
        key = score(_budget(args, plans[0])) if plans else float("inf")
        if best is None or key < best[0]:
            best = (key, knobs, tr, found)
    args.stack_knobs = best[1]
    return (*best[3], best[2], True)


def _reasons(refused: dict[str, list[str]]) -> str:
    return "; ".join(f"{', '.join(ranks)}: {why}" for why, ranks in refused.items())


def _emitted(args, res, model, training, gpus, hw) -> dict:
    """The --emit settings for the fastest ranked layout the launcher can run (it may refuse a layout autopar's
    model allows, e.g. Megatron-Bridge's hybrid provider and virtual stages): {"target", "plan_rank" (None when
    none), "text", "refusal" (the model itself is refused), "refused" (reason -> ranks)}. The text output and
    --json both print this."""
    from autopar.emit import emit, emit_refusal
    out = {"target": args.emit, "plan_rank": None, "text": None, "refusal": emit_refusal(args.emit, model),
           "refused": {}}
    if out["refusal"]:
        return out
    for plan in res.plans:
        try:
            out["text"] = emit(args.emit, plan.layout, model, training, gpus, hw,
                               torchtitan_version=args.torchtitan_version)
        except AutoparInputError as why:
            out["refused"].setdefault(str(why), []).append(f"#{plan.rank}")
            continue
        out["plan_rank"] = plan.rank
        break
    return out


def run(args: argparse.Namespace) -> int:
    from autopar.cost import Estimator
    from autopar.search.advice import advise
    from autopar.search.budget import batch_advice, parse_tokens, training_budget

    model, hw, training, notes = load_problem(args)
    opts = search_options(args, top_k=args.top_k, offload_activations=args.offload_activations)
    if args.offload_activations and args.emit in ("megatron", "bridge"):
        # Megatron-Core offloads activations only without full recompute (docs/launchers.md): search what it can run
        rc = [r for r in (opts.recompute or ["none", "selective", "full"]) if r.strip() != "full"]
        if not rc:
            raise AutoparInputError("--offload-activations with --emit megatron/bridge: Megatron-Core cannot offload "
                                    "under full recompute, and --recompute allows only full")
        if len(rc) < len(opts.recompute or [0, 0, 0]):
            notes.append("full recompute left out of the search: Megatron-Core cannot offload activations under it")
        opts.recompute = rc
    if args.emit == "bridge" and model.is_hybrid and (opts.vpp or [2]) != [1]:
        # Megatron-Bridge's HybridModelProvider runs no virtual pipeline stages (docs/launchers.md)
        if opts.vpp and 1 not in opts.vpp:
            raise AutoparInputError("--vpp with --emit bridge on a hybrid model: Megatron-Bridge's HybridModelProvider "
                                    "runs no virtual pipeline stages; allow --vpp 1")
        opts.vpp = [1]
        notes.append("virtual pipeline stages left out of the search: Megatron-Bridge's hybrid provider has none")
    tokens = parse_tokens(args.tokens) if args.tokens else None
    args.tokens = tokens
    if args.gpu_hour_price is not None and args.gpu_hour_price <= 0:
        raise AutoparInputError(f"--gpu-hour-price must be positive, got {args.gpu_hour_price}")
    if args.report:
        from autopar.fileio import check_output_dir
        from autopar.report import report_paths, write_report
        check_output_dir(Path(args.report).parent, "--report")
    if args.report and not args.overwrite:   # refuse before a long search, not after
        for f in report_paths(args.report):
            if f.exists():
                raise AutoparInputError(f"{f} already exists; not overwriting it (pass --overwrite)")
    err = None if args.json else _console(stderr=True)
    gpus, res, sweep, training, chose = _search_knobs(args, model, hw, training, opts, err)
    if chose:   # training carries the free knobs' chosen setting
        res.notes.append("stack knobs chosen with the layout: " + ", ".join(
            f"{k}={getattr(args.stack_knobs, k)}" for k in args.stack_spec.free))
    res.notes = notes + res.notes
    best = res.plans[0] if res.plans else None
    if best:   # what the cost model approximates for this model or layout, said without --explain too
        res.notes += [n for n in best.estimate.notes if n not in res.notes]
    advice = (advise(res.estimator or Estimator(model, hw, training, gpus), best.estimate, max_items=5,
                     allow_cross_domain=opts.allow_cross_domain, memory_margin=res.memory_margin) if best else [])
    batch = batch_advice(model, hw, training, gpus, best.estimate) if best else None
    budgets = ({p.rank: training_budget(p.estimate, tokens, args.gpu_hour_price) for p in res.plans}
               if tokens else {})
    if args.report:
        written = write_report(res, model, hw, training, gpus, Path(args.report), advice=advice,
                               overwrite=args.overwrite)
        (err or _console(stderr=True)).print("report: " + ", ".join(map(str, written)))
    if args.json:
        d = {"schema_version": SCHEMA_VERSION, "gpus": gpus, **res.to_dict()}
        d["advice"] = advice
        d["batch_warning"] = batch.message(training.seq_len, gpus) if batch else None
        d["interval"] = (prediction_intervals(model, hw, args.stack_spec.name, best.estimate) or None) if best else None
        d["stack"] = {"name": args.stack_spec.name, **args.stack_knobs.model_dump()}
        if tokens:
            for p in d["plans"]:
                p["budget"] = budgets[p["rank"]].to_dict()
        if args.emit:
            d["emit"] = _emitted(args, res, model, training, gpus, hw)
        if sweep:
            d["gpu_sweep"] = [{"gpus": n, "fits": b is not None, "step_time_s": r.plans[0].estimate.step_time_s
                               if r.plans else None, "gpu_hours_per_1e12_tokens": b.gpu_hours / (tokens or 1e12)
                               * 1e12 if b else None} for n, r, b in sweep]
        print(dump_json(d))
        return 0 if res.plans else 1
    from autopar.cli.render import fitted_table, header, print_estimate
    out = _console()
    out.print(header(model, hw, training, gpus))
    if not res.plans:
        out.print("[red bold]No layout fits.[/red bold]")
        for line in res.explanation:
            out.print(line)
        return 1
    e = best.estimate
    # The answer first: the layout, its speed, its memory headroom, what the run costs.
    free = e.hbm_gib - e.memory_gib.total
    out.print(f"\n[bold]Best layout: {best.layout.short()}[/bold]")
    out.print(f"  {e.step_time_s:.3f} s/step, {e.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, MFU {e.mfu:.1%}; "
              f"memory {e.memory_gib.total:.1f} of {e.hbm_gib:.1f} GiB per GPU ({free:.1f} GiB free, "
              f"{free / e.hbm_gib:.0%} headroom)")
    out.print(f"  memory margin {res.memory_margin:.1%} of HBM kept free beyond the prediction ("
              + getattr(args, "memory_margin_source", MEMORY_MARGIN_SOURCE) + ")")
    if tokens:
        b = budgets[best.rank]
        out.print(f"  {tokens / 1e12:g}T tokens: {b.days:,.1f} days on {gpus} GPUs, {b.gpu_hours:,.0f} GPU-hours"
                  + (f", {b.cost:,.0f} at {args.gpu_hour_price:g} per GPU-hour" if b.cost is not None else "")
                  + " (predicted throughput; restarts and evaluation not counted)")
    if sweep:
        cells = ", ".join(f"{n}: {'no fit' if b is None else f'{r.plans[0].estimate.step_time_s:.2f} s/step'}"
                          for n, r, b in sweep)
        out.print(f"  GPU count {gpus} chosen for the lowest {'time' if args.objective == 'time' else 'cost'} "
                  f"to train among {cells}")
    iv = prediction_intervals(model, hw, args.stack_spec.name, e)
    out.print("  " + interval_line(iv))
    used = e.memory_gib.total / e.hbm_gib
    # The memory margin: the upper end of the memory interval (how far under published runs' measured peaks the
    # memory model has fallen) must stay inside HBM; without an interval, 5% headroom.
    mem_hi = iv.get("memory_gib", {}).get("high")
    if (mem_hi is not None and mem_hi > e.hbm_gib) or (mem_hi is None and used > 0.95):
        roomy = next((p for p in res.plans if p.estimate.memory_gib.total / p.estimate.hbm_gib <= 0.9), None)
        alt = (f"#{roomy.rank} leaves {1 - roomy.estimate.memory_gib.total / roomy.estimate.hbm_gib:.0%} free at "
               f"{roomy.estimate.step_time_s / e.step_time_s - 1:+.1%} step time" if roomy else
               "no listed layout leaves 10% free; see 'What to try next' for memory savings")
        out.print(f"[yellow]note: #1 uses {used:.0%} of HBM"
                  + (f" and the upper end of its memory interval, {mem_hi:.1f} GiB, is beyond it" if mem_hi else "")
                  + "; the memory model is approximate "
                  f"(autopar validate), so check it with a short run (autopar profile run) or pick more headroom: "
                  f"{alt}[/yellow]")
    if batch:
        out.print(f"[yellow]warning: {batch.message(training.seq_len, gpus)}[/yellow]")
    if args.emit:
        out.print(f"\n[bold]{args.emit} settings[/bold]")
        em = _emitted(args, res, model, training, gpus, hw)
        if em["refusal"]:   # the model, not the layout: a note, and the table still prints
            out.print(f"[yellow]note: no {args.emit} settings: {em['refusal']}[/yellow]")
        elif em["text"] is None:
            out.print(f"[yellow]note: no {args.emit} settings: it refuses every ranked layout: "
                      f"{_reasons(em['refused'])}[/yellow]")
        else:
            if em["refused"]:
                out.print(f"[yellow]note: {args.emit} settings for #{em['plan_rank']}, the fastest layout it can "
                          f"run; refused: {_reasons(em['refused'])}[/yellow]")
            from autopar.cli.render import wrap_comments
            print(wrap_comments(em["text"], out.width), end="")
    headers = ["#", "layout", "step s", "tok/s/GPU", "MFU", "mem GiB", "W+G+O", "act", "compute", "tp", "cp",
               "ep", "dp", "bubble", "bottleneck"]
    if tokens:
        headers[5:5] = ["days", "GPU-h"] + (["cost"] if args.gpu_hour_price else [])
    rows = []
    for p in res.plans:
        pe, m, ts = p.estimate, p.estimate.memory_gib, p.estimate.time_s
        row = [str(p.rank), p.layout.short(), f"{pe.step_time_s:.3f}", f"{pe.tokens_per_s_per_gpu:,.0f}",
               f"{pe.mfu:.1%}", f"{m.total:.1f}", f"{m.weights + m.grads + m.optimizer:.1f}", f"{m.activations:.1f}",
               f"{ts.compute:.2f}", f"{ts.tp:.2f}", f"{ts.cp:.2f}", f"{ts.ep:.2f}", f"{ts.dp:.2f}",
               f"{ts.pp_bubble:.2f}", pe.bottleneck]
        if tokens:
            row[5:5] = _budget_cells(budgets[p.rank])
        rows.append(row)
    out.print()
    out.print(*fitted_table(out.width, "Fastest layouts that fit (predicted; GiB per GPU, s per step)", headers, rows,
                            left=("layout", "bottleneck"),
                            optional=("mem GiB", "days", "MFU", "tok/s/GPU", "GPU-h", "cost", "W+G+O", "act",
                                      "compute", "tp", "cp", "ep", "dp", "bubble", "bottleneck")))
    out.print("[dim]layout: TPn PPn(vV virtual stages) CP/EP/ETP degrees, DP data-parallel, SP sequence parallel, "
              "Z ZeRO stage (FSDP = ZeRO-3), mbs micro-batch, GA gradient accumulation, rc recompute, "
              "layers = transformer layers per pipeline stage[/dim]")
    out.print("[dim]columns: mem = predicted peak GiB per GPU, W+G+O its weights + gradients + optimizer state, act its "
              "activations; compute, tp, cp, ep, dp, bubble = seconds of the step (exposed communication only)[/dim]")
    out.print(f"[dim]search: {res.method}, {res.status_text()}, {res.solve_s:.2f} s, "
              f"space {res.space_size:,} layouts over {res.meshes} meshes[/dim]")
    for n in res.notes:
        out.print(f"[dim]note: {n}[/dim]")
    if res.heuristic:
        h = res.heuristic.estimate
        verdict = (f"fits; autopar's best is predicted {h.step_time_s / e.step_time_s:.2f}x as fast" if h.fits else
                   f"does not fit ({h.memory_gib.total:.1f} of {h.hbm_gib:.1f} GiB)")
        out.print(f"Rules-of-thumb starting point: {res.heuristic.layout.short()} — {verdict}"
                  + ("." if args.explain else " (--explain shows its rules)."))
        if args.explain:
            for r in res.heuristic_reasons:
                out.print(f"  [dim]rule: {r}[/dim]")
    if advice:
        out.print("\n[bold]What to try next[/bold]")
        for a in advice:
            out.print(f"  • {a}")
    if args.explain:
        out.print("\n[bold]Best layout in detail[/bold]")
        print_estimate(e, model, hw, training, out)
    else:
        out.print(f"[dim]{APPROX_NOTE} --explain shows the memory and step-time breakdown.[/dim]")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("solve", help="find the fastest layouts that fit (CP-SAT)",
                       description="Find the fastest parallel layouts that fit in HBM with an OR-Tools CP-SAT model "
                                   "over the analytical cost model. Defaults: hardware h100_sxm, seq 4096, bf16, "
                                   "global batch by model size. " + APPROX_NOTE)
    add_problem_args(p, gpus_range=True, cluster=True)
    g = add_search_args(p, "pins and ranges (comma lists)", time_limit_default=60.0)
    g.add_argument("--offload-activations", type=fraction, nargs="?", const=1.0, default=0.0, metavar="FRACTION",
                   help="every layout sends this fraction of its stored activations to host memory (alone: 1 = all; "
                        "default: 0; not searched)")
    p.add_argument("--search", choices=("cpsat", "exhaustive", "heuristic"), default="cpsat",
                   help="cpsat (default), exhaustive (reference enumeration), heuristic (rules of thumb)")
    p.add_argument("--top-k", type=count("top_k"), default=5, help="layouts to list (default: 5)")
    add_emit_args(p, "the best layout")
    p.add_argument("--report", metavar="OUT.md", default=None,
                   help="write a Markdown analysis with OUT_memory.png and OUT_pareto.png beside it")
    p.add_argument("--overwrite", action="store_true", help="replace an existing report and its figures")
    p.add_argument("--json", action="store_true", help="print the result as JSON (with schema_version)")
    p.add_argument("--explain", action="store_true",
                   help="also print the rules-of-thumb reasoning and the best layout's memory and time breakdown")
    b = p.add_argument_group("time and cost to train")
    b.add_argument("--tokens", default=None, metavar="N", help="tokens to train on, e.g. 15T or 300B: prints days and "
                   "GPU-hours per plan")
    b.add_argument("--gpu-hour-price", type=float, default=None, metavar="PRICE",
                   help="price of one GPU-hour: adds the cost of training --tokens")
    b.add_argument("--objective", choices=("time", "cost"), default="time",
                   help="with --gpus A-B: the GPU count that trains fastest (time) or with the fewest GPU-hours "
                        "(cost; the price is the same for every count) (default: time)")
    p.set_defaults(func=run)
