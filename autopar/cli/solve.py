"""`autopar solve`: the fastest layouts that fit, ranked, next to the rules-of-thumb baseline."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table

from autopar.cli.common import add_problem_args, dump_json, fraction, load_problem, parse_int_list, positive_int
from autopar.cli.render import APPROX_NOTE, console, header, print_estimate
from autopar.errors import AutoparInputError


def options_from_args(args: argparse.Namespace):
    from autopar.search import SearchOptions
    pins = {k: parse_int_list(getattr(args, k), f"--{k}") if getattr(args, k) else None
            for k in ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs")}
    if args.no_cp:
        pins["cp"] = [1]
    zero = [3] if args.fsdp else (parse_int_list(args.zero, "--zero") if args.zero else None)
    rc = [x.strip() for x in args.recompute.split(";")] if args.recompute else None
    return SearchOptions(**pins, zero=zero, recompute=rc, max_tp=args.max_tp, allow_cross_domain=args.allow_cross_domain,
                         top_k=args.top_k, time_limit_s=args.time_limit, sequence_parallel=False if args.no_sp else None,
                         offload_activations=args.offload_activations)


def run(args: argparse.Namespace) -> int:
    from autopar.cost import Estimator
    from autopar.search import solve
    from autopar.search.advice import advise

    model, hw, training, notes = load_problem(args)
    opts = options_from_args(args)
    if args.report:
        from autopar.report import report_paths, write_report
    if args.report and not args.overwrite:   # refuse before a long search, not after
        for f in report_paths(args.report):
            if f.exists():
                raise AutoparInputError(f"{f} already exists; not overwriting it (pass --overwrite)")
    err = console(stderr=True)
    res = solve(model, hw, training, args.gpus, opts, method=args.search,
                progress=None if args.json else (lambda m: err.print(f"[dim]… {m}[/dim]")))
    res.notes = notes + res.notes
    advice = (advise(Estimator(model, hw, training, args.gpus), res.plans[0].estimate, max_items=5,
                     allow_cross_domain=opts.allow_cross_domain) if res.plans else [])
    if args.report:
        written = write_report(res, model, hw, training, args.gpus, Path(args.report), advice=advice,
                               overwrite=args.overwrite)
        err.print("report: " + ", ".join(map(str, written)))
    if args.json:
        d = res.to_dict()
        d["advice"] = advice
        print(dump_json(d))
        return 0 if res.plans else 1
    out = console()
    for n in notes:
        out.print(f"note: {n}")
    out.print(header(model, hw, training, args.gpus))
    out.print(f"search: {res.method}, status {res.status}, gap {res.gap:.2%}, {res.solve_s:.2f} s, "
              f"space {res.space_size:,} layouts over {res.meshes} meshes")
    if not res.plans:
        out.print("[red bold]No layout fits.[/red bold]")
        for line in res.explanation:
            out.print(line)
        return 1
    t = Table(title="Fastest layouts that fit (predicted; memory in GiB per GPU, times in s per step)",
              title_justify="left")
    for col in ("#", "layout", "W+G+O", "act", "total", "compute", "tp", "cp", "ep", "dp", "bubble", "step",
                "tok/s/GPU", "MFU", "bottleneck"):
        t.add_column(col, justify="left" if col in ("layout", "bottleneck") else "right")
    for p in res.plans:
        e, m, ts = p.estimate, p.estimate.memory_gib, p.estimate.time_s
        t.add_row(str(p.rank), p.layout.short(), f"{m.weights + m.grads + m.optimizer:.1f}", f"{m.activations:.1f}",
                  f"{m.total:.1f}", f"{ts.compute:.2f}", f"{ts.tp:.2f}", f"{ts.cp:.2f}", f"{ts.ep:.2f}",
                  f"{ts.dp:.2f}", f"{ts.pp_bubble:.2f}", f"{e.step_time_s:.3f}", f"{e.tokens_per_s_per_gpu:,.0f}",
                  f"{e.mfu:.1%}", e.bottleneck)
    out.print(t)
    out.print("[dim]layout: TPn PPn(vV virtual stages) CP/EP/ETP degrees, DP data-parallel, SP sequence parallel, "
              "Z ZeRO stage (FSDP = ZeRO-3), mbs micro-batch, GA gradient accumulation, rc recompute, "
              "layers = transformer layers per pipeline stage[/dim]")
    best = res.plans[0]
    used = best.estimate.memory_gib.total / best.estimate.hbm_gib
    if used > 0.95:
        roomy = next((p for p in res.plans if p.estimate.memory_gib.total / p.estimate.hbm_gib <= 0.9), None)
        alt = (f"#{roomy.rank} leaves {1 - roomy.estimate.memory_gib.total / roomy.estimate.hbm_gib:.0%} free at "
               f"{roomy.estimate.step_time_s / best.estimate.step_time_s - 1:+.1%} step time" if roomy else
               "no listed layout leaves 10% free; see 'What to try next' for memory savings")
        out.print(f"[yellow]note: #1 uses {used:.0%} of HBM; the memory model is approximate "
                  f"(autopar validate), so check it with a short run (autopar profile run) or pick more headroom: "
                  f"{alt}[/yellow]")
    if res.heuristic:
        h = res.heuristic.estimate
        if h.fits:
            verdict = (f"fits; autopar's best is predicted {h.step_time_s / best.estimate.step_time_s:.2f}x "
                       "as fast")
        else:
            verdict = (f"[red]does not fit[/red] ({h.memory_gib.total:.1f} of {h.hbm_gib:.1f} GiB), so it is no "
                       "usable baseline")
        out.print(f"Rules-of-thumb starting point: {res.heuristic.layout.short()} — {h.step_time_s:.3f} s/step, "
                  f"{verdict}.")
        for r in res.heuristic_reasons:
            out.print(f"  [dim]rule: {r}[/dim]")
    out.print("\n[bold]Best layout in detail[/bold]")
    print_estimate(best.estimate, model, hw, training, out)
    if advice:
        out.print("\n[bold]What to try next[/bold]")
        for a in advice:
            out.print(f"  • {a}")
    if args.emit:
        from autopar.emit import emit
        out.print(f"\n[bold]{args.emit} settings[/bold]")
        print(emit(args.emit, best.layout, model, training, args.gpus))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("solve", help="find the fastest layouts that fit (CP-SAT)",
                       description="Find the fastest parallel layouts that fit in HBM with an OR-Tools CP-SAT model "
                                   "over the analytical cost model. Defaults: hardware h100_sxm, seq 4096, bf16, "
                                   "global batch by model size. " + APPROX_NOTE)
    add_problem_args(p)
    g = p.add_argument_group("pins and ranges (comma lists)")
    searched = {"vpp": "1,2,4,8", "mbs": "1,2,4"}
    for ax in ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs"):
        g.add_argument(f"--{ax}", default=None, help=f"allowed {ax} values, e.g. --{ax} 2,4 (default: "
                       + (searched[ax] if ax in searched else "the divisors of the GPU count the rules allow") + ")")
    g.add_argument("--zero", default=None, help="allowed ZeRO stages, e.g. 1,3 (default: 0,1,2,3)")
    g.add_argument("--fsdp", action="store_true", help="only FSDP (ZeRO-3) layouts")
    g.add_argument("--recompute", default=None, help="allowed policies separated by ';' (default: none;selective;full)")
    g.add_argument("--max-tp", type=positive_int, default=None, help="largest TP to consider")
    g.add_argument("--no-cp", action="store_true", help="no context parallelism")
    g.add_argument("--no-sp", action="store_true", help="no sequence parallelism")
    g.add_argument("--offload-activations", type=fraction, nargs="?", const=1.0, default=0.0, metavar="FRACTION",
                   help="every layout sends this fraction of its stored activations to host memory (alone: 1 = all; "
                        "default: 0; not searched)")
    g.add_argument("--allow-cross-domain", action="store_true",
                   help="let TP and ETP span NVLink domains (default: forbidden; EP may always span domains)")
    p.add_argument("--search", choices=("cpsat", "exhaustive", "heuristic"), default="cpsat",
                   help="cpsat (default), exhaustive (reference enumeration), heuristic (rules of thumb)")
    p.add_argument("--top-k", type=positive_int, default=5, help="layouts to list (default: 5)")
    p.add_argument("--time-limit", type=float, default=60.0, help="CP-SAT time limit in seconds (default: 60)")
    p.add_argument("--emit", choices=("megatron", "torchtitan", "env"), default=None,
                   help="print launcher settings for the best layout")
    p.add_argument("--report", metavar="OUT.md", default=None,
                   help="write a Markdown analysis with OUT_memory.png and OUT_pareto.png beside it")
    p.add_argument("--overwrite", action="store_true", help="replace an existing report and its figures")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)
