"""Write the Megatron-Bridge override-key fixture the ``--emit bridge`` tests check against.

A key such as ``model.tensor_model_parallel_size`` is valid when the field exists on the dataclass that Megatron-Bridge's
``ConfigContainer`` (src/megatron/bridge/training/config.py) holds in that section. Each section's class derives from a
Megatron-Core / Megatron-Training dataclass; the generator imports those bases from the Megatron-LM commit that Bridge
pins as its submodule (3rdparty/Megatron-LM) and adds the fields Bridge's own subclasses declare (read with ``ast``, so
Bridge's heavy imports are not needed). ``mixed_precision`` takes a recipe name: the ``@register``-ed functions of
src/megatron/bridge/training/mixed_precision.py.

Usage (from the autopar repo root; needs torch, CPU is enough):

    git -C Megatron-Bridge checkout <commit>; git -C Megatron-LM checkout <Bridge's 3rdparty/Megatron-LM commit>
    python tools/gen_bridge_keys.py --bridge Megatron-Bridge --bridge-commit <commit> --megatron Megatron-LM \
        --megatron-commit <commit> --out tests/emit/fixtures/bridge_keys.json

Megatron modules with hard triton imports are stubbed as in tools/gen_megatron_args.py.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import json
import re
import sys
import typing
from pathlib import Path

from _source import annotated_fields   # tools/_source.py (the script's folder is on sys.path)

STUBBED = ("megatron.core.transformer.moe.ops", "megatron.core.ssm.ops")
# section -> (Megatron base "module:Class" list, Bridge subclasses "path:Class" in inheritance order)
SECTIONS = {
    "model": (["megatron.core.transformer.transformer_config:TransformerConfig"],
              ["models/transformer_config.py:TransformerConfig", "models/gpt_provider.py:GPTModelProvider"]),
    "ddp": (["megatron.core.distributed.distributed_data_parallel_config:DistributedDataParallelConfig"],
            ["training/config.py:DistributedDataParallelConfig"]),
    "optimizer": (["megatron.core.optimizer.optimizer_config:OptimizerConfig"], ["training/config.py:OptimizerConfig"]),
    "train": (["megatron.training.config:TrainingConfig"], ["training/config.py:TrainingConfig"]),
    "dataset": (["megatron.core.datasets.gpt_dataset:GPTDatasetConfig"],
                ["data/base.py:DataloaderConfig", "training/config.py:GPTDatasetConfig"]),
    "checkpoint": (["megatron.training.config:CheckpointConfig"], ["training/config.py:CheckpointConfig"]),
    "dist": (["megatron.training.config.common_config:DistributedInitConfig"],
             ["training/config.py:DistributedInitConfig"]),
    "comm_overlap": ([], ["training/comm_overlap.py:CommOverlapConfig"]),
    # the Llama 2/3 recipes (recipes/llama/h100/llama{2,3}.py: AutoBridge...get_model_config()) build
    # BridgeGPTModelConfig: its own fields are model.X, the TransformerConfig's are model.transformer.X
    "model_gpt_config": (["megatron.training.models.gpt:GPTModelConfig"],
                         ["models/gpt/gpt_builder.py:GPTModelConfig", "models/gpt/model_config.py:BridgeGPTModelConfig"]),
    "model_transformer": (["megatron.core.transformer.transformer_config:TransformerConfig"],
                          ["models/transformer_config.py:TransformerConfig"]),
    # the model section of a hybrid (Mamba / GDN) recipe: HybridModelProvider instead of GPTModelProvider
    "model_hybrid": (["megatron.core.transformer.transformer_config:TransformerConfig"],
                     ["models/transformer_config.py:TransformerConfig",
                      "models/hybrid/hybrid_provider.py:HybridModelProvider"]),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bridge", required=True, type=Path, help="Megatron-Bridge source tree (with src/)")
    ap.add_argument("--bridge-commit", required=True)
    ap.add_argument("--megatron", required=True, type=Path, help="Megatron-LM tree at Bridge's pinned commit")
    ap.add_argument("--megatron-commit", required=True)
    ap.add_argument("--out", required=True, type=Path)
    a = ap.parse_args()
    sys.path.insert(0, str(a.megatron.resolve()))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if not hasattr(typing, "override"):
        typing.override = lambda f: f
    import _stub_imports
    _stub_imports.install(set(STUBBED))
    src = a.bridge / "src" / "megatron" / "bridge"
    sections = {}
    for name, (bases, subclasses) in SECTIONS.items():
        fields: dict[str, str] = {}
        for spec in bases:
            module, cls = spec.split(":")
            for f in dataclasses.fields(getattr(importlib.import_module(module), cls)):
                fields[f.name] = str(f.type) if not isinstance(f.type, type) else f.type.__name__
        for spec in subclasses:
            path, cls = spec.split(":")
            fields.update(annotated_fields(ast.parse((src / path).read_text()), cls))
        sections[name] = dict(sorted(fields.items()))
    mp = (src / "training/mixed_precision.py").read_text()
    recipes = sorted(set(re.findall(r"@register\s*\ndef (\w+)\(", mp)))
    info = (src / "package_info.py").read_text()
    version = ".".join(re.search(rf"^{k} = (\d+)", info, re.M).group(1) for k in ("MAJOR", "MINOR", "PATCH"))
    fixture = {
        "source": {"repo": "https://github.com/NVIDIA-NeMo/Megatron-Bridge", "commit": a.bridge_commit,
                   "version": version, "megatron_lm_commit": a.megatron_commit},
        "command": "python tools/gen_bridge_keys.py --bridge <Megatron-Bridge tree> --bridge-commit "
                   f"{a.bridge_commit} --megatron <Megatron-LM tree> --megatron-commit {a.megatron_commit} "
                   f"--out {a.out.as_posix()}",
        "sections": sections,
        "mixed_precision_recipes": recipes + [r.replace("_", "-") for r in recipes if "_" in r],
    }
    a.out.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"Megatron-Bridge {version} ({a.bridge_commit[:12]}): "
          + ", ".join(f"{k} {len(v)}" for k, v in sections.items()) + f", {len(recipes)} precision recipes -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
