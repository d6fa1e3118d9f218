"""Load specs from a zoo name, a YAML file, or a Hugging Face ``config.json``.

Zoo files live in the repository's ``models/`` and ``hardware/`` folders; a wheel carries them under
``autopar/_zoo/``. Every failure is an :class:`AutoparInputError` that names the file and the field.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from autopar.errors import AutoparInputError
from autopar.fileio import OutputFile, read_input, show_path
from autopar.specs._base import build_spec, format_validation_error
from autopar.specs.hardware import HardwareSpec
from autopar.specs.model import ModelSpec

__all__ = ["build_spec", "dump_spec", "format_validation_error", "load_hardware", "load_model", "load_stack",
           "read_structured_file", "zoo_dir", "zoo_names"]

_PKG = Path(__file__).resolve().parents[1]
# Installed from a wheel, the zoo and the validation data live in autopar/_zoo/ (pyproject.toml force-include); in a
# source checkout, in models/, hardware/ and data/ beside the package.
_ZOO_DIRS = {kind: [_PKG / "_zoo" / kind, _PKG.parent / kind] for kind in ("models", "hardware", "data", "stacks")}



def installed_zoo_dir(kind: str) -> Path | None:
    """The zoo folder of ``kind`` inside an installed package (autopar/_zoo/<kind>), or None in a source checkout."""
    d = _ZOO_DIRS[kind][0]
    return d if d.is_dir() else None


def zoo_dir(kind: str) -> Path:
    """The folder holding the zoo files of ``kind`` ('models', 'hardware' or 'data': the validation runs)."""
    for d in _ZOO_DIRS[kind]:
        if d.is_dir():
            return d
    raise AutoparInputError(f"the {kind} zoo folder is missing (looked in {', '.join(map(str, _ZOO_DIRS[kind]))})")


def zoo_names(kind: str) -> list[str]:
    return sorted(p.stem for p in zoo_dir(kind).glob("*.yaml"))


def read_text_file(path: Path) -> str:
    """The text of a small input file, read through autopar's one bounded reader (:func:`autopar.fileio.read_input`:
    regular files, devices, pipes and FIFOs, standard input); a folder, a file too large for an input, a silent pipe
    or bytes that are not UTF-8 become AutoparInputError naming the path."""
    data = read_input(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise AutoparInputError(f"{_show(path)}: not UTF-8 text (byte {err.start}: {err.reason})") from None


_show = show_path


def read_structured_file(path: Path) -> Any:
    """Parse a YAML or JSON file; syntax errors become AutoparInputError with the line. Nesting deeper than
    Python's recursion limit is an error too (no real spec is nested more than three levels)."""
    text = read_text_file(path)
    try:
        if path.suffix == ".json":
            return json.loads(text)
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise AutoparInputError(f"{_show(path)}: nested too deeply to be a spec file") from None
    except json.JSONDecodeError as err:
        raise AutoparInputError(f"{_show(path)}: malformed JSON at line {err.lineno} column {err.colno}: "
                                f"{err.msg}") from None
    except yaml.YAMLError as err:
        if "maximum nesting depth" in str(getattr(err, "problem", "")):   # libyaml's own depth limit (1,000)
            raise AutoparInputError(f"{_show(path)}: nested too deeply to be a spec file") from None
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise AutoparInputError(f"{_show(path)}: malformed YAML{at}: {getattr(err, 'problem', err)}") from None


# libyaml's parser where PyYAML was built with it (the wheels are): the same safe constructors and the same
# documents, parsed about 10x faster (a hardware file: 10 ms in Python, under 1 ms; every solve reads three files).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeyLoader(_SAFE_LOADER):
    """SafeLoader that rejects a key written twice in one mapping (YAML would silently keep the last)."""

    def construct_mapping(self, node, deep=False):  # type: ignore[override]
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"a key must be a plain name, not a {type(key).__name__}", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key '{key}'", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_LABEL = {"models": "model", "hardware": "hardware", "stacks": "stack"}


