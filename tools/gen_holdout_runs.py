"""Builds data/published_runs_holdout.csv: the pre-training rows of Megatron-Bridge's performance archive for the NeMo
containers before 26.06, each with the switches its release's performance recipe states, then NeMo's long-sequence
(context-parallel) runs (rows ``nemolong-``) with their releases' recipe switches (data/
published_runs_holdout_skipped.txt gives the conventions; the skipped rows are printed to stderr).

    python tools/gen_holdout_runs.py BRIDGE_GIT_DIR NEMO_GIT_DIR LAUNCHER_GIT_DIR > data/published_runs_holdout.csv

BRIDGE_GIT_DIR: a clone (or bare mirror) of NVIDIA-NeMo/Megatron-Bridge with its tags v0.2.0 .. v0.4.1; the page is
read at its HEAD. Each tag's scripts/performance/ and src/megatron/bridge/recipes/ are extracted to a temporary
folder and its *workload_base_configs.py files imported (they hold dataclass instances only, standard library
imports) to read each WorkloadBaseConfig.
NEMO_GIT_DIR: NVIDIA/NeMo with tag v2.3.0rc2 and commit 14d427f575; docs/source/performance/
performance_long_sequence.md is read at its HEAD. LAUNCHER_GIT_DIR: NVIDIA/NeMo-Framework-Launcher with tag 24.03.01.
The recipe lines each nemolong row cites are checked to be in those files (an AssertionError names the one missing).
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = WORK = PAGE = PAGE_REV = NEMO = LAUNCHER = ""


def load(tag):
    root = f"{WORK}/{tag}/scripts/performance"
    for m in [k for k in sys.modules if k == "utils" or k.startswith("utils.") or k.startswith("configs")]:
        del sys.modules[m]
    sys.path.insert(0, root)
    out = {}
    try:
        for f in sorted(glob.glob(f"{root}/configs/*/*workload_base_configs.py")):
            spec = importlib.util.spec_from_file_location(f"wbc_{tag}_{os.path.basename(f)}", f)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            rel = os.path.relpath(f, f"{WORK}/{tag}")
            for k, v in vars(mod).items():
                if dataclasses.is_dataclass(v) and not isinstance(v, type) and ("_CONFIG_" in k or k.endswith("_BASE_CONFIG")):
                    out[k] = (rel, v)
    finally:
        sys.path.remove(root)
    return out


# container -> (id prefix, Bridge tag, why that tag)
CONTAINERS = {
    "26.04.01": ("mb2604a", "v0.4.1", "v0.4.1 (2026-05-06): the last Bridge tag before the 26.04.01 rows were added (17a381f9, 2026-05-16); docs/releases names no Bridge version for 26.04.01"),
    "26.04": ("mb2604", "v0.4.0", "v0.4.0: docs/releases/software-versions.md 'NeMo Framework 26.04 | Megatron-Bridge 0.4.0'"),
    "26.02.01": ("mb2602a", "v0.3.1", "v0.3.1: docs/releases/known-issues.md 'Fixed in 26.02.01 (r0.3.1)'"),
    "26.02": ("mb2602", "v0.3.0", "v0.3.0: docs/releases/software-versions.md 'NeMo Framework 26.02 | Megatron-Bridge 0.3.0'"),
    "25.11": ("mb2511", "v0.2.0", "v0.2.0: docs/releases/software-versions.md 'NeMo Framework 25.11 | Megatron-Bridge 0.2.0'"),
}
MODELS = {  # page name -> (zoo model, id short, config prefix, family)
    "LLAMA3_8B": ("llama3_8b", "l3-8b", "LLAMA3_8B", "llama"),
    "LLAMA3_70B": ("llama3_70b", "l3-70b", "LLAMA3_70B", "llama"),
    "LLAMA3.1_405B": ("llama3_405b", "l31-405b", "LLAMA31_405B", "llama"),
    "DeepSeekV3": ("deepseek_v3", "dsv3", "DEEPSEEK_V3", "deepseek"),
    "DeepSeekV3 (w/ MTP)": ("deepseek_v3", "dsv3", "DEEPSEEK_V3", "deepseek"),
    "GPT OSS 120B": ("gpt_oss_120b", "gptoss120b", "GPT_OSS_120B", "gpt_oss"),
    "Qwen3_30B_a3B": ("qwen3_30b_a3b", "q3-30b", "QWEN3_30B_A3B", "qwen"),
    "Qwen3_235B_a22B": ("qwen3_235b_a22b", "q3-235b", "QWEN3_235B_A22B", "qwen"),
    "Nemotron_3_Nano": ("nemotron3_nano_30b_a3b", "nano3", "NEMOTRON_3_NANO", "nemotronh"),
}
SKIP_MODELS = {
    "Kimi_K2": "Muon optimizer (the page's note): autopar prices Adam's optimizer step and state only",
    "Nemotron_3_Super": "model not in the zoo (models/*.yaml)",
    "DeepSeekV3 (w/o MTP)": "DeepSeek-V3 without its MTP layer is not in the zoo (models/deepseek_v3.yaml has mtp_layers 1)",
}
SYSTEMS = {"DGX-GB300": ("gb300_nvl72", "gb300", "GB300"), "DGX-GB200": ("gb200_nvl72", "gb200", "GB200"),
           "DGX-B300": ("b300", "b300", "B300"), "DGX-B200": ("b200", "b200", "B200"), "DGX-H100": ("h100_sxm", "h100", "H100")}
PRECS = {"FP8": "fp8", "FP8-CS": "fp8", "MXFP8": "mxfp8", "FP8-MX": "mxfp8", "NVFP4": "nvfp4", "BF16": "bf16"}
CFG_PREC = {"fp8": "FP8_CS", "mxfp8": "FP8_MX", "nvfp4": "NVFP4", "bf16": "BF16"}
MOE = {"deepseek_v3", "gpt_oss_120b", "qwen3_30b_a3b", "qwen3_235b_a22b", "nemotron3_nano_30b_a3b"}
NUM_LAYERS = {"deepseek_v3": 61}


def sections():
    """(container, heading, table header, rows) for every pre-training table of the earlier containers."""
    cont = head = None
    pretrain = False
    lines = PAGE.splitlines()
    i = 0
    while i < len(lines):
        ln = lines[i]
        m = re.match(r"## (\S+) NeMo Container", ln)
        if m:
            cont = m.group(1); pretrain = False
        elif ln.startswith("### "):
            pretrain = "Pre-Training" in ln
        elif ln.startswith("#### "):
            head = ln[5:].split(":", 1)[1].strip()
        elif ln.startswith("| ") and pretrain and cont in CONTAINERS and i + 1 < len(lines) and lines[i + 1].startswith("|--"):
            hdr = [c.strip() for c in ln.strip("|").split("|")]
            rows = []
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                rows.append([c.strip() for c in lines[j].strip().strip("|").split("|")])
                j += 1
            yield cont, head, hdr, rows
            i = j
            continue
        i += 1


def alternatives(cell):
    """'29994 (29388)' -> ['29994', '29388']; '4' -> ['4']"""
    m = re.fullmatch(r"(\S+?)\s*\((\S+)\)", cell)
    return [m.group(1), m.group(2)] if m else [cell]


def parse_pp_layout(s):
    """Megatron pipeline layout string ('Et*4|(t*4|)*14tmL') -> transformer layers per virtual chunk."""
    tok = re.findall(r"\(|\)\*\d+|\)|\*\d+|[EtmL|]", s.replace(" ", ""))
    def expr(pos):
        out = []
        while pos < len(tok) and not tok[pos].startswith(")"):
            if tok[pos] == "(":
                inner, pos = expr(pos + 1)
                rep = int(tok[pos][2:]) if tok[pos].startswith(")*") else 1
                out += inner * rep; pos += 1
            elif tok[pos].startswith("*"):
                out += [out[-1]] * (int(tok[pos][1:]) - 1); pos += 1
            else:
                out.append(tok[pos]); pos += 1
        return out, pos
    seq, _ = expr(0)
    return [c.count("t") for c in "".join(seq).split("|")]


def layout_map_chunks(tag, pp, vp):
    """The deepseek_v3 recipe's layout_map[(pp, vp)] at a tag, as transformer layers per chunk, or None."""
    try:
        src = subprocess.check_output(["git", "-C", REPO, "show", f"{tag}:src/megatron/bridge/recipes/deepseek/deepseek_v3.py"], text=True)
    except subprocess.CalledProcessError:
        return None
    m = re.search(r"\(%d, %d\): \[\[\"embedding\"\] \+ \[\"decoder\"\] \* (\d+)\] \+ \[\[\"decoder\"\] \* (\d+)\] \* (\d+) \+ \[\[\"decoder\"\](?: \* (\d+))? \+ last_layer\]" % (pp, vp), src)
    if not m:
        return None
    a, b, c, d = (int(x) if x else 1 for x in m.groups())
    return [a] + [b] * c + [d]


