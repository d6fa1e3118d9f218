"""Property test: whatever a user types or feeds in, the CLI keeps its exit promise.

Hypothesis generates argv lists for every command (flags with good, edge and junk values) and mutated input files
(model YAML, Hugging Face config.json, hardware YAML, runs CSV, layout lists, training YAML). Each case runs through
the CLI entry in-process (``autopar.cli.main.main``) and must end with exit 0, a documented exit 1, or exit 2 and
exactly one ``autopar: error:`` line; never a traceback, never a hang (see clirun.py: a 20 s alarm per case).

Deterministic: ``derandomize=True`` draws the same cases on every run (no example database), and ``deadline=None``
leaves timing to the per-case alarm, which only a real hang trips. No case starts a real run: ``profile run`` and
``tune`` get only inputs that fail before any process is launched (a bad flag value is always among their flags).
"""

from __future__ import annotations

import copy
import csv
import io
import json
import os
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autopar.specs.loaders import zoo_dir

from specs.test_hf_config import DEEPSEEK_V3, GPT_OSS_120B, LLAMA4_MAVERICK, LLAMA31_8B, MIXTRAL_8X7B, QWEN3_30B_A3B
from .clirun import check_promise, run_cli

# CI: 30 fixed cases per test. A deeper hunt: AUTOPAR_FUZZ_EXAMPLES=2000 AUTOPAR_FUZZ_RANDOM=1 (new cases each run).
FUZZ = settings(max_examples=int(os.environ.get("AUTOPAR_FUZZ_EXAMPLES", "30")), deadline=None,
                derandomize=not os.environ.get("AUTOPAR_FUZZ_RANDOM"), database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---- values ------------------------------------------------------------------------------------------------------
EDGE_NUMBERS = ["0", "-1", "-5", "1", "2", "3", "7", "8", "64", "1024", "1048576", "1048577", "2147483648",
                "9" * 400, "1e308", "1.5", "nan", "inf", "-inf", "", " ", "0x10", "1_000", "١٢", "+4"]
JUNK = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
NUMBER = st.one_of(st.sampled_from(EDGE_NUMBERS), st.integers(-3, 130).map(str), JUNK)
GPUS = st.one_of(st.sampled_from(["1", "2", "4", "8", "16", "64"]), NUMBER)
LIST = st.one_of(st.lists(st.integers(-1, 70), max_size=4).map(lambda v: ",".join(map(str, v))),
                 st.sampled_from(["0", "0,1,2,3", "3", "4", "1,,2", ",", "9" * 400, "2,x"]), NUMBER)
RECOMPUTE = st.one_of(st.sampled_from(["none", "full", "selective", "none;full", "core_attn,mlp", "bogus", ";",
                                       "moe", "mla_up_proj", "none;bogus", ""]), JUNK)
SECONDS = st.one_of(st.sampled_from(["5", "0.5", "nan", "inf", "-5", "0", "1e9", "86400", "x"]), JUNK)
MODELS = st.one_of(st.sampled_from(["llama3_8b", "llama2_7b", "olmoe", "mixtral_8x7b"]),
                   st.sampled_from(["no_such_model", "x" * 300, "", "/", "a/b.yaml", "..", "models", "\x7f"]))
SMALL_MODELS = st.sampled_from(["llama3_8b", "olmoe"])


@st.composite
def flags(draw, options: dict[str, st.SearchStrategy | None]) -> list[str]:
    """Any subset of ``options`` (flag -> value strategy, None for a switch), as an argv fragment."""
    out: list[str] = []
    for flag, values in options.items():
        if draw(st.booleans()):
            out.append(flag)
            if values is not None:
                out.append(draw(values))
    return out


SEARCH_FLAGS = {"--tp": LIST, "--pp": LIST, "--vpp": LIST, "--cp": LIST, "--ep": LIST, "--etp": LIST, "--mbs": LIST,
                "--zero": LIST, "--recompute": RECOMPUTE, "--max-tp": NUMBER, "--fsdp": None, "--no-cp": None,
                "--no-sp": None, "--allow-cross-domain": None, "--time-limit": SECONDS}
PROBLEM_FLAGS = {"--seq-len": NUMBER, "--global-batch": NUMBER, "--hardware": st.sampled_from(
                 ["h100_sxm", "a100_80gb", "gb200_nvl72", "tpu", ""]), "--precision": st.sampled_from(
                 ["bf16", "fp8", "nvfp4", "int4"])}
LAYOUT_FLAGS = {"--tp": NUMBER, "--pp": NUMBER, "--vpp": NUMBER, "--cp": NUMBER, "--ep": NUMBER, "--etp": NUMBER,
                "--mbs": NUMBER, "--zero": NUMBER, "--fsdp": None, "--hsdp": NUMBER, "--recompute": RECOMPUTE,
                "--stage-layers": LIST, "--no-sp": None, "--sp": None, "--offload-activations": NUMBER}
# One of these always goes with `tune` and `profile run`: each fails before anything is launched.
BAD_RUN_FLAGS = st.sampled_from([["--time-limit", "nan"], ["--time-limit", "-5"], ["--recompute", "bogus"],
                                 ["--zero", "4"], ["--tp", "0"], ["--gpus", "0"], ["--layers", "2147483648"],
                                 ["--seq-len", "9" * 400], ["--trials", "0"], ["--timeout", "inf"],
                                 ["--storage", "bogus://x"], ["--steps", "2", "--warmup", "2"],
                                 ["--model", "x" * 300], ["--emit-out", "x.env"]])


@st.composite
def argv_cases(draw) -> list[str]:
    cmd = draw(st.sampled_from(["solve", "estimate", "zoo", "profile spec", "tune", "profile run", "junk"]))
    if cmd == "solve":
        # Small problems only: the property is about bad input, not about the speed of large searches.
        argv = ["solve", "--model", draw(st.one_of(SMALL_MODELS, MODELS)), "--gpus", draw(GPUS), "--time-limit", "5"]
        argv += draw(flags(SEARCH_FLAGS)) + draw(flags(PROBLEM_FLAGS))
        argv += draw(flags({"--top-k": NUMBER, "--search": st.sampled_from(["cpsat", "heuristic", "x"]),
                            "--json": None, "--emit": st.sampled_from(["megatron", "env", "x"]),
                            "--offload-activations": NUMBER}))
    elif cmd == "estimate":
        argv = ["estimate", "--model", draw(MODELS), "--gpus", draw(GPUS)]
        argv += draw(flags(LAYOUT_FLAGS)) + draw(flags(PROBLEM_FLAGS)) + draw(flags({"--json": None}))
    elif cmd == "zoo":
        argv = ["zoo"] + draw(flags({"--json": None})) + draw(st.sampled_from([[], ["models"], ["hardware"],
                                                                                 ["x"]]))
    elif cmd == "profile spec":
        argv = ["profile", "spec", "--model", draw(MODELS), "--gpus", draw(GPUS), "-o", "{tmp}/spec.json"]
        argv += draw(flags({"--layers": NUMBER, "--hidden": NUMBER, "--heads": NUMBER, "--vocab": NUMBER,
                            "--steps": NUMBER, "--warmup": NUMBER, "--seed": NUMBER, "--timeout": SECONDS,
                            "--tp": NUMBER, "--pp": NUMBER, "--mbs": NUMBER, "--seq-len": NUMBER}))
    elif cmd in ("tune", "profile run"):
        argv = cmd.split() + ["--model", "llama3_8b", "--gpus", "1"] + draw(flags({"--json": None}))
        argv += draw(BAD_RUN_FLAGS)
        if cmd == "profile run":
            argv = [a for a in argv if a not in ("--trials", "--storage", "--emit-out")]
    else:
        argv = draw(st.lists(st.one_of(JUNK, st.sampled_from(["--help", "-h", "--json", "solve", "--gpus"])),
                             max_size=4))
    return argv


@FUZZ
@given(argv=argv_cases())
def test_any_argv_keeps_the_exit_promise(argv):
    with tempfile.TemporaryDirectory() as tmp:
        check_promise(run_cli([a.replace("{tmp}", tmp) for a in argv]))


# ---- mutated files -----------------------------------------------------------------------------------------------
def _zoo(kind: str, name: str) -> dict:
    return yaml.safe_load((zoo_dir(kind) / f"{name}.yaml").read_text())


VALUES = st.one_of(
    st.integers(-5, 300), st.sampled_from([0, -1, 10_000_000, 2 ** 31, 2 ** 63, 10 ** 30, True, None]),
    st.floats(allow_nan=True, allow_infinity=True), JUNK, st.lists(st.integers(-2, 70), max_size=4),
    st.dictionaries(JUNK, st.integers(), max_size=2), st.sampled_from(["x" * 300, "sliding_attention", "llama"]))


@st.composite
def mutated_mapping(draw, base: dict) -> dict:
    """``base`` with a few keys set to odd values, removed, added or nested (one level of sub-mappings too)."""
    data = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        target = data
        subs = [k for k, v in data.items() if isinstance(v, dict)]
        if subs and draw(st.booleans()):
            target = data[draw(st.sampled_from(subs))]
        keys = list(target) or ["x"]
        op = draw(st.sampled_from(["set", "set", "set", "drop", "add", "nest"]))
        key = draw(st.sampled_from(keys))
        if op == "set":
            target[key] = draw(VALUES)
        elif op == "drop":
            target.pop(key, None)
        elif op == "add":
            target[draw(JUNK)] = draw(VALUES)
        else:
            value: object = draw(VALUES)
            for _ in range(draw(st.integers(2, 50))):
                value = [value]
            target[key] = value
    return data


@st.composite
def file_text(draw, data: dict, fmt: str) -> bytes:
    """``data`` written as YAML or JSON, then maybe broken as text: cut short, a character replaced, a complex key,
    deep nesting, or bytes that are not UTF-8."""
    text = json.dumps(data) if fmt == "json" else yaml.safe_dump(data, sort_keys=False)
    op = draw(st.sampled_from(["keep", "keep", "keep", "cut", "char", "complex_key", "deep", "binary"]))
    if op == "cut":
        text = text[:draw(st.integers(0, len(text)))]
    elif op == "char":
        i = draw(st.integers(0, max(len(text) - 1, 0)))
        text = text[:i] + draw(st.sampled_from(list(":[]{}-?&*!|>'\"#%@`\t\n,") + ["\x00"])) + text[i + 1:]
    elif op == "complex_key":
        text = "? [a, b]\n: 1\n" + text if fmt == "yaml" else text
    elif op == "deep":
        n = draw(st.sampled_from([50, 2000, 20000]))
        text = ('{"x": ' + "[" * n + "]" * n + "}") if fmt == "json" else "x: " + "[" * n + "]" * n + "\n"
    elif op == "binary":
        return draw(st.binary(min_size=1, max_size=64)) + b"\xff\xfe"
    return text.encode("utf-8", "surrogatepass")


SPEC_BASES = [("model", "yaml", _zoo("models", "llama3_8b")), ("model", "yaml", _zoo("models", "deepseek_v3")),
              ("model", "json", LLAMA31_8B), ("model", "json", QWEN3_30B_A3B), ("model", "json", DEEPSEEK_V3),
              ("model", "json", GPT_OSS_120B), ("model", "json", LLAMA4_MAVERICK), ("model", "json", MIXTRAL_8X7B),
              ("hardware", "yaml", _zoo("hardware", "h100_sxm")), ("hardware", "yaml", _zoo("hardware", "gb200_nvl72")),
              ("training", "yaml", {"seq_len": 4096, "global_batch": 64, "precision": "bf16"}),
              ("layouts", "json", [{"tp": 2, "pp": 1}, {"tp": 1, "pp": 2, "micro_batch": 2}])]


@st.composite
def spec_file_cases(draw) -> tuple[str, str, bytes]:
    kind, fmt, base = draw(st.sampled_from(SPEC_BASES))
    if kind == "layouts":
        data = [draw(mutated_mapping(item)) for item in base]
        text = draw(file_text({"_": data}, fmt)).replace(b'{"_": ', b"", 1)
        return kind, fmt, text[:-1] if text.endswith(b"}") else text
    return kind, fmt, draw(file_text(draw(mutated_mapping(base)), fmt))


@FUZZ
@given(case=spec_file_cases(), gpus=st.sampled_from(["8", "64"]))
def test_mutated_spec_files_keep_the_exit_promise(case, gpus):
    kind, fmt, content = case
    with tempfile.TemporaryDirectory() as tmp:
        if kind == "model" and fmt == "json":
            (Path(tmp) / "m").mkdir()
            path = Path(tmp) / "m" / "config.json"      # a Hugging Face checkpoint folder
        else:
            path = Path(tmp) / f"{kind}.{fmt}"
        path.write_bytes(content)
        arg = str(path.parent if path.name == "config.json" else path)
        if kind == "model":
            argv = ["estimate", "--model", arg, "--gpus", gpus]
        elif kind == "hardware":
            argv = ["solve", "--model", "llama3_8b", "--hardware", arg, "--gpus", gpus, "--time-limit", "5", "--json"]
        else:   # profile compare reads both files, then refuses --steps 0 before it runs anything
            argv = ["profile", "compare", "--model", "llama3_8b", "--hardware", "h100_sxm", "--steps", "0"]
            argv += ["--training", arg, "--layouts", "tp=1"] if kind == "training" else ["--layouts-file", arg]
        check_promise(run_cli(argv))


# ---- runs CSV ----------------------------------------------------------------------------------------------------
def _runs() -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(io.StringIO((Path(__file__).parents[2] / "data" / "published_runs.csv").read_text())))
    small = [r for r in rows[1:] if r[3] in ("megatron_gpt_1.7b", "mcore_gpt_1.7b", "llama3_8b", "mixtral_8x7b")]
    return rows[0], small[:4] or rows[1:3]


