"""`autopar zoo`: the models, hardware and software stacks shipped with autopar (names accepted by --model,
--hardware and --stack), and the block kinds a model's layers may be made of (the catalogue of :mod:`autopar.blocks`)."""

from __future__ import annotations

import argparse

from rich.markup import escape

from autopar.blocks import CHANNELS, MIXERS
from autopar.cli.common import dump_json
from autopar.cli.render import console, fitted_table
from autopar.specs.loaders import load_hardware, load_model, load_stack, zoo_dir, zoo_names


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("zoo", help="list the zoo models and hardware (names for --model / --hardware)",
                       description="List the models in models/, the hardware in hardware/ and the software stacks "
                                   "in stacks/ with their key figures; 'blocks' lists the layer kinds a model file "
                                   "may use.")
    p.add_argument("kind", nargs="?", choices=("models", "hardware", "stacks", "blocks", "all"), default="all",
                   help="what to list (default: all = models, hardware and stacks)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    p.set_defaults(func=run)


def params_b(n: float) -> str:
    """A parameter count in billions as every command prints it (one decimal, rounded once from the count:
    solve's header and this table both say 70.6 for llama3_70b; rounding a rounded 70.55 gave 70.5)."""
    return f"{n / 1e9:.1f}"


def _models() -> list[dict]:
    rows = []
    for name in zoo_names("models"):
        m = load_model(name)
        rows.append({"name": name, "total_params_b": round(m.total_params / 1e9, 2),
                     "active_params_b": round(m.active_params / 1e9, 2),
                     "_total": params_b(m.total_params), "_active": params_b(m.active_params), "layers": m.num_layers,
                     "hidden": m.hidden_size, "heads": m.num_attention_heads, "kv_heads": m.kv_heads,
                     "experts": m.moe.num_experts if m.moe else None, "top_k": m.moe.top_k if m.moe else None,
                     "mla": m.mla is not None, "vocab": m.vocab_size, "mixers": _mixers(m)})
    return rows


def _mixers(m) -> str:
    """Token mixers by kind with layer counts, e.g. 'mamba2 x27, attention x4' ('mamba2+attention' for parallel
    mixers in one layer; layers without a mixer are left out)."""
    counts: dict[str, int] = {}
    for i in range(m.num_layers):
        kinds = "+".join(mx.kind for mx in m.mixers_of(i))
        if kinds:
            counts[kinds] = counts.get(kinds, 0) + 1
    return ", ".join(f"{k} x{n}" for k, n in counts.items())


def _blocks() -> list[dict]:
    """The catalogue: token mixers by MixerSpec.kind (``attention`` becomes MLA on a model with ``mla``), channel
    mixers by mlp_pattern entry."""
    rows = [{"kind": k, "role": "token mixer", "title": c.title, "source": c.source} for k, c in MIXERS.items()]
    return rows + [{"kind": k, "role": "channel mixer", "title": c.title, "source": c.source}
                   for k, c in CHANNELS.items()]


def _hardware() -> list[dict]:
    rows = []
    for name in zoo_names("hardware"):
        h = load_hardware(name)
        rows.append({"name": name, "bf16_tflops": h.peak_tflops_bf16, "fp8_tflops": h.peak_tflops_fp8,
                     "fp4_tflops": h.peak_tflops_nvfp4, "hbm_gib": h.hbm_gib, "hbm_tbps": h.hbm_tbps,
                     "nvlink_domain": h.nvlink_domain_size, "nvlink_gbps": h.nvlink_gbps,
                     "scaleout_gbps": h.scaleout_gbps})
    return rows


def _stacks() -> list[dict]:
    from autopar.specs.stack import KNOB_RECORDED, StackKnobs
    rows = []
    for name in zoo_names("stacks"):
        st = load_stack(name)
        knobs = [{"knob": k, "value": getattr(st.knobs, k), "priced": k not in KNOB_RECORDED,
                  "offered": st.allowed.get(k), "free": k in st.free, "source": st.knob_sources.get(k, "")}
                 for k in StackKnobs.model_fields]
        rows.append({"name": name, "framework": st.framework, "release": st.release, "source": st.source,
                     "knobs": knobs, "efficiency": st.efficiency, "efficiency_source": st.efficiency_source})
    return rows


def run(args: argparse.Namespace) -> int:
    out = {}
    if args.kind in ("models", "all"):
        out["models"] = _models()
    if args.kind in ("hardware", "all"):
        out["hardware"] = _hardware()
    if args.kind in ("stacks", "all"):
        out["stacks"] = _stacks()
    if args.kind == "blocks":
        out["blocks"] = _blocks()
    if args.json:
        print(dump_json({k: [{f: v for f, v in r.items() if not f.startswith("_")} for r in rows]
                         for k, rows in out.items()}))
        return 0
    c = console()
    if "blocks" in out:
        rows = [[r["kind"], r["role"], r["title"], r["source"]] for r in out["blocks"]]
        c.print(*fitted_table(c.width, "Block kinds (MixerSpec.kind, mlp_pattern; autopar/blocks/)",
                             ["kind", "role", "what", "source"], rows, left=("kind", "role", "what", "source"),
                             optional=("source",)))
        return 0
    c.print(f"[dim]from {escape(str(zoo_dir('models')))} and {escape(str(zoo_dir('hardware')))}[/dim]")
    if "models" in out:
        rows = [[r["name"], r["_total"], r["_active"], str(r["layers"]),
                 str(r["hidden"]), f"{r['heads']}/{r['kv_heads']}",
                 f"{r['experts']} ({r['top_k']})" if r["experts"] else "-", "yes" if r["mla"] else "", r["mixers"]]
                for r in out["models"]]
        c.print(*fitted_table(c.width, "Models (--model NAME)",
                             ["name", "total B", "active B", "layers", "hidden", "heads/ kv", "experts (top-k)", "MLA",
                              "token mixers (layers)"],
                             rows, left=("name", "token mixers (layers)"),
                             optional=("layers", "hidden", "heads/ kv", "MLA"), wrap_at=20))
    if "hardware" in out:
        rows = [[r["name"], f"{r['bf16_tflops']:g}", f"{r['fp8_tflops']:g}" if r["fp8_tflops"] else "-",
                 f"{r['fp4_tflops']:g}" if r["fp4_tflops"] else "-", f"{r['hbm_gib']:g}", f"{r['hbm_tbps']:g}",
                 str(r["nvlink_domain"]), f"{r['nvlink_gbps']:g}", f"{r['scaleout_gbps']:g}"] for r in out["hardware"]]
        c.print(*fitted_table(c.width, "Hardware (--hardware NAME): dense TFLOP/s, HBM GiB, GB/s per direction",
                             ["name", "BF16", "FP8", "FP4", "HBM", "HBM TB/s", "NVLink GPUs", "NVLink", "scale-out"],
                             rows, left=("name",), optional=("FP4", "HBM TB/s", "scale-out")))
    for st in out.get("stacks", []):
        rows = [[k["knob"], str(k["value"]).lower() if isinstance(k["value"], bool) else str(k["value"]),
                 ("priced" if k["priced"] else "recorded, not priced") + (", solver picks" if k["free"] else ""),
                 ", ".join(k["offered"]) if k["offered"] else "any", k["source"]] for k in st["knobs"]]
        c.print(*fitted_table(c.width, f"Stack {st['name']} (--stack {st['name']}): {st['framework']}; {st['release']}",
                             ["knob", "default", "how", "offered", "source"], rows,
                             left=("knob", "default", "how", "offered", "source"), optional=("offered",)))
        eff = ", ".join(f"{k} {v:g}" for k, v in st["efficiency"].items()) or "the hardware files' (none of its own)"
        c.print(f"  fitted constants: {eff}" + (f" ({st['efficiency_source']})" if st["efficiency_source"] else ""))
    return 0
