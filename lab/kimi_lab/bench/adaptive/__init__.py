"""The library of ``benchmarks/adaptive.py``: the fork's adaptive verification for EAGLE-3 against fixed k,
upstream's batch-size table and no speculation, side by side in one run (the engines and their turns are
:mod:`kimi_lab.bench.perf`'s; the script's module docstring defines what is measured).

* :mod:`.plan`: the five engines, the prompt sets and measurement points, the CPU's upstream site;
* :mod:`.analysis`: rows per setup and concurrency, the ratios, the goal;
* :mod:`.render`: ``adaptive.json`` and ``adaptive.md``.
"""

from kimi_lab.bench.log import logger

log = logger("adaptive")
