"""The runs of ``benchmarks/parallel.py`` (issue K): EAGLE-3 on DeepSeek-V3 targets across tensor- and
pipeline-parallel layouts on vLLM's CPU backend (gloo between the worker processes), each against the same target
on one rank without speculation.

A layout's run either serves the prompts (greedy tokens, spec-decode counters, start-up seconds) or is refused
before anything loads (the fork's pre-load check, ``kimi/hooks/eagle3_drafter_checks.py``): vLLM 0.32.0 cannot
serve EAGLE-3 with pipeline parallelism on these targets. Needs the fork's venv (vLLM, torch).
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path

from kimi.e2e.engine import GreedyRun, identical, vllm_greedy
from kimi.e2e.presets import CPU_ENGINE

#: (tensor_parallel_size, pipeline_parallel_size) of the runs, one rank first (the reference).
LAYOUTS = ((1, 1), (2, 1), (1, 2), (2, 2))
#: What the refusal of an unservable layout says (``check_pipeline_parallel``).
REFUSED = "EAGLE-3 with pipeline_parallel_size="


def omp_bind(workers: int, cpus: list[int] | None = None) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``workers`` CPU workers on one host: the CPUs this process may use
    (``cpus``, default its affinity), split into ``workers`` contiguous groups joined by ``|`` (``"0|1"`` for two
    workers on CPUs 0 and 1); with fewer CPUs than workers, one CPU each, shared in turn (``"0|1|0|1"``). vLLM's
    automatic binding wants a NUMA node per worker, which small hosts lack."""
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if len(cpus) < workers:
        return "|".join(str(cpus[i % len(cpus)]) for i in range(workers))
    size = len(cpus) // workers
    groups = [cpus[i * size:(i + 1) * size] for i in range(workers)]
    return "|".join(",".join(str(c) for c in group) for group in groups)


@contextmanager
def bound_threads(workers: int):
    """Set ``VLLM_CPU_OMP_THREADS_BIND`` for ``workers`` (:func:`omp_bind`) unless the caller set it; restored
    after."""
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ or workers == 1:
        yield
        return
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = omp_bind(workers)
    try:
        yield
    finally:
        del os.environ["VLLM_CPU_OMP_THREADS_BIND"]


def serve_layout(target: str, prompt_ids: list[list[int]], tokens: int, tp: int, pp: int,
                 spec: dict | None, engine: dict = CPU_ENGINE) -> tuple[GreedyRun | None, dict]:
    """One engine at ``tp`` x ``pp`` (vLLM's default executor, :func:`executor`; ``engine``: float32 with
    torch.compile by default,
    since vLLM 0.32.0's CPU workers allocate the pipeline's intermediate tensors in the compile warm-up, so an eager
    engine with ``pipeline_parallel_size > 1`` fails its first step on the later stages): ``(run, entry)`` where
    ``entry`` holds ``status`` (``done``, ``refused`` before loading, or ``error``), the seconds, and on ``done``
    the start-up seconds and counters; ``run`` is None unless done."""
    began = time.monotonic()
    layout = {**engine, "tensor_parallel_size": tp, "pipeline_parallel_size": pp}
    try:
        with bound_threads(tp * pp):
            run = vllm_greedy(target, prompt_ids, tokens, speculative=spec, **layout)
    except Exception as exc:  # a refusal names the fix; anything else is reported, not raised
        return None, {**failure(str(exc)), "seconds": round(time.monotonic() - began, 1)}
    return run, {"status": "done", "start_s": run.start_s, "seconds": round(time.monotonic() - began, 1),
                 "counters": dict(run.counters)}


def executor(tp: int, pp: int) -> str:
    """The executor vLLM picks when none is named: ``uni`` (in the engine's process) for one worker, ``mp`` (one
    process per worker on this host) for more."""
    return "uni" if tp * pp == 1 else "mp"


def failure(text: str) -> dict:
    """``{"status", "error"}`` of an engine that did not start: ``refused`` with the fork's message alone (pydantic
    puts "1 validation error for SpeculativeConfig" before it and the input and a link after it), else ``error``
    with the text's last 1500 characters."""
    at = text.find(REFUSED)
    if at < 0:
        return {"status": "error", "error": text[-1500:]}
    # pydantic follows the message with " [type=value_error, input_value=...]" and a link to its docs
    return {"status": "refused", "error": text[at:].split(" [type=")[0].split("\n")[0].strip()}


def tau(counters: dict) -> float | None:
    """Mean accepted length per verification, ``1 + accepted / drafts``; None without drafts."""
    drafts = counters.get("num_drafts") or 0
    return round(1 + counters["num_accepted_tokens"] / drafts, 4) if drafts else None


def model_rows(name: str, target: str, drafters: dict[str, str], prompt_ids: list[list[int]], tokens: int, k: int,
               log) -> list[dict]:
    """Every layout of :data:`LAYOUTS` for one target: without speculation and with each drafter style of
    ``drafters`` (style -> folder). Rows compare each run's greedy tokens with the target alone on one rank
    (``identical_to_tp1``) and, with speculation, with the target alone at the same layout
    (``identical_to_layout_nospec``); τ from the counters. Layouts that cannot start are rows with their status."""
    rows: list[dict] = []
    reference: GreedyRun | None = None
    nospec: dict[tuple[int, int], GreedyRun] = {}
    for tp, pp in LAYOUTS:
        for style, drafter in [("none", None), *drafters.items()]:
            spec = None if drafter is None else {"method": "eagle3", "model": drafter, "num_speculative_tokens": k}
            log(f"{name}: tp {tp} pp {pp}, drafter {style}")
            run, entry = serve_layout(target, prompt_ids, tokens, tp, pp, spec)
            row = {"model": name, "tp": tp, "pp": pp, "executor": executor(tp, pp), "drafter": style,
                   "k": k if spec else 0, **entry}
            if run is not None:
                if drafter is None:
                    nospec[(tp, pp)] = run
                    reference = run if (tp, pp) == (1, 1) else reference
                else:
                    row["tau"] = tau(run.counters)
                    if (tp, pp) in nospec:
                        row["identical_to_layout_nospec"] = identical(run, nospec[(tp, pp)])
                row["identical_to_tp1"] = identical(run, reference) if reference is not None else None
            log(f"{name}: tp {tp} pp {pp}, drafter {style}: {row['status']} "
                + (f"tau {row.get('tau')}, {row['identical_to_tp1']}" if run is not None else row["error"][:200]))
            rows.append(row)
    return rows


def reference_drafters(models: Path) -> dict[str, str]:
    """The reference models' drafters by style (``kimi models make``: ``drafter-llama``, ``drafter-mla``)."""
    return {style: str(models / f"drafter-{style}") for style in ("llama", "mla")}
