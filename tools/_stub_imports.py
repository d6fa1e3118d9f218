"""Import stubs for the fixture generators: lets ``import megatron.training.arguments`` (or Megatron-Bridge's config
module) run on a CPU machine without their GPU-only dependencies (triton, transformer_engine, apex, ...).

Only *missing* third-party modules are stubbed, and a stub is an empty module whose attributes are stub classes;
the argument definitions and dataclasses read by the generators are Megatron's own code, imported for real.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types


class _Anything(type):
    """A class usable as a base, a decorator, a callable, a namespace and a value."""

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Anything(name, (object,), {})

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return cls

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __bool__(cls):
        return False

    def __iter__(cls):
        return iter(())


class _StubModule(types.ModuleType):
    __path__: list[str] = []

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Anything(name, (object,), {})


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module):
        module.__spec__.submodule_search_locations = []
        module.__version__ = "0.0.0"


class StubFinder(importlib.abc.MetaPathFinder):
    """Stubs the modules named in ``names`` (and their submodules): a top-level package only when the real one is
    not installed, a dotted name (a GPU-kernel module inside the project) always."""

    def __init__(self, names: set[str]):
        self.names = names
        self.stubbed: set[str] = set()

    def find_spec(self, fullname, path, target=None):
        top = next((n for n in self.names if fullname == n or fullname.startswith(n + ".")), None)
        if top is None:
            return None
        if top not in self.stubbed:
            if "." not in top:
                sys.meta_path.remove(self)
                try:
                    real = importlib.util.find_spec(top)
                finally:
                    sys.meta_path.insert(0, self)
                if real is not None:
                    return None
            self.stubbed.add(top)
        return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)


def install(names: set[str]) -> StubFinder:
    finder = StubFinder(names)
    sys.meta_path.insert(0, finder)
    return finder
