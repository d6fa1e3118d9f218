"""Write the Megatron-LM argument fixture the emitter tests parse ``--emit megatron`` output with.

Builds Megatron-LM's own parser (``megatron.training.arguments.add_megatron_arguments``) from a Megatron-LM checkout and
records, for every option: its flag spellings, dest, argparse action kind, nargs, value type and choices. The test
(tests/emit/test_megatron_parser.py) rebuilds an argparse parser from these records and parses the emitted argv.

Usage (from the autopar repo root; needs torch, CPU is enough):

    git clone https://github.com/NVIDIA/Megatron-LM /tmp/mlm && git -C /tmp/mlm checkout <commit>
    python tools/gen_megatron_args.py --megatron /tmp/mlm --out tests/emit/fixtures/megatron_args.json

Two Megatron modules that hard-import triton GPU kernels (megatron.core.transformer.moe.ops, megatron.core.ssm.ops)
are replaced by empty stubs (tools/_stub_imports.py): they define kernels, no arguments. On Python < 3.12,
``typing.override`` (used as a no-op decorator by Megatron) is added as the identity.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import typing
from pathlib import Path

STUBBED = ("megatron.core.transformer.moe.ops", "megatron.core.ssm.ops")


def _kind(action: argparse.Action) -> str:
    for cls, name in ((argparse._StoreTrueAction, "store_true"), (argparse._StoreFalseAction, "store_false"),
                      (argparse._StoreConstAction, "store_const"), (argparse._AppendAction, "append"),
                      (argparse._CountAction, "count"), (argparse._StoreAction, "store")):
        if isinstance(action, cls):
            return name
    if isinstance(action, argparse.BooleanOptionalAction):
        return "boolean_optional"
    return type(action).__name__


def _type(action: argparse.Action) -> str:
    t = action.type
    if t in (int, float, str):
        return t.__name__
    if t is None:
        return "str"
    return "other:" + getattr(t, "__name__", type(t).__name__)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megatron", required=True, type=Path, help="Megatron-LM checkout")
    ap.add_argument("--out", required=True, type=Path)
    a = ap.parse_args()
    root = a.megatron.resolve()
    sys.path.insert(0, str(root))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if not hasattr(typing, "override"):
        typing.override = lambda f: f  # Python 3.12's no-op decorator
    import _stub_imports
    _stub_imports.install(set(STUBBED))
    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    options = []
    for act in parser._actions:
        if not act.option_strings or isinstance(act, argparse._HelpAction):
            continue
        rec = {"flags": list(act.option_strings), "dest": act.dest, "kind": _kind(act), "nargs": act.nargs,
               "type": _type(act)}
        if act.choices is not None:
            rec["choices"] = [c if isinstance(c, (str, int, float)) else str(c) for c in act.choices]
        if rec["kind"] == "store_const":
            rec["const"] = act.const if isinstance(act.const, (str, int, float, bool, type(None))) else str(act.const)
        options.append(rec)
    git = lambda *cmd: subprocess.run(["git", "-C", str(root), *cmd], capture_output=True, text=True,  # noqa: E731
                                      check=True).stdout.strip()
    info = (root / "megatron/core/package_info.py").read_text()
    version = ".".join(re.search(rf"^{k} = (\d+)", info, re.M).group(1) for k in ("MAJOR", "MINOR", "PATCH"))
    pre = re.search(r"^PRE_RELEASE = '([^']*)'", info, re.M).group(1)
    fixture = {
        "source": {"repo": "https://github.com/NVIDIA/Megatron-LM", "commit": git("rev-parse", "HEAD"),
                   "commit_date": git("log", "-1", "--format=%cI"), "megatron_core_version": version + pre},
        "command": "python tools/gen_megatron_args.py --megatron <Megatron-LM checkout at commit> "
                   f"--out {a.out.as_posix()}",
        "stubbed_modules": list(STUBBED),
        "options": sorted(options, key=lambda r: r["flags"][0]),
    }
    a.out.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"{len(options)} options from Megatron-LM {fixture['source']['commit'][:12]} "
          f"(Megatron-Core {fixture['source']['megatron_core_version']}) -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
