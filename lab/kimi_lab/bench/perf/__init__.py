"""The library of ``benchmarks/perf_vs_upstream.py`` (fork versus upstream vLLM on one GPU, with
EAGLE-3 and without speculation): the script's module docstring defines what is measured and why.

* :mod:`.plan`: the engines of a call (models, variants, k, runners) and each one's environment;
* :mod:`.measure`: one engine in a worker process, every concurrency, in turns when started side by side;
* :mod:`.orchestrate`: the workers, one at a time or started at once and measured in interleaved rounds;
* :mod:`.analysis`: rows, ratios, the ideal bound, the Kimi slice's projection, the goal, joining calls;
* :mod:`.render`: ``perf_vs_upstream.json``, ``.md`` and ``.png``.
"""

from kimi_lab.bench.log import logger

log = logger("perf")