FN_KEY = {"llama3_8b": "llama3_8b", "llama3_70b": "llama3_70b", "llama3_405b": "llama31_405b",
          "qwen3_235b_a22b": "qwen3_235b_a22b", "qwen3_30b_a3b": "qwen3_30b_a3b", "deepseek_v3": "deepseek_v3",
          "gpt_oss_120b": "gpt_oss_120b", "nemotron3_nano_30b_a3b": "nemotron_3_nano"}


def tp_overlap(tag, fam, zoo, cgpu, prec):
    """TP comm overlap as the release's pretrain function for this model and chip sets it: ('none'|'userbuffers'|None, where)."""
    key, gpu = FN_KEY[zoo], cgpu.lower()
    for f in sorted(glob.glob(f"{WORK}/{tag}/scripts/performance/configs/*/*_llm_pretrain.py")):
        text = open(f).read()
        for m in re.finditer(r"\ndef (\w+)\(", text):
            name = m.group(1)
            if key in name and name.endswith(gpu) or key in name and f"_{gpu}_" in name + "_":
                body = text[m.end():text.find("\ndef ", m.end()) if text.find("\ndef ", m.end()) > 0 else len(text)]
                rel = os.path.relpath(f, f"{WORK}/{tag}") + " " + name
                if "tp_comm_overlap=False" in body:
                    return "none", rel + " (CommOverlapConfig(tp_comm_overlap=False))"
                if prec == "nvfp4" and 'False if precision == "nvfp4"' in body:
                    return "none", rel + " (tp_comm_overlap = False if precision == 'nvfp4')"
                if "tp_comm_overlap_cfg" in body:
                    return "userbuffers", rel + " (sets a userbuffers tp_comm_overlap_cfg on the base recipe's CommOverlapConfig)"
                if "tp_comm_overlap=True" in body or "tp_comm_overlap=bool(" in body:
                    return "userbuffers", rel + " (CommOverlapConfig(tp_comm_overlap=...TP > 1))"
                return None, rel + " sets no tp_comm_overlap"
    return None, f"no {key} {gpu} pretrain function found"