def _exists(path: Path) -> bool:
    """path.exists(), False for names the OS cannot look up (too long, a NUL byte, a denied folder)."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _resolve(ref: str | Path, kind: str) -> Path:
    label = _LABEL[kind]
    if not str(ref).strip():
        raise AutoparInputError(f"empty {label} name: give a zoo name or a file")
    path = Path(ref)
    if path.suffix in (".yaml", ".yml", ".json") or _exists(path):
        if not _exists(path):
            zoo = path.stem if path.suffix in (".yaml", ".yml") else None
            hint = (f"; the zoo {label} '{zoo}' has that name: pass --{'model' if kind == 'models' else 'hardware'} "
                    f"{zoo} (works from any folder)" if zoo and zoo in zoo_names(kind) else "")
            raise AutoparInputError(f"{label} file not found: {_show(path)}{hint}")
        if path.is_dir() and _exists(path / "config.json"):
            return path / "config.json"
        return path
    candidate = zoo_dir(kind) / f"{ref}.yaml"
    if "/" not in str(ref) and _exists(candidate):
        return candidate
    names = zoo_names(kind)
    raise AutoparInputError(f"unknown {label} '{_show(ref)}': not a file and not in the zoo ({', '.join(names)})")


_HF_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def hf_config_path(repo_id: str) -> Path:
    """config.json of a Hugging Face model id (``Qwen/Qwen2.5-7B``): from the local Hugging Face cache
    (``HF_HUB_CACHE`` / ``HF_HOME``), else downloaded from the Hub unless ``HF_HUB_OFFLINE`` is set. Needs
    huggingface_hub (``pip install autopar[hf]``). Raises AutoparInputError naming the id."""
    try:
        from huggingface_hub import constants, hf_hub_download
    except ImportError:
        raise AutoparInputError(f"model '{repo_id}' looks like a Hugging Face id; reading it needs huggingface_hub "
                                "(pip install 'autopar[hf]'), or pass the path of its config.json") from None
    try:
        return Path(hf_hub_download(repo_id, "config.json", local_files_only=True))
    except Exception:   # not cached (huggingface_hub raises several error types for that)
        pass
    if constants.HF_HUB_OFFLINE:
        raise AutoparInputError(f"model '{repo_id}': config.json is not in the Hugging Face cache "
                                f"({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE is set")
    try:
        return Path(hf_hub_download(repo_id, "config.json"))
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise AutoparInputError(f"model '{repo_id}': could not get config.json from the Hugging Face Hub: "
                                f"{first}") from None


def load_model(ref: str | Path | ModelSpec, *, warn: Any = None) -> ModelSpec:
    """A ModelSpec from a zoo name, a YAML file, a Hugging Face config.json (or a folder holding one) or a Hugging
    Face model id (``Qwen/Qwen2.5-7B``, see :func:`hf_config_path`).

    For a Hugging Face config, keys that could not be mapped are reported through ``warn`` (a callable
    taking a string; default: printed to stderr)."""
    if isinstance(ref, ModelSpec):
        return ref
    # a name ending in .yaml/.yml/.json is a file even when missing ("models/deepseek_v3.yaml" run outside the
    # checkout), never a Hub id: _resolve says at once that it is missing and names the zoo model it matches
    hf_id = (isinstance(ref, str) and _HF_ID.fullmatch(ref) and Path(ref).suffix not in (".yaml", ".yml", ".json")
             and not _exists(Path(ref)) and not (zoo_dir("models") / f"{ref}.yaml").exists())
    path = hf_config_path(ref) if hf_id else _resolve(ref, "models")
    data = read_structured_file(path)
    if isinstance(data, dict) and ("model_type" in data or "architectures" in data):
        name = (ref.split("/")[-1] if hf_id else path.parent.name if path.name == "config.json" else path.stem)
        from autopar.specs.hf_config import model_from_hf_config   # only for config.json files (7 ms to import)
        spec, unmapped = model_from_hf_config(data, name=name, where=str(ref if hf_id else path))
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


def load_stack(ref: "str | Path | StackSpec") -> "StackSpec":
    """A StackSpec from a zoo name (``stacks/``) or a YAML file."""
    from autopar.specs.stack import StackSpec
    if isinstance(ref, StackSpec):
        return ref
    path = _resolve(ref, "stacks")
    return build_spec(StackSpec, read_structured_file(path), str(path))


def dump_spec(spec: BaseModel, path: Path, header: str = "") -> None:
    """Write a spec as YAML (round-trips through load_model / load_hardware). Never overwrites silently:
    callers decide; this writes through :class:`autopar.fileio.OutputFile` (a temporary file renamed over
    ``path``), so a crash or a full disk leaves the old file intact."""
    data = spec.model_dump(mode="json", exclude_defaults=False)
    text = (header + "\n" if header else "") + yaml.safe_dump(data, sort_keys=False)
    OutputFile(path, "output").write(text)
