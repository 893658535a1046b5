"""The library of ``benchmarks/gpu_e2e.py`` (EAGLE-3 with CUDA graphs, lossless check, counters,
``vllm serve``): the script's module docstring says what it measures and why.

* :mod:`.plan`: reference models, prompts, the runs (jobs) and the profiles (``--small``, ``--cpu-smoke``);
* :mod:`.job`: one engine run, in a worker process;
* :mod:`.lanes`: the call's state and the lanes (workers run one after the other, replaced when they die);
* :mod:`.phases`: the baseline, then the drafters spread over lanes, ``vllm serve`` and Kimi-K2.5;
* :mod:`.serve`: the ``vllm serve`` check;
* :mod:`.summary`: comparisons, checks, ``gpu_e2e.json`` and ``gpu_e2e.md``.
"""

from kimi_lab.bench.log import logger

log = logger("gpu_e2e")
