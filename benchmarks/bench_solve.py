"""Speed of `autopar solve` over the zoo: every model at GPU counts from 8 to 65,536, feasible and infeasible.

Each case is one whole process (`python -m autopar.cli.main solve --model M --gpus N --json`), as a user runs it:
start-up, table build, CP-SAT and, when nothing fits, the infeasibility explanation. For each case it records the
status, the space size (layouts before any rule), the wall time and the process's CPU time (user + system, from
os.wait4). Then, where the space is small enough (``--exhaustive-max-space``) and for the headline cases, it runs
``--search exhaustive`` on the same space with a time cap (``--exhaustive-cap``), checks that both find the same
top-5 step times and prints the CPU-time ratio.

Default (a few minutes on 2 idle cores): counts 8, 32, 128, ..., 32768 and 65536; exhaustive capped at 30 s of
CPU and run for spaces up to 5,000 layouts plus the headline cases. The 5-minute version of the exhaustive comparison
(every case whose exhaustive search finishes within 5 minutes; hours in total):

    python benchmarks/bench_solve.py --counts pow2 --exhaustive-cap 300 --exhaustive-max-space 100000000

Bytecode: the children write and reuse compiled bytecode in a temporary folder (PYTHONPYCACHEPREFIX; a warm-up run
fills it first), as an installed autopar does. Without it (PYTHONDONTWRITEBYTECODE=1, set on the project's shared
machine) every process compiles autopar's modules again: about 0.1 s more per run.

Targets (issue 13, 2-core machine): every infeasible case <= 2 s whole-process; deepseek_v3/256 <= 0.6 s,
OPTIMAL, >= 30x faster than exhaustive (CPU time, same top-5); llama3_405b/16384 <= 1 s; no feasible case above
1.5 s. Other processes on a shared machine inflate wall time: compare CPU times, and ratios within one run.

The headline case alone, against another checkout, alternating (medians of whole processes and of paired ratios):

    git worktree add /tmp/base main
    python benchmarks/bench_solve.py --headline-only --headline-runs 15 --baseline /tmp/base

Measured 2026-11-26 (issue 20's solve speed work, 2-core development machine, load about 1.1, bytecode cached), this
branch against main 84e348d, 15 pairs: 0.432 s wall, 0.427 s CPU against 0.550 s and 0.547 s; paired ratio CPU
0.782, wall 0.777; OPTIMAL, the same answer. What it took: the collector's first-generation threshold raised while a
command runs and its objects frozen at the program's exit (autopar.cli.main: about 13% together), and tighter
step-time floors in the branch and bound (the first and last stages' head, embedding gradient and MTP layers, the EP
overlap's SM cost, the CP term: 136 floors raised to bounds instead of 396, the same 35 meshes tabulated), a few
memos (the floors' dense kinds per (tp, cp), T_ep per (tp·cp, ep, etp), bounds, each mesh's layout fields) and one
Estimator for the search and the advice.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYCACHE = tempfile.mkdtemp(prefix="autopar-bench-pycache-")   # the children's bytecode (see the docstring)
HEADLINE = (("deepseek_v3", 256), ("llama3_405b", 16384), ("llama3_70b", 64))


def run_solve(model: str, gpus: int, extra: list[str], timeout: float, cpu_cap: float | None = None,
              root: Path = ROOT) -> dict:
    """One whole `autopar solve` process: its JSON answer, wall seconds and CPU seconds (user + system of that
    child alone, from os.wait4, so parallel jobs do not mix). ``cpu_cap``: CPU seconds after which the child is
    stopped (RLIMIT_CPU), so a loaded machine does not cut a run short; ``timeout`` is a wall-clock safety.
    ``root``: the autopar checkout to run (default this one)."""
    cmd = [sys.executable, "-m", "autopar.cli.main", "solve", "--model", model, "--gpus", str(gpus), "--json", *extra]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        limit = None if cpu_cap is None else (lambda: resource.setrlimit(resource.RLIMIT_CPU, (int(cpu_cap) + 1,) * 2))
        env = {**os.environ, "PYTHONPATH": str(root), "PYTHONPYCACHEPREFIX": PYCACHE}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        proc = subprocess.Popen(cmd, cwd=root, stdout=out, stderr=err, env=env, preexec_fn=limit)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        row = {"model": model, "gpus": gpus, "wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime}
        if proc.returncode < 0:
            row["status"] = "TIMEOUT"
            return row
        out.seek(0)
        err.seek(0)
        try:
            d = json.loads(out.read())
        except json.JSONDecodeError:
            row["status"] = "ERROR: " + (err.read().strip().splitlines() or ["no output"])[-1][:160]
            return row
    row.update(status=d["status"], space=d["space_size"], solve_s=d["solve_s"],
               steps=[p["estimate"]["step_time_s"] for p in d["plans"]], explanation=d.get("explanation", []))
    return row


def headline_timing(runs: int, baseline: Path | None, time_limit: float) -> None:
    """``runs`` whole processes of the first headline case (deepseek_v3 on 256 GPUs), and as many of ``baseline``
    (another checkout) in turn with them, A B A B ...: medians of wall and CPU seconds and the median of the paired
    CPU and wall ratios (pairing keeps a ratio meaningful while a shared machine's load drifts)."""
    m, n = HEADLINE[0]
    limit = ["--time-limit", str(time_limit)]
    roots = [ROOT] + ([baseline] if baseline else [])
    for root in roots:   # warm-up: fills the bytecode cache of each checkout
        run_solve(m, n, limit, time_limit + 60, root=root)
    rows: dict[Path, list[dict]] = {root: [] for root in roots}
    for _ in range(runs):
        for root in roots:
            rows[root].append(run_solve(m, n, limit, time_limit + 60, root=root))
    print(f"\n{m}/{n}, {runs} whole processes each (medians):")
    for root in roots:
        r = rows[root]
        print(f"  {str(root):40s} wall {statistics.median(x['wall_s'] for x in r):.3f} s, CPU "
              f"{statistics.median(x['cpu_s'] for x in r):.3f} s, {r[-1].get('status')}")
    if baseline:
        for what in ("cpu_s", "wall_s"):
            ratios = [a[what] / b[what] for a, b in zip(rows[ROOT], rows[baseline])]
            print(f"  this / baseline, {what[:-2]}: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, "
                  f"max {max(ratios):.3f})")


def zoo_models() -> list[str]:
    return sorted(p.stem for p in (ROOT / "models").glob("*.yaml"))


def parse_counts(text: str) -> list[int]:
    if text == "pow2":
        return [2 ** k for k in range(3, 17)]
    if text == "pow4":
        return [8 * 4 ** k for k in range(7)] + [65536]
    return [int(x) for x in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=None, help="comma list (default: every model in models/)")
    ap.add_argument("--counts", default="pow4", help="pow4 (8, 32, ..., 32768, 65536; default), pow2 (8 ... 65536) "
                                                      "or a comma list")
    ap.add_argument("--jobs", type=int, default=1, help="processes at once (default 1: cleaner timings)")
    ap.add_argument("--time-limit", type=float, default=60.0, help="--time-limit passed to solve (default 60)")
    ap.add_argument("--exhaustive-cap", type=float, default=30.0,
                    help="CPU seconds an exhaustive run may take before it is abandoned (default 30; 300 = 5 minutes)")
    ap.add_argument("--exhaustive-max-space", type=int, default=5000,
                    help="run exhaustive only for spaces up to this many layouts, plus the headline cases "
                         "(default 5000)")
    ap.add_argument("--json", metavar="OUT", default=None, help="write every row to this JSON file")
    ap.add_argument("--headline-runs", type=int, default=0, metavar="N",
                    help="also time N whole processes of deepseek_v3/256 and print their medians (0 to 1000; "
                         "default 0: off)")
    ap.add_argument("--baseline", metavar="DIR", type=Path, default=None,
                    help="another autopar checkout (e.g. `git worktree add /tmp/base main`) whose headline solve "
                         "--headline-runs times in turn with this one: the paired ratio")
    ap.add_argument("--headline-only", action="store_true", help="only the --headline-runs timing, no zoo sweep")
    args = ap.parse_args(argv)
    if not 0 <= args.headline_runs <= 1000:
        ap.error(f"--headline-runs must be in [0, 1000], got {args.headline_runs}")
    if args.baseline is not None and not (args.baseline / "autopar" / "cli" / "main.py").is_file():
        ap.error(f"--baseline {args.baseline}: not an autopar checkout (no autopar/cli/main.py there)")
    if args.headline_only:
        headline_timing(max(1, args.headline_runs), args.baseline, args.time_limit)
        shutil.rmtree(PYCACHE, ignore_errors=True)
        return 0
    models = args.models.split(",") if args.models else zoo_models()
    cases = [(m, n) for m in models for n in parse_counts(args.counts)]
    cases += [c for c in HEADLINE if c not in cases]   # the targets' cases, whatever the counts
    limit = ["--time-limit", str(args.time_limit)]
    run_solve(HEADLINE[0][0], HEADLINE[0][1], limit, args.time_limit + 60)   # warm-up: fills the bytecode cache
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda c: run_solve(c[0], c[1], limit, args.time_limit + 60), cases))
    print(f"{len(rows)} cases ({len(models)} models x {len(parse_counts(args.counts))} GPU counts, plus the headline "
          f"ones) in {time.perf_counter() - t0:.0f} s, {args.jobs} at a time\n")

    feas = [r for r in rows if r.get("status") in ("OPTIMAL", "FEASIBLE")]
    infeas = [r for r in rows if r.get("status") == "INFEASIBLE"]
    other = [r for r in rows if r not in feas and r not in infeas]
    for label, group in (("feasible", feas), ("infeasible", infeas)):
        if group:
            cpu, wall = [r["cpu_s"] for r in group], [r["wall_s"] for r in group]
            print(f"{label:10s} {len(group):4d} cases: CPU median {statistics.median(cpu):.2f} s, max {max(cpu):.2f} s;"
                  f" wall median {statistics.median(wall):.2f} s, max {max(wall):.2f} s")
    for r in other:
        print(f"other: {r['model']}/{r['gpus']}: {r['status']}")
    not_optimal = [f"{r['model']}/{r['gpus']}" for r in feas if r["status"] != "OPTIMAL"]
    print(f"feasible cases not OPTIMAL: {', '.join(not_optimal) or 'none'}")

    print("\nslowest ten (wall):")
    print(f"  {'case':24s} {'status':10s} {'space':>9s} {'wall s':>7s} {'CPU s':>6s}")
    for r in sorted(rows, key=lambda r: -r["wall_s"])[:10]:
        print(f"  {r['model'] + '/' + str(r['gpus']):24s} {r.get('status', '')[:10]:10s} {r.get('space', 0):9,d} "
              f"{r['wall_s']:7.2f} {r['cpu_s']:6.2f}")

    print("\nscaling with space size (layouts before any rule), CPU seconds per whole process:")
    sized = [r for r in feas + infeas if r.get("space")]
    bins: dict[int, list[float]] = {}
    for r in sized:
        bins.setdefault(int(math.log10(r["space"])), []).append(r["cpu_s"])
    for b in sorted(bins):
        v = bins[b]
        print(f"  1e{b}-1e{b + 1}: {len(v):4d} cases, CPU median {statistics.median(v):.2f} s, max {max(v):.2f} s")
    if len(sized) > 2:
        xs = [math.log(r["space"]) for r in sized]
        ys = [math.log(r["cpu_s"]) for r in sized]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        print(f"  least-squares slope of log CPU on log space: {slope:.2f} (1 = linear in the space size; CPU includes "
              "a fixed start-up)")

    print("\nexhaustive reference (same space, --top-k 5), CPU-time ratio:")
    headline = set(HEADLINE)
    todo = [r for r in feas if r.get("space", 0) <= args.exhaustive_max_space or (r["model"], r["gpus"]) in headline]
    ratios = []
    for r in todo:
        e = run_solve(r["model"], r["gpus"], ["--search", "exhaustive"], 20 * args.exhaustive_cap + 60,
                      cpu_cap=args.exhaustive_cap)
        r["exhaustive"] = e
        if e["status"] == "TIMEOUT":
            print(f"  {r['model']}/{r['gpus']}: exhaustive over {args.exhaustive_cap:.0f} s CPU, no ratio")
            continue
        same = len(e.get("steps", [])) == len(r["steps"]) and all(
            math.isclose(a, b, rel_tol=1e-6, abs_tol=5e-6) for a, b in zip(e["steps"], r["steps"]))
        ratio = e["cpu_s"] / r["cpu_s"]
        ratios.append(ratio)
        if (r["model"], r["gpus"]) in headline or not same:
            print(f"  {r['model']}/{r['gpus']}: cpsat {r['cpu_s']:.2f} s CPU ({r['wall_s']:.2f} s wall), exhaustive "
                  f"{e['cpu_s']:.2f} s CPU: {ratio:.1f}x, top-5 {'same' if same else 'DIFFERENT'}")
    if ratios:
        print(f"  {len(ratios)} cases compared: ratio median {statistics.median(ratios):.1f}x, min {min(ratios):.1f}x, "
              f"max {max(ratios):.1f}x")

    print("\ntargets:")
    by = {(r["model"], r["gpus"]): r for r in rows}
    if infeas:
        worst = max(infeas, key=lambda r: r["wall_s"])
        print(f"  every infeasible case <= 2 s whole-process: worst {worst['model']}/{worst['gpus']} "
              f"{worst['wall_s']:.2f} s wall, {worst['cpu_s']:.2f} s CPU")
    if feas:
        worst = max(feas, key=lambda r: r["wall_s"])
        print(f"  no feasible case above 1.5 s: worst {worst['model']}/{worst['gpus']} {worst['wall_s']:.2f} s wall, "
              f"{worst['cpu_s']:.2f} s CPU")
    for (m, n), goal in ((("deepseek_v3", 256), 0.6), (("llama3_405b", 16384), 1.0)):
        r = by.get((m, n))
        if r:
            print(f"  {m}/{n} <= {goal} s: {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU, {r.get('status')}")
    if args.headline_runs:
        headline_timing(args.headline_runs, args.baseline, args.time_limit)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    shutil.rmtree(PYCACHE, ignore_errors=True)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    finally:   # the children's bytecode cache, whatever ended the run (a bad flag, Ctrl-C)
        shutil.rmtree(PYCACHE, ignore_errors=True)
