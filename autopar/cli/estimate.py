"""`autopar estimate`: memory and step time of one layout."""

from __future__ import annotations

import argparse

from autopar.cli.common import (SCHEMA_VERSION, add_problem_args, count, dump_json, fraction, interval_line,
                                load_problem, parse_int_list, prediction_intervals)
from autopar.cli.render import console, print_estimate
from autopar.cost import Estimator
from autopar.specs.layout import Layout
from autopar.specs.loaders import build_spec


def add_layout_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("layout")
    for name, helptext in (("tp", "tensor parallel"), ("pp", "pipeline stages"), ("vpp", "virtual stages per rank"),
                           ("cp", "context parallel"), ("ep", "expert parallel"), ("etp", "expert tensor parallel")):
        g.add_argument(f"--{name}", type=count("vpp" if name == "vpp" else "degree"), default=1,
                       help=f"{helptext} (default: 1)")
    g.add_argument("--sp", dest="sp", action="store_true", default=None, help="sequence parallel (default: on iff TP>1)")
    g.add_argument("--no-sp", dest="sp", action="store_false", help="turn sequence parallel off")
    sh = g.add_mutually_exclusive_group()
    sh.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=1,
                    help="ZeRO stage over DP (default: 1 = Megatron distributed optimizer)")
    sh.add_argument("--fsdp", action="store_true", help="FSDP (ZeRO-3) parameter sharding")
    g.add_argument("--hsdp", type=count("degree"), default=None, help="HSDP: shard over groups of N DP ranks")
    g.add_argument("--mbs", type=count("micro_batch"), default=1, help="micro-batch size in sequences (default: 1)")
    g.add_argument("--recompute", default="none",
                   help="none | selective | full | comma list of modules (core_attn,layernorm,mlp,moe,moe_act,"
                        "mla_up_proj,shared_experts) (default: none)")
    g.add_argument("--stage-layers", default=None, help="layers per pipeline stage, e.g. 2,4,4,...,3 (uneven split)")
    g.add_argument("--offload-activations", type=fraction, nargs="?", const=1.0, default=0.0, metavar="FRACTION",
                   help="send this fraction of the stored activations to host memory and back (alone: 1 = all; "
                        "needs host_link_gbps in the hardware file; default: 0)")


def layout_from_args(args: argparse.Namespace) -> Layout:
    stage = tuple(parse_int_list(args.stage_layers, "--stage-layers", "layers")) if args.stage_layers else None
    return build_spec(Layout, dict(tp=args.tp, pp=args.pp, vpp=args.vpp, cp=args.cp, ep=args.ep, etp=args.etp,
                  sequence_parallel=args.sp, zero_stage=3 if args.fsdp else args.zero, fsdp=args.fsdp,
                  hsdp_shard=args.hsdp, micro_batch=args.mbs, recompute=args.recompute, stage_layers=stage,
                  offload_activations=args.offload_activations),
                      "layout flags")


def run(args: argparse.Namespace) -> int:
    model, hw, training, notes = load_problem(args)
    layout = layout_from_args(args)
    estimator = Estimator(model, hw, training, args.gpus)
    est = estimator.estimate(layout)
    by_kernel = estimator.compute_by_kernel(est.layout, resolved=True)
    iv = prediction_intervals(model, hw, args.stack_spec.name, est)
    if args.json:
        d = {"schema_version": SCHEMA_VERSION, **est.to_dict()}
        d["interval"] = iv or None
        d["stack"] = {"name": args.stack_spec.name, **args.stack_knobs.model_dump()}
        d["notes"] = notes + d["notes"]
        d["compute_by_kernel_s"] = by_kernel
        print(dump_json(d))
        return 0
    out = console()
    for n in notes:
        out.print(f"note: {n}")
    print_estimate(est, model, hw, training, out)
    out.print(interval_line(iv))
    out.print(f"stack: {args.stack_spec.name} (" + ", ".join(
        f"{k}={v}" for k, v in args.stack_knobs.model_dump().items()) + ")")
    total = sum(v for k, v in by_kernel.items() if k != "recomputation")
    out.print("compute by kernel class (s/step, slowest stage): " + ", ".join(
        f"{k} {v:.3g} ({v / total:.0%})" for k, v in sorted(by_kernel.items(), key=lambda kv: -kv[1])
        if k != "recomputation" and v > 0) + (f"; of which recomputation {by_kernel['recomputation']:.3g}"
                                              if by_kernel.get("recomputation") else ""))
    out.print(f"kernel speeds: {hw.kernel_model.source}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("estimate", help="predict memory and step time of one layout",
                       description="Predict per-GPU memory and step time of one parallel layout "
                                   "(analytical cost model; see autopar/cost/).")
    add_problem_args(p, cluster=True)
    add_layout_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (the library's Estimate.to_dict())")
    p.set_defaults(func=run)