def split_over_ranks(chunks, pp):
    ranks = [0] * pp
    for c, n in enumerate(chunks):
        ranks[c % pp] += n
    return ranks


def main(repo: str, nemo: str, launcher: str) -> None:
    global REPO, WORK, PAGE, PAGE_REV, NEMO, LAUNCHER
    REPO, NEMO, LAUNCHER = repo, nemo, launcher
    PAGE_REV = subprocess.check_output(["git", "-C", REPO, "rev-parse", "--short=8", "HEAD"], text=True).strip()
    PAGE = subprocess.check_output(["git", "-C", REPO, "show", "HEAD:docs/performance-summary-archive.md"], text=True)
    with tempfile.TemporaryDirectory() as WORK:
        for _, tag, _ in CONTAINERS.values():
            os.makedirs(f"{WORK}/{tag}")
            tar = subprocess.run(["git", "-C", REPO, "archive", tag, "scripts/performance", "src/megatron/bridge/recipes"],
                                 check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", f"{WORK}/{tag}"], input=tar, check=True)
        build()


def build() -> None:
    header = (Path(__file__).resolve().parents[1] / "data" / "published_runs.csv").open().readline().strip().split(",")
    cfgs = {tag: load(tag) for _, tag, _ in CONTAINERS.values()}
    out, skipped, ids = [], [], set()
    for cont, head, hdr, rows in sections():
        prefix, tag, why_tag = CONTAINERS[cont]
        for r in rows:
            cell = dict(zip(hdr, r))
            name = cell.get("Model", head)
            sysname = cell.get("System", head)
            if name in SKIP_MODELS or head in SKIP_MODELS:
                skipped.append(f"- {prefix} | {name} {sysname} {cell.get('Precision','')} | {SKIP_MODELS.get(name) or SKIP_MODELS[head]}")
                continue
            zoo, short, cprefix, fam = MODELS[name]
            hw, hwshort, cgpu = SYSTEMS[sysname]
            precs = [PRECS[p] for p in alternatives(cell["Precision"])]
            toks = alternatives(cell["Tokens / sec / GPU"])
            assert len(toks) == len(precs), (cont, r)
            for prec, tok in zip(precs, toks):
                gpus, gbs, mbs, seq = (int(cell[k]) for k in ("#-GPUs", "GBS", "MBS", "Sequence Length"))
                fsdp, tp, pp, cp = (int(cell[k]) for k in ("FSDP", "TP", "PP", "CP"))
                vp = 1 if cell["VP"] in ("n/a", "1") else int(cell["VP"])
                ep = 1 if cell["EP"] == "n/a" else int(cell["EP"])
                rid = f"{prefix}-{short}-{hwshort}-{gpus}-{prec}"
                if rid in ids:
                    rid += f"-gbs{gbs}"
                assert rid not in ids, rid
                ids.add(rid)
                # the release's workload config with this layout
                want = dict(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, context_parallel_size=cp,
                            expert_model_parallel_size=ep, micro_batch_size=mbs, global_batch_size=gbs)
                cands, near = [], []
                for k, (f, c) in sorted(cfgs[tag].items()):
                    if not k.startswith(cprefix + "_") or "SFT" in k or "LORA" in k or "FINETUNE" in k:
                        continue
                    if f"_{cgpu}_{CFG_PREC[prec]}" not in k:
                        continue
                    if k.startswith("LLAMA3_70B") and cprefix == "LLAMA3_8B":
                        continue
                    cvp = c.virtual_pipeline_model_parallel_size or 1
                    ok = all(getattr(c, a) == v for a, v in want.items()) and cvp == vp and bool(c.use_megatron_fsdp) == (fsdp > 0)
                    if ok:
                        cands.append((k, f, c))
                    elif all(getattr(c, a) == v for a, v in want.items() if a != "global_batch_size") and cvp == vp \
                            and bool(c.use_megatron_fsdp) == (fsdp > 0):
                        near.append((k, f, c))
                notes, knobs = [], []
                recompute = ""
                split = ""
                gbs_note = ""
                if not cands and near:
                    cands = near
                    gbs_note = (f"no config of {tag} has the page's GBS {gbs}; {near[0][0]} has its parallel layout and MBS with "
                                f"GBS {near[0][2].global_batch_size} (GBS is a command-line override of the perf scripts, -gb): its switches taken")
                if cands:
                    k, f, c = cands[0]
                    if gbs_note:
                        notes.append(gbs_note)
                    section = f"{cont} Pre-Training Performance; Megatron-Bridge@{tag} {f} {k}"
                    if len(cands) > 1:
                        notes.append(f"{len(cands)} configs of {tag} match the published layout ({', '.join(x[0] for x in cands)}): the first taken, switches compared: " + ("identical" if all(dataclasses.asdict(x[2]) | {'num_gpus': 0} == dataclasses.asdict(c) | {'num_gpus': 0} for x in cands) else "they differ"))
                    if c.recompute_modules:
                        recompute = ",".join(c.recompute_modules)
                    else:
                        notes.append("recompute: the recipe's (blank: the workload config sets none; autopar's fill)")
                    if c.recompute_num_layers:
                        notes.append(f"recompute_num_layers {c.recompute_num_layers} in the workload config: not represented (n/f how it combines with the modules)")
                    impl, scope = c.cuda_graph_impl, c.cuda_graph_scope
                    if impl == "local" and scope == "full_iteration":
                        knobs.append("cuda_graphs=full_iteration")
                    elif impl in ("transformer_engine", "local"):
                        knobs.append("cuda_graphs=partial")
                        section += f" ({'TE' if impl == 'transformer_engine' else 'local'} graphs: {', '.join(scope) if isinstance(scope, list) else scope})"
                    elif impl == "none":
                        knobs.append("cuda_graphs=none")
                    if zoo in MOE and ep > 1:
                        disp = c.moe_flex_dispatcher_backend
                        knobs.insert(0, f"dispatcher={disp}" if disp else "dispatcher=all_to_all")
                        knobs.append("ep_overlap=on" if c.moe_a2a_overlap else "ep_overlap=off")
                        if cont == "26.02" and disp == "deepep":
                            notes.append("the recipe asks for DeepEP, which the 26.02 container lacks (Megatron-Bridge@"
                                         f"{PAGE_REV} docs/releases/known-issues.md '26.02': 'DeepEP is not supported in "
                                         "the current NeMo framework 26.02 container ... reduced DSv3 performance ... on "
                                         "H100'): the dispatcher the run used is n/f (dispatchers are recorded, not priced)")
                        if not c.moe_a2a_overlap:
                            notes.append("moe_a2a_overlap not set in the workload config (default False, scripts/performance/utils/utils.py WorkloadBaseConfig): EP all-to-all not overlapped")
                    if c.cpu_offloading_num_layers:
                        notes.append(f"activation offloading: the workload config sets cpu_offloading_num_layers {c.cpu_offloading_num_layers} (the offloaded share is autopar's fill)")
                    if c.nccl_ub if hasattr(c, "nccl_ub") else False:
                        notes.append("nccl_ub (NCCL user-buffer registration) set: not priced")
                    if getattr(c, "pp_layout", None) and pp > 1:
                        chunks = parse_pp_layout(c.pp_layout)
                        if len(chunks) == pp * vp and sum(chunks) == NUM_LAYERS.get(zoo, sum(chunks)):
                            split = "/".join(map(str, split_over_ranks(chunks, pp)))
                            notes.append(f"pipeline split {split} (the recipe's pp_layout {c.pp_layout} over PP{pp} x VPP{vp}: chunk c on rank c mod {pp})")
                        else:
                            notes.append(f"pp_layout {c.pp_layout} does not parse to PP{pp} x VPP{vp} chunks: pipeline split n/f (balanced)")
                    elif zoo == "deepseek_v3" and pp > 1:
                        chunks = layout_map_chunks(tag, pp, vp)
                        if chunks and len(chunks) == pp * vp and sum(chunks) == 61:
                            split = "/".join(map(str, split_over_ranks(chunks, pp)))
                            notes.append(f"pipeline split {split} (no pp_layout in the workload config: Megatron-Bridge@{tag} src/megatron/bridge/recipes/deepseek/deepseek_v3.py layout_map[({pp}, {vp})], chunk c on rank c mod {pp})")
                        else:
                            notes.append(f"pipeline split n/f: no pp_layout and no layout_map[({pp}, {vp})] at {tag} (balanced)")
                else:
                    section = f"{cont} Pre-Training Performance; Megatron-Bridge@{tag} scripts/performance/configs/ (no workload config matches this layout)"
                    notes.append(f"recipe n/f: no {cprefix} {cgpu} {CFG_PREC[prec]} workload config at {tag} has the published layout (TP{tp} PP{pp} CP{cp} VP{vp} EP{ep} MBS{mbs} GBS{gbs} FSDP {fsdp}); switches left at the stack's defaults")
                # switches every release's recipe sets (cited per tag)
                if tp > 1:
                    tpo, where = tp_overlap(tag, fam, zoo, cgpu, prec)
                    if tpo:
                        knobs.insert(0, f"tp_overlap={tpo}")
                        notes.append(f"TP comm overlap {'off' if tpo == 'none' else 'on (userbuffers)'}: Megatron-Bridge@{tag} {where}")
                    else:
                        notes.append(f"TP comm overlap n/f at {tag} ({where}): the stack's default, userbuffers")
                if prec in ("fp8", "mxfp8"):
                    knobs.append("fp8_param_gather=on")
                knobs.append("cross_entropy=te")
                notes.append(f"cross entropy: Transformer Engine's Triton kernel (Megatron-Bridge@{tag} scripts/performance/"
                             "utils/overrides.py _set_common_perf_overrides: cross_entropy_fusion_impl 'te'; before TE "
                             "v2.18, which every release here pins, it writes the logit gradient in place into the "
                             "bf16 logits)")
                notes.append(f"distributed optimizer{' with Megatron-FSDP (use_megatron_fsdp)' if fsdp else ' (ZeRO-1)'}, bf16 gradient reduction (grad_reduce_in_fp32 False in every family's *_llm_pretrain.py at {tag}), overlapped grad reduce / param gather (Bridge perf recipes)")
                if zoo in MOE:
                    notes.append("force-balanced MoE routing (moe_router_force_load_balancing in the recipe; the page's footnote: 'we force-balance the token distribution among experts and all benchmarks are token-dropless')")
                if len(precs) > 1:
                    notes.append("the page's 'A (B)' cell: the parenthesised figure is the FP8-MX run of the same layout")
                src = (f"NVIDIA-NeMo/Megatron-Bridge@{PAGE_REV} docs/performance-summary-archive.md '{cont} NeMo Container'; "
                       f"recipe flags: Megatron-Bridge@{tag} scripts/performance/configs/ (tag: {why_tag})")
                row = dict.fromkeys(header, "")
                row.update(id=rid, source=src, source_section=section, model=zoo, system=hw, gpus=gpus, precision=prec,
                           seq_len=seq, global_batch=gbs, micro_batch=mbs, tp=tp, pp=pp, vpp=vp, cp=cp, ep=ep,
                           etp=(c.expert_tensor_parallel_size or "") if cands and zoo in MOE else "",
                           fsdp=1 if fsdp else 0, sequence_parallel=1 if tp > 1 else 0, recompute=recompute,
                           tokens_per_s_per_gpu=tok, notes="; ".join(notes), stack="megatron_core", knobs=",".join(knobs))
                out.append(row)
    long_rows, long_skipped = nemo_long_rows(header)
    out += long_rows
    skipped += long_skipped
    w = csv.DictWriter(sys.stdout, fieldnames=header, lineterminator="\n")
    w.writeheader()
    w.writerows(out)
    print("\n".join(skipped), file=sys.stderr)
    print(f"{len(out)} rows, {len(skipped)} skipped", file=sys.stderr)

# --- NeMo's long-sequence (context-parallel) runs: NVIDIA/NeMo docs/source/performance/performance_long_sequence.md

LONG_PAGE = "docs/source/performance/performance_long_sequence.md"
LONG_FIRST_B200 = "14d427f575"   # the page's first B200 table (2025-04-28), whose '# of GPUs' is TP*PP*DP*CP
NEMO_TAG = "v2.3.0rc2"           # NeMo r2.3.0 rc2, taken for the 'NeMo25.04.rc2' container (the names; 25.04-alpha.rc2
                                 # sets the same switches: fp8 param gather, delayed scaling, tp_comm_overlap False)
LAUNCHER_TAG = "24.03.01"
FLOPS_NOTE = ("throughput: the page's TFLOPS/GPU, counted with NeMo's model FLOPs (NeMo@v2.3.0rc2 nemo/utils/"
              "flops_formulas.py llama2/llama3, used by FLOPsMeasurementCallback: l*h^2*(12 + 12g/a + 18f/h + 12s/h + "
              "6V/(l*h)) per token, full s x s attention, no recompute), which is Megatron-Core's formula "
              "(autopar validate converts nemolong rows with it, non-causal)")
LONG = {  # page heading -> zoo model, id short, system, id chip, recipe
    "LLAMA3-8B (FP8) - B200": dict(model="llama3_8b", short="l3-8b", system="b200", chip="b200", container="NeMo25.04.rc2"),
    "LLAMA2-7B (FP8) - H100": dict(model="llama2_7b", short="l2-7b", system="h100_sxm", chip="h100", container="NeMo24.03.01.framework"),
}
# (repository, revision, path, text the row's note relies on)
LONG_CITED = {
    "b200": [
        ("nemo", NEMO_TAG, "scripts/performance/llm/pretrain_llama3_8b.py", "pretrain_recipe(performance_mode=True)"),
        ("nemo", NEMO_TAG, "scripts/performance/llm/pretrain_llama3_8b.py", "recipe.trainer.plugins = bf16_with_fp8_mixed()"),
        ("nemo", NEMO_TAG, "scripts/performance/llm/pretrain_llama3_8b.py", "recipe.trainer.plugins.grad_reduce_in_fp32 = False"),
        ("nemo", NEMO_TAG, "nemo/collections/llm/recipes/precision/mixed_precision.py", "cfg.fp8_params = True"),
        ("nemo", NEMO_TAG, "nemo/collections/llm/recipes/precision/mixed_precision.py", "cfg.fp8_amax_history_len = 1024"),
        ("nemo", NEMO_TAG, "nemo/collections/llm/recipes/llama3_8b.py", "tp_comm_overlap=False"),
        ("nemo", NEMO_TAG, "nemo/collections/llm/recipes/llama3_8b.py", "global_batch_size=512, micro_batch_size=1"),
        ("nemo", NEMO_TAG, "scripts/performance/utils.py", "recipe.trainer.strategy.sequence_parallel = bool(tp_size > 1)"),
        ("nemo", NEMO_TAG, "nemo/utils/flops_formulas.py", "+ (12 * config.enc_seq_len / config.hs)"),
    ],
    "h100": [
        ("launcher", LAUNCHER_TAG, "launcher_scripts/conf/training/llama/llama2_7b.yaml", "micro_batch_size: 1"),
        ("launcher", LAUNCHER_TAG, "launcher_scripts/conf/training/llama/llama2_7b.yaml", "virtual_pipeline_model_parallel_size: null"),
        ("launcher", LAUNCHER_TAG, "launcher_scripts/conf/training/llama/llama2_7b.yaml", "ub_tp_comm_overlap: False"),
        ("launcher", LAUNCHER_TAG, "launcher_scripts/conf/training/llama/llama2_7b.yaml", "bias_dropout_add_fusion: false"),
        ("launcher", LAUNCHER_TAG, "launcher_scripts/conf/training/llama/llama2_7b.yaml", "activations_checkpoint_granularity: null"),
        ("launcher", LAUNCHER_TAG, "launcher_scripts/conf/training/llama/llama2_7b.yaml", "fp8_amax_history_len: 1024"),
        ("launcher", LAUNCHER_TAG, "launcher_scripts/conf/training/llama/llama2_7b.yaml", "name: distributed_fused_adam"),
        ("nemo", NEMO_TAG, "nemo/utils/flops_formulas.py", "def llama2(config: FLOPSConfig):"),
    ],
}
LONG_RECIPE = {
    "b200": (f"recipe: NeMo@{NEMO_TAG} scripts/performance/llm/pretrain_llama3_8b.py (pretrain_recipe(performance_mode="
             "True); fp8: recipes/precision/mixed_precision.py bf16_with_fp8_mixed, delayed scaling 'hybrid', amax "
             "history 1024, fp8_params True (fp8 parameter all-gather); grad_reduce_in_fp32 False) with recipes/"
             "llama3_8b.py pretrain_performance_optimizations (MegatronCommOverlapCallback(tp_comm_overlap=False): TP "
             "overlap off) and scripts/performance/utils.py set_primary_perf_configs (sequence_parallel = TP > 1); "
             "micro-batch 1: the base recipe's MockDataModule (the page states no MBS); the script takes no sequence "
             "length at this tag, so these are the release's nearest stated switches, not the runs' own command lines; "
             "recompute n/f: the recipe sets none, the page does not say what its long runs used (autopar's fill); CP "
             "communication: NeMo sets no cp_comm_type, Megatron-Core's default p2p (Transformer Engine's ring); "
             "distributed optimizer (distributed_fused_adam_with_cosine_annealing) with overlapped grad reduce and param "
             "gather (recipes/llama3_8b.py trainer)"),
    "h100": (f"recipe: NVIDIA/NeMo-Framework-Launcher@{LAUNCHER_TAG} launcher_scripts/conf/training/llama/llama2_7b.yaml "
             "(NeMo 1.23's training recipes live in the launcher): micro_batch_size 1, virtual pipeline null, ub_tp_comm_overlap False "
             "(TP overlap off), bias_dropout_add_fusion false, fp8 delayed scaling (fp8_hybrid, amax history 1024; the "
             "yaml sets fp8 False, the run turned it on), distributed_fused_adam with overlapped grad and param sync; "
             "the page's layouts override the yaml's TP/PP and sequence length; recompute n/f: the yaml sets none "
             "(activations_checkpoint_granularity null), the page does not say what its long runs used (autopar's "
             "fill); sequence parallel n/f: the yaml sets false for TP 1 (autopar's fill, on with TP > 1); CP "
             "communication: Megatron-Core of that release has only Transformer Engine's p2p ring; the run's FLOPs "
             "accounting: NeMo 1.23 has none, the NeMo 2 llama2 formula reproduces NeMo 24.07's Llama2-7B H100 row "
             "(780 TFLOPS <-> 16,934 tokens/s/GPU, 0.05%; data/published_runs.csv nemo2407-l2-7b-h100-8), so it is taken"),
}
LONG_KNOBS = {"b200": "tp_overlap=none,fp8_param_gather=on", "h100": "tp_overlap=none,bias_dropout_add_fusion=off"}


def _git_show(repo: str, rev: str, path: str) -> str:
    return subprocess.check_output(["git", "-C", repo, "show", f"{rev}:{path}"], text=True)


def _html_rows(block: str) -> list[list[str]]:
    """The <tbody> rows of an HTML table, as cell texts ('1,671' -> '1671'; footnote marks dropped)."""
    body = block.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    rows = []
    for tr in re.findall(r"<tr>(.*?)</tr>", body, re.S):
        cells = [re.sub(r"<sup>.*?</sup>", "", c).strip().replace(",", "") for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)]
        rows.append(cells)
    return rows


