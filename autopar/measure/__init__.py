"""Measurement: what the hardware does and how far the cost model is from it.

* :mod:`~autopar.measure.kernels`, :mod:`~autopar.measure.kernel_tables`: kernel microbenchmarks on one device
  (GEMM by shape, flash attention, grouped GEMM, memory-bound kernels, host copies);
* :mod:`~autopar.measure.collectives`: collective bus bandwidth between local processes (nccl-tests definitions);
* :mod:`~autopar.measure.hwfile`: ``autopar profile hardware``, the measurements turned into a hardware file;
* :mod:`~autopar.measure.compare`: ``autopar profile compare``, real runs of layouts against the cost model;
* :mod:`~autopar.measure.record`: the one predicted-vs-measured record (validate, compare, tune);
* :mod:`~autopar.measure.validation`: ``autopar validate``, the published runs (``data/published_runs.csv``)
  against the cost model;
* :mod:`~autopar.measure.calibration`: ``autopar validate --fit``, the published runs as rows of the fitter;
* :mod:`~autopar.measure.calibrate`: the one fitter of the hardware's efficiency constants; their bounds are
  declared on the hardware-file fields (:class:`~autopar.specs.hardware.FitBound`).

Light on purpose: importing this package does not import torch.
"""

from __future__ import annotations


class ProfileError(RuntimeError):
    """A measurement could not be made (a worker failed or timed out)."""