HEADER, ROWS = _runs()
CELL = st.one_of(st.sampled_from(["", " ", "0", "-1", "nan", "inf", "1e400", "abc", "9" * 400, "1.5", "x" * 300,
                                  "none", "full", "bogus", "\x00"]), JUNK)


@st.composite
def runs_csv(draw) -> bytes:
    header = list(HEADER)
    rows = [list(r) for r in draw(st.lists(st.sampled_from(ROWS), min_size=0, max_size=3))]
    for row in rows:
        for _ in range(draw(st.integers(0, 3))):
            if not row:
                break
            op = draw(st.sampled_from(["cell", "cell", "cut", "extend"]))
            if op == "cell":
                row[draw(st.integers(0, len(row) - 1))] = draw(CELL)
            elif op == "cut":
                del row[draw(st.integers(0, len(row) - 1)):]
            else:
                row += ["1"] * draw(st.integers(1, 3))
    if draw(st.integers(0, 9)) == 0:
        header.remove(draw(st.sampled_from(header)))
    out = io.StringIO()
    csv.writer(out).writerows([header, *rows])
    text = out.getvalue().encode("utf-8", "surrogatepass")
    op = draw(st.sampled_from(["keep", "keep", "keep", "cut", "binary", "empty"]))
    if op == "cut":
        text = text[:draw(st.integers(0, len(text)))]
    elif op == "binary":
        text = draw(st.binary(min_size=1, max_size=64)) + b"\xff"
    elif op == "empty":
        text = b""
    return text


@FUZZ
@given(content=runs_csv(), extra=st.sampled_from([[], ["--json"]]))
def test_mutated_runs_csv_keeps_the_exit_promise(content, extra):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "runs.csv"
        path.write_bytes(content)
        check_promise(run_cli(["validate", "--csv", str(path), *extra]))
