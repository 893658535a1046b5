"""The harness the benchmark scripts in ``benchmarks/`` share; each script is argument parsing over it.

Shared pieces, one job each:

* :mod:`kimi.bench.workers`: engine worker processes (jobs file, events file, order files) - the one way
  a benchmark runs vLLM engines in child processes;
* :mod:`kimi.bench.timers`: step timers patched into vLLM's model runner;
* :mod:`kimi.bench.results`: result files (JSON and markdown with command, date, hardware), written atomically;
* :mod:`kimi.bench.hardware`: what the results say about the machine;
* :mod:`kimi.bench.log`: the timestamped progress lines.

Per benchmark: :mod:`kimi.bench.gpu_e2e` (``benchmarks/gpu_e2e.py``), :mod:`kimi.bench.perf`
(``benchmarks/perf_vs_upstream.py``), :mod:`kimi.bench.cpu_e2e` and :mod:`kimi.bench.acceptance`.
The engine and server layer below them is :mod:`kimi.e2e` (presets, greedy runs, prompts, ``vllm serve``).

vLLM and torch are imported inside the functions that need them: every module here imports with a Python
that has neither. The scripts need ``kimi`` importable (the fork's venv, ``kimi install-into``'s copy in a
site on ``PYTHONPATH``, or ``PYTHONPATH=.`` in the checkout); they run their worker processes as themselves
(:func:`kimi.bench.workers.program`) with ``--worker``.
"""
