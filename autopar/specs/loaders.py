"""Load specs from a zoo name, a YAML file, or a Hugging Face ``config.json``.

Zoo files live in the repository's ``models/`` and ``hardware/`` folders; a wheel carries them under
``autopar/_zoo/``. Every failure is an :class:`AutoparInputError` that names the file and the field.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from autopar.errors import AutoparInputError
from autopar.specs._base import build_spec, format_validation_error
from autopar.specs.hardware import HardwareSpec
from autopar.specs.hf_config import model_from_hf_config
from autopar.specs.model import ModelSpec

__all__ = ["build_spec", "dump_spec", "format_validation_error", "load_hardware", "load_model",
           "read_structured_file", "zoo_dir", "zoo_names"]

_PKG = Path(__file__).resolve().parents[1]
_ZOO_DIRS = {kind: [_PKG / "_zoo" / kind, _PKG.parent / kind] for kind in ("models", "hardware")}


def zoo_dir(kind: str) -> Path:
    """The folder holding the zoo files of ``kind`` ('models' or 'hardware')."""
    for d in _ZOO_DIRS[kind]:
        if d.is_dir():
            return d
    raise AutoparInputError(f"the {kind} zoo folder is missing (looked in {', '.join(map(str, _ZOO_DIRS[kind]))})")


def zoo_names(kind: str) -> list[str]:
    return sorted(p.stem for p in zoo_dir(kind).glob("*.yaml"))


def read_structured_file(path: Path) -> Any:
    """Parse a YAML or JSON file; syntax errors become AutoparInputError with the line."""
    try:
        text = path.read_text()
    except OSError as err:
        raise AutoparInputError(f"cannot read {path}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise AutoparInputError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason})") from None
    try:
        if path.suffix == ".json":
            return json.loads(text)
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except json.JSONDecodeError as err:
        raise AutoparInputError(f"{path}: malformed JSON at line {err.lineno} column {err.colno}: {err.msg}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise AutoparInputError(f"{path}: malformed YAML{at}: {getattr(err, 'problem', err)}") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key written twice in one mapping (YAML would silently keep the last)."""

    def construct_mapping(self, node, deep=False):  # type: ignore[override]
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key '{key}'", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_LABEL = {"models": "model", "hardware": "hardware"}


def _resolve(ref: str | Path, kind: str) -> Path:
    path = Path(ref)
    label = _LABEL[kind]
    if path.suffix in (".yaml", ".yml", ".json") or path.exists():
        if not path.exists():
            raise AutoparInputError(f"{label} file not found: {path}")
        if path.is_dir() and (path / "config.json").exists():
            return path / "config.json"
        return path
    candidate = zoo_dir(kind) / f"{ref}.yaml"
    if candidate.exists():
        return candidate
    names = zoo_names(kind)
    raise AutoparInputError(f"unknown {label} '{ref}': not a file and not in the zoo ({', '.join(names)})")


def load_model(ref: str | Path | ModelSpec, *, warn: Any = None) -> ModelSpec:
    """A ModelSpec from a zoo name, a YAML file or a Hugging Face config.json (or a folder holding one).

    For a Hugging Face config, keys that could not be mapped are reported through ``warn`` (a callable
    taking a string; default: printed to stderr)."""
    if isinstance(ref, ModelSpec):
        return ref
    path = _resolve(ref, "models")
    data = read_structured_file(path)
    if isinstance(data, dict) and ("model_type" in data or "architectures" in data):
        spec, unmapped = model_from_hf_config(data, name=path.parent.name if path.name == "config.json"
                                              else path.stem, where=str(path))
        if unmapped:
            (warn or (lambda m: print(m, file=sys.stderr)))(
                f"note: {path}: keys not used by autopar's model: {', '.join(sorted(unmapped))}")
        return spec
    return build_spec(ModelSpec, data, str(path))


def load_hardware(ref: str | Path | HardwareSpec) -> HardwareSpec:
    """A HardwareSpec from a zoo name or a YAML file."""
    if isinstance(ref, HardwareSpec):
        return ref
    path = _resolve(ref, "hardware")
    return build_spec(HardwareSpec, read_structured_file(path), str(path))


def dump_spec(spec: BaseModel, path: Path, header: str = "") -> None:
    """Write a spec as YAML (round-trips through load_model / load_hardware). Never overwrites silently:
    callers decide; this writes to ``path`` via a temporary file so a crash leaves the old file intact."""
    data = spec.model_dump(mode="json", exclude_defaults=False)
    text = (header + "\n" if header else "") + yaml.safe_dump(data, sort_keys=False)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
