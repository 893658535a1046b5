"""The harness the benchmark scripts in ``benchmarks/`` share; each script is argument parsing over it.

Shared pieces, one job each:

* :mod:`kimi_lab.bench.workers`: engine worker processes (jobs file, events file, order files) - the one way
  a benchmark runs vLLM engines in child processes;
* :mod:`kimi_lab.bench.timers`: step timers patched into vLLM's model runner;
* :mod:`kimi_lab.bench.results`: result files (JSON and markdown with command, date, hardware), written atomically;
* :mod:`kimi_lab.bench.hardware`: what the results say about the machine;
* :mod:`kimi_lab.bench.log`: the timestamped progress lines.

Per benchmark: :mod:`kimi_lab.bench.gpu_e2e` (``benchmarks/gpu_e2e.py``), :mod:`kimi_lab.bench.perf`
(``benchmarks/perf_vs_upstream.py``), :mod:`kimi_lab.bench.cpu_e2e` and :mod:`kimi_lab.bench.acceptance`.
The engine and server layer below them is :mod:`kimi.e2e` (presets, greedy runs, prompts, ``vllm serve``).

vLLM and torch are imported inside the functions that need them: every module here imports with a Python
that has neither. The scripts need ``kimi`` importable (the fork's venv, ``kimi install-into``'s copy in a
site on ``PYTHONPATH``, or ``PYTHONPATH=.`` in the checkout); they run their worker processes as themselves
(:func:`kimi_lab.bench.workers.program`) with ``--worker``.
"""
