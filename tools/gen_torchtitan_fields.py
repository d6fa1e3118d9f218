"""Write the torchtitan config-field fixture the emitter tests check ``--emit torchtitan`` output against when
torchtitan itself is not installed.

Reads a torchtitan wheel (or an unpacked source tree) without importing it: the dataclass fields of
``ParallelismConfig``, ``TrainingConfig`` and ``CompileConfig`` (torchtitan/config/configs.py) and of
``OptimizersContainer.Config`` (torchtitan/components/optimizer/optimizer.py), with their annotations, and the config
functions of every ``torchtitan/models/*/config_registry.py``.

Usage (from the autopar repo root):

    pip download --no-deps torchtitan==0.3.0 -d /tmp/tt
    python tools/gen_torchtitan_fields.py --wheel /tmp/tt/torchtitan-0.3.0-py3-none-any.whl \
        --out tests/emit/fixtures/torchtitan_0.3.0_fields.json
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
import zipfile
from pathlib import Path

from _source import annotated_fields   # tools/_source.py (the script's folder is on sys.path)

CLASSES = ("ParallelismConfig", "TrainingConfig", "CompileConfig")
OPTIMIZER_FILE = "torchtitan/components/optimizer/optimizer.py"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    a = ap.parse_args()
    with zipfile.ZipFile(a.wheel) as zf:
        files = {n: zf.read(n).decode() for n in zf.namelist()
                 if n in ("torchtitan/config/configs.py", OPTIMIZER_FILE) or n.endswith("/config_registry.py")
                 and n.startswith("torchtitan/models/")}
        version = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA")).split("-")[1].split(".dist")[0]
    configs = ast.parse(files.pop("torchtitan/config/configs.py"))
    optimizer = ast.parse(files.pop(OPTIMIZER_FILE))
    container = next(n for n in optimizer.body if isinstance(n, ast.ClassDef) and n.name == "OptimizersContainer")
    registries = {}
    for path, text in sorted(files.items()):
        module = path[:-3].replace("/", ".")
        registries[module] = sorted(n.name for n in ast.parse(text).body
                                    if isinstance(n, ast.FunctionDef) and not n.name.startswith("_"))
    fixture = {
        "source": {"package": "torchtitan", "version": version, "wheel": a.wheel.name,
                   "sha256": hashlib.sha256(a.wheel.read_bytes()).hexdigest()},
        "command": f"python tools/gen_torchtitan_fields.py --wheel {a.wheel.name} --out {a.out.as_posix()}",
        "fields": {**{c: annotated_fields(configs, c) for c in CLASSES},
                   "OptimizersContainer.Config": annotated_fields(ast.Module(body=container.body, type_ignores=[]),
                                                                  "Config")},
        "config_functions": registries,
    }
    a.out.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"torchtitan {version}: {sum(map(len, fixture['fields'].values()))} fields, "
          f"{sum(map(len, registries.values()))} config functions -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