def nemo_long_rows(header: list[str]) -> tuple[list[dict], list[str]]:
    """One row per stated layout of NeMo's long-sequence tables (the 'With CP' columns); a 'Without CP' figure is the
    same run where CP is 1 and has no stated layout otherwise (the page: 'the most performant model- and data-
    parallel configurations without CP'), so it is no row of its own."""
    repos = {"nemo": NEMO, "launcher": LAUNCHER}
    rev = subprocess.check_output(["git", "-C", NEMO, "rev-parse", "--short=10", "HEAD"], text=True).strip()
    page = _git_show(NEMO, "HEAD", LONG_PAGE)
    first = _git_show(NEMO, LONG_FIRST_B200, LONG_PAGE)
    first_gpus = {int(m.group(1)): int(m.group(2)) for m in re.finditer(r"^\| (\d+)\s+\| (\d+)\s+\|", first, re.M)}
    for chip, cites in LONG_CITED.items():
        for repo, tag, path, text in cites:
            assert text in _git_show(repos[repo], tag, path), f"{repo}@{tag} {path}: '{text}' not found"
    out, skipped = [], []
    for block in page.split("\n## ")[1:]:
        heading = block.splitlines()[0].strip()
        spec = LONG[heading]
        m = re.search(r"Container: \[([^\]]+)\]", block)
        assert m and m.group(1) == spec["container"], heading
        chip = spec["chip"]
        for cells in _html_rows(block):
            seq_k, gpus_cell, gbs, no_cp, tp, pp, dp, cp, tflops, speedup = cells
            tp, pp, dp, cp, gbs = int(tp), int(pp), int(dp), int(cp), int(gbs)
            gpus = tp * pp * dp * cp
            rid = f"nemolong-{spec['short']}-{chip}-{seq_k}k-cp{cp}"
            notes = [f"the page's 'With CP' row: SeqLen {seq_k}K, TP {tp}, PP {pp}, DP {dp}, CP {cp}, Batch Size {gbs} "
                     f"(the global batch in sequences: SeqLen x Batch Size = {int(seq_k) * 1024 * gbs:,} tokens, as "
                     f"on every row of the table), {tflops} TFLOPS/GPU"]
            if int(gpus_cell) != gpus:
                was = first_gpus.get(int(seq_k))
                notes.append(f"'# of GPUs' {gpus_cell} at the page's HEAD is not TP*PP*DP*CP = {gpus}"
                             + (f"; the table's first version (NVIDIA/NeMo@{LONG_FIRST_B200}) printed {was}" if was else "")
                             + f": gpus = {gpus}")
            if cp == 1:
                notes.append(f"its 'Without CP' figure ({no_cp} TFLOPS/GPU, speedup {speedup}) is this run")
            elif no_cp in ("", "-"):
                notes.append("no 'Without CP' figure (the page's footnote 1: it does not fit without CP)")
            else:
                notes.append(f"the page's 'Without CP' figure ({no_cp} TFLOPS/GPU, speedup {speedup}) states no layout: "
                             "not a row")
                skipped.append(f"- nemolong | {heading} {seq_k}K without CP ({no_cp} TFLOPS/GPU) | the page states no "
                               "layout for its runs without CP")
            notes += [FLOPS_NOTE, LONG_RECIPE[chip]]
            src = (f"NVIDIA/NeMo@{rev} {LONG_PAGE} '{heading}' (container {spec['container']}, "
                   f"{'DGX-B200' if chip == 'b200' else 'DGX-H100'})")
            section = ("'With CP' columns; recipe flags: " + (f"NVIDIA/NeMo@{NEMO_TAG} scripts/performance/llm/"
                       "pretrain_llama3_8b.py" if chip == "b200" else f"NVIDIA/NeMo-Framework-Launcher@{LAUNCHER_TAG} "
                       "launcher_scripts/conf/training/llama/llama2_7b.yaml"))
            row = dict.fromkeys(header, "")
            row.update(id=rid, source=src, source_section=section, model=spec["model"], system=spec["system"],
                       gpus=gpus, precision="fp8", seq_len=int(seq_k) * 1024, global_batch=gbs, micro_batch=1, tp=tp,
                       pp=pp, vpp=1, cp=cp, ep=1, dp=dp, fsdp=0, sequence_parallel=(1 if tp > 1 else 0) if chip == "b200"
                       else "", model_tflops_per_gpu=tflops, notes="; ".join(notes), stack="megatron_core",
                       knobs=LONG_KNOBS[chip])
            out.append(row)
    return out, skipped


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
