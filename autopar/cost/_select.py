"""``if``/``min`` that also work elementwise, so a term function can take numpy arrays over knob axes.

The search fills its tables by calling the cost model's own term functions once per mesh with the knobs that
vary inside a mesh (micro-batch, gradient accumulation, virtual stages, ZeRO stage) as broadcastable numpy
arrays; :meth:`autopar.cost.Estimator.estimate` calls the same functions with plain numbers. These helpers
keep scalars scalar (Python ``int``/``float`` in, the same out) and switch to numpy only for arrays.
"""

from __future__ import annotations

import numpy as np


def where(cond, a, b):
    """``a if cond else b``, elementwise when ``cond`` is an array."""
    if isinstance(cond, np.ndarray):
        return np.where(cond, a, b)
    return a if cond else b


def minimum(a, b):
    """``min(a, b)``, elementwise when either is an array."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.minimum(a, b)
    return min(a, b)
