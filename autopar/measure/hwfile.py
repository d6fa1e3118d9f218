"""``autopar profile hardware``: measure this machine and write a hardware file.

Runs the kernel microbenchmarks (:mod:`autopar.measure.kernels`, :mod:`autopar.measure.kernel_tables`) and the
collective bandwidths (:mod:`autopar.measure.collectives`), and turns them into a :class:`HardwareSpec`: either
a description of this machine (each process playing one GPU) or a copy of a base file with the measured tables
put in. The command line is in :mod:`autopar.cli.measure`.
"""

from __future__ import annotations

import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

from autopar.errors import AutoparInputError
from autopar.fileio import OutputFile
from autopar.measure import ProfileError
from autopar.measure.collectives import (OP_LABELS, OPS, TABLE_HEADER, _row, busbw_table, group_sizes,
                                         measured_collectives, run_collectives)
from autopar.measure.kernel_tables import kernel_model_from_tables, measure_kernel_tables
from autopar.measure.kernels import _device, gemm_shapes, measure_copy_bandwidth, measure_gemm
from autopar.specs.hardware import HardwareSpec, KernelModel, MeasuredCollectives
from autopar.specs.model import ModelSpec

GIB = 2 ** 30


# ---- the whole profile ----------------------------------------------------------------------------------
def _meminfo_total_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024 / GIB
    raise ProfileError("/proc/meminfo has no MemTotal line")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()



