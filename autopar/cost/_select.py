"""``if``/``min`` that also work elementwise, so a term function can take numpy arrays over knob axes.

The search fills its tables by calling the cost model's own term functions once per pipeline depth with the
meshes' degrees and the knobs that vary inside a mesh (micro-batch, gradient accumulation, virtual stages, ZeRO
stage) as broadcastable numpy arrays; :meth:`autopar.cost.Estimator.estimate` calls the same functions with plain
numbers. These helpers keep scalars scalar (Python numbers in, the same out) and use numpy only for arrays, which
they import on first use: ``autopar estimate`` does not load numpy.
"""

from __future__ import annotations

# Plain Python scalars, tested by exact type first: the estimator calls these helpers about a hundred times per
# estimate with such values, and a type lookup is cheaper than the ``ndim`` probe arrays need.
_SCALARS = frozenset((bool, int, float))


def _is_array(x) -> bool:
    return type(x) not in _SCALARS and getattr(x, "ndim", 0) > 0


def where(cond, a, b):
    """``a if cond else b``, elementwise when ``cond`` is an array."""
    if type(cond) is bool or not _is_array(cond):
        return a if cond else b
    import numpy as np
    return np.where(cond, a, b)


def minimum(a, b):
    """``min(a, b)``, elementwise when either is an array."""
    if (type(a) in _SCALARS and type(b) in _SCALARS) or not (_is_array(a) or _is_array(b)):
        return min(a, b)
    import numpy as np
    return np.minimum(a, b)


def maximum(a, b):
    """``max(a, b)``, elementwise when either is an array."""
    if (type(a) in _SCALARS and type(b) in _SCALARS) or not (_is_array(a) or _is_array(b)):
        return max(a, b)
    import numpy as np
    return np.maximum(a, b)


def may_hold(cond) -> bool:
    """False only when ``cond`` is a plain false scalar: whether a branch ``where(cond, a, b)`` would pick ``a``
    can be taken. A caller may leave ``a`` unpriced (any placeholder) when this is False; arrays always price both
    branches, so the tables keep the shapes and values they had."""
    return bool(cond) if type(cond) is bool or not _is_array(cond) else True
