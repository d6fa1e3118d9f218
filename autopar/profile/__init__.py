"""Measurements next to the runner: hardware microbenchmarks (``hardware``), predicted-vs-measured comparison
(``compare``) and calibration (``calibrate``). The training runner itself lives in :mod:`autopar.run`."""