def profile_hardware(base: HardwareSpec | None, *, world: int, sizes_mib: list[float], ops: list[str],
                     model: ModelSpec | None, timeout_s: float, tokens: int = 4096, name: str | None = None,
                     gemm: bool = True, kernels: bool = True, min_time_s: float = 0.1, cpu_math: str = "fp32",
                     out: Callable[[str], None] | None = None,
                     progress: Callable[[str], None] | None = None) -> tuple[HardwareSpec, dict]:
    """Measure this machine and return (hardware spec, raw measurements).

    ``base`` None: a description of this machine built from the measurements, each process playing one GPU:
    peak_tflops_* = measured GEMM TFLOP/s with kernel_model.gemm 1.0 (on CPU: the ``cpu_math`` rate, fp32 by
    default, because autopar's CPU runner computes in fp32 whatever the training precision; measured with
    the process's share of the cores), hbm_gib = MemTotal / world, hbm_tbps = copy bandwidth of one process,
    nvlink and scale-out bandwidth = measured all-reduce bus bandwidth with efficiency 1.0, latency from a
    4 KiB all-reduce, reserve_gib = resident memory of an idle worker.
    ``base`` given: a copy with ``measured_busbw_gbps`` and ``kernels`` replaced and, on CUDA, ``kernel_model``
    fitted to the kernel tables against the base's datasheet peaks; its datasheet numbers and efficiencies are
    kept (GEMM figures are in the raw dict). ``out`` receives the table rows, ``progress`` status lines."""
    if world < 1:
        raise AutoparInputError(f"world must be at least 1 (got {world})")
    if not sizes_mib or any(s <= 0 for s in sizes_mib):
        raise AutoparInputError(f"message sizes must be positive MiB values (got {sizes_mib})")
    bad = [o for o in ops if o not in OPS]
    if bad:
        raise AutoparInputError(f"unknown collective(s) {', '.join(bad)} (choose from {', '.join(OPS)})")
    if timeout_s <= 0:
        raise AutoparInputError(f"timeout must be positive (got {timeout_s})")
    if tokens <= 0:
        raise AutoparInputError(f"tokens must be positive (got {tokens})")
    if cpu_math not in ("fp32", "bf16", "fp16"):
        raise AutoparInputError(f"cpu_math must be fp32, bf16 or fp16 (got '{cpu_math}')")
    say = progress or (lambda m: print(m, file=sys.stderr, flush=True))
    emit = out or (lambda m: print(m, flush=True))
    sizes = sorted(set(float(s) for s in sizes_mib))
    raw: dict[str, Any] = {"world": world, "sizes_mib": sizes, "ops": list(ops), "nodes": 1,
                           "cross_node": "not measured: all processes run on this one machine",
                           "host": platform.node(), "cpu": _cpu_model(), "records": [], "failures": []}

    device = _device()
    raw["device"] = device
    # On CPU each process plays one GPU: it gets its share of the cores, as the runner's workers do (one
    # thread each when world >= cores).
    threads = max(1, (os.cpu_count() or 1) // world) if device == "cpu" else 1
    shapes = gemm_shapes(model, tokens)
    if gemm:
        say(f"GEMM on {device} ({'model ' + model.name + f', {tokens} tokens' if model else 'square shapes'}"
            + (f", {threads} thread(s) per process" if device == "cpu" else "") + "), one process alone")
        raw["gemm"] = measure_gemm(shapes, device=device, threads=threads if device == "cpu" else None,
                                   progress=say)
        copy = measure_copy_bandwidth(device=device, threads=threads if device == "cpu" else None)
        raw["copy_tbps"] = copy
        say(f"copy bandwidth, one process alone: {copy * 1e3:.1f} GB/s (read + write)")
    if kernels:
        say(f"kernel classes on {device}, one process alone (GEMM by shape, grouped GEMM, flash attention, "
            "memory-bound kernels, host copies)" + (": tiny shapes, no accelerator" if device == "cpu" else ""))
        raw["kernels"] = measure_kernel_tables(model, tokens, device=device, cpu_math=cpu_math,
                                               threads=threads if device == "cpu" else None, progress=say,
                                               cpu_name=raw["cpu"])
    groups = group_sizes(world)
    if not groups:
        say("world = 1: no collectives to measure")
    else:
        say(f"collectives on this one machine (cross-node: not measured); group sizes {groups}")
        emit(TABLE_HEADER)
    for n in groups:
        def on_record(rec: dict) -> None:
            if rec["kind"] == "collective":
                emit(_row(rec))
            elif rec["kind"] == "start":
                say(f"group of {n}: backend {rec['backend']}")
            elif rec["kind"] == "compute":
                say(f"all {n} processes at once, slowest: GEMM GFLOP/s "
                    + ", ".join(f"{p} {v * 1e3:,.1f}" for p, v in rec["tflops"].items())
                    + f"; copy {rec['copy_tbps'] * 1e3:.1f} GB/s")
        concurrent = gemm and device == "cpu" and n == world
        try:
            recs = run_collectives(n, sizes, list(ops), timeout_s=timeout_s, on_record=on_record,
                                   min_time_s=min_time_s, threads=threads,
                                   gemm_shapes_=shapes if concurrent else None)
        except ProfileError as err:
            recs = getattr(err, "records", [])
            raw["failures"].append(str(err))
            say(f"warning: {err}")
        raw["records"].extend(recs)
    if groups and not any(r["kind"] == "collective" for r in raw["records"]):
        raise ProfileError("no collective could be measured: " + "; ".join(raw["failures"]))

    largest = sizes[-1]
    table = measured_collectives(raw["records"], largest)
    raw["busbw_gbps"] = {op: {n: dict(v) for n, v in by_n.items()} for op, by_n in busbw_table(raw["records"]).items()}
    if base is not None:
        update: dict[str, Any] = {"measured_busbw_gbps": table, **({"name": name} if name else {})}
        if "kernels" in raw:
            update["kernels"] = raw["kernels"]
            if device == "cuda":   # the base holds the datasheet peaks of the measured device
                update["kernel_model"] = kernel_model_from_tables(raw["kernels"], base)
                say(f"kernel_model fitted to the tables: {update['kernel_model'].source}")
        spec = base.model_copy(update=update)
        if device == "cpu" and base.peak_tflops_bf16 > 50:
            say(f"note: measured on CPU but the base '{base.name}' is an accelerator; its datasheet numbers are "
                "kept and the bandwidth and kernel tables describe this CPU")
        return HardwareSpec.model_validate(spec.model_dump()), raw
    return _describe_machine(raw, world, table, name, cpu_math), raw


def _describe_machine(raw: dict, world: int, table: MeasuredCollectives | None, name: str | None,
                      cpu_math: str = "fp32") -> HardwareSpec:
    """A HardwareSpec for this machine where every process plays one GPU (see :func:`profile_hardware`)."""
    if not raw.get("gemm"):
        raise ProfileError("a description of this machine needs the GEMM measurement (no --base given)")
    together = next((r for r in raw["records"] if r["kind"] == "compute"), None)
    # All processes computing at once is the situation of a training step; a lone process is the fallback.
    tf = dict((together or raw["gemm"])["tflops"])
    copy_tbps = together["copy_tbps"] if together else raw.get("copy_tbps", 0.01)
    probe = (together or raw["gemm"]).get("probe_only") or []
    measured = ", ".join(f"{p} {v * 1e3:,.1f}" for p, v in tf.items()) + (
        f" per process with all {world} computing at once (alone: "
        + ", ".join(f"{p} {v * 1e3:,.1f}" for p, v in raw["gemm"]["tflops"].items()) + ")" if together else "")
    if raw["device"] == "cpu":
        # autopar's CPU runner (autopar.run.worker) computes in `cpu_math` whatever training.precision
        # says, so the peak a training spec's precision looks up must be that rate.
        if cpu_math not in tf:
            raise ProfileError(f"--cpu-math {cpu_math} was not measured (measured: {', '.join(tf)})")
        bf16 = fp16 = tf[cpu_math]
        peaks = (f"peak_tflops_bf16 and peak_tflops_fp16 both hold the measured {cpu_math} rate, the math "
                 f"autopar's CPU runner executes whatever training.precision says (kernel_model.gemm 1.0)")
    else:
        fallback = max(tf.values())
        bf16, fp16 = tf.get("bf16", fallback), tf.get("fp16", fallback)
        peaks = "peak_tflops_* hold these measured figures (kernel_model.gemm 1.0)"
    recs = raw["records"]
    lat = [r for r in recs if r["kind"] == "latency"]
    alpha_us = min((r["alpha_us"] for r in lat), default=10.0)
    rss = [r["rss_gib"] for r in recs if r["kind"] == "start" and not math.isnan(r.get("rss_gib", math.nan))]
    ar = table.all_reduce if table else {}
    link = ar[max(ar)] if ar else 1.0  # bus GB/s of the largest all-reduce group at the largest message
    gemm_eff = dict(KernelModel().gemm)
    gemm_eff.update({p: 1.0 for p in (*tf, "bf16", "fp16")})
    source = (f"measured by 'autopar profile hardware' on {raw['cpu']} ({os.cpu_count()} cores, {world} processes, "
              f"{raw['device']}) {time.strftime('%Y-%m-%d')}: GEMM GFLOP/s {measured}"
              + (f" ({', '.join(probe)} at a 256^3 probe only)" if probe else "") + "; " + peaks)
    return HardwareSpec(
        name=name or f"{raw['device']}_{'gloo' if raw['device'] == 'cpu' else 'nccl'}_{world}p",
        source=source,
        peak_tflops_bf16=max(bf16, 1e-6),
        peak_tflops_fp16=max(fp16, 1e-6),
        hbm_gib=round(_meminfo_total_gib() / world, 3),
        hbm_tbps=max(copy_tbps, 1e-6),
        gpus_per_node=world,
        nvlink_domain_size=world,
        nvlink_gbps=round(link, 3),
        scaleout_gbps=round(link, 3),
        nvlink_latency_us=round(alpha_us, 2),
        scaleout_latency_us=round(alpha_us, 2),
        reserve_gib=round(max(rss), 3) if rss else 0.5,
        # The peaks above ARE the measured rates: every kernel class runs at 1.0 of them with no shape falloff
        # (the kernel-class tables, when measured, are in the kernels: section; this curve model does not use them).
        kernel_model=KernelModel(source="measured peaks of this machine (see source); shape and kernel-class "
                                        "factors not measured: 1.0", gemm=gemm_eff, gemm_half_m=1e-6,
                                 gemm_half_nk=1e-6, grouped_gemm=1.0, attention_fwd=1.0, attention_bwd=1.0,
                                 attention_half_seq=1e-6, attention_head_dim={128: 1.0}, hbm=1.0, nvlink=1.0,
                                 scaleout=1.0, sustained_gemm=1.0, sustained_attention=1.0),
        measured_busbw_gbps=table,
        kernels=raw.get("kernels"),
    )


def compute_summary(raw: dict) -> list[str]:
    """GEMM and copy figures, alone and (CPU) with every process computing at once."""
    lines = []
    gemm = raw.get("gemm", {}).get("tflops")
    if gemm:
        thr = raw["gemm"].get("threads")
        lines.append("GEMM GFLOP/s, one process alone" + (f" ({thr} thread(s))" if thr else "") + ": "
                     + ", ".join(f"{p} {v * 1e3:,.1f}" for p, v in gemm.items())
                     + (f"; copy {raw['copy_tbps'] * 1e3:.1f} GB/s" if raw.get("copy_tbps") else ""))
    for r in raw.get("records", []):
        if r["kind"] == "compute":
            lines.append(f"GEMM GFLOP/s per process, all {r['n']} at once (slowest): "
                         + ", ".join(f"{p} {v * 1e3:,.1f}" for p, v in r["tflops"].items())
                         + f"; copy {r['copy_tbps'] * 1e3:.1f} GB/s")
    return lines


def file_header(spec: HardwareSpec, raw: dict) -> str:
    """YAML comment lines: where the file comes from and the full bus-bandwidth table."""
    lines = [f"# Written by 'autopar profile hardware' on {raw.get('host', '?')} ({raw.get('cpu', '?')}), "
             f"{raw['world']} processes on {raw.get('device', '?')}, {time.strftime('%Y-%m-%d %H:%M')}.",
             f"# Cross-node: {raw['cross_node']}."]
    for line in compute_summary(raw):
        lines.append("# " + line)
    tab = raw.get("busbw_gbps", {})
    if tab:
        lines.append("# Bus bandwidth GB/s (nccl-tests definition) by op, group size and message MiB:")
        for op, by_n in tab.items():
            for n, by_size in sorted(by_n.items()):
                cells = ", ".join(f"{s:g} MiB: {v:.2f}" for s, v in sorted(by_size.items()))
                lines.append(f"#   {OP_LABELS[op]:<4}n={n}: {cells}")
    if spec.kernels is not None:
        lines.append(f"# kernels: {spec.kernels.provenance}")
    if spec.measured_busbw_gbps is not None:
        lines.append(f"# measured_busbw_gbps holds the {spec.measured_busbw_gbps.message_mib:g} MiB column.")
    for f in raw.get("failures", []):
        lines.append(f"# FAILED: {f}")
    return "\n".join(lines)


def write_new_file(spec: HardwareSpec, path: Path, header: str, *, force: bool) -> None:
    """Write ``spec`` with dump_spec, refusing to replace an existing file unless ``force``."""
    from autopar.specs.loaders import dump_spec
    OutputFile(path, "--out", overwrite=force)    # exists without force, a folder, no folder: one line each
    dump_spec(spec, path, header)


