"""One perf_vs_upstream engine in a worker process (``benchmarks/perf_vs_upstream.py --worker``): start it,
measure every concurrency of the job (in turns when started side by side with others), shut it down.
Imports vLLM when it runs: the variant's ``PYTHONPATH`` decides which vLLM that is."""

from __future__ import annotations

import functools
import itertools
import os
import time
from pathlib import Path

from kimi.e2e.engine import adaptive_verified, engine_info, model_runner, spec_metrics
from kimi_lab.bench.hardware import cpu_cores, device, steal_seconds, thread_cpu
from kimi_lab.bench.perf import log
from kimi_lab.bench.results import write_lines
from kimi_lab.bench.timers import collect_timer, install_timer, step_times
from kimi_lab.bench.workers import JobReport, await_turn


def run(job: dict, spec: dict, report: JobReport) -> dict:
    """:func:`kimi_lab.bench.workers.serve_jobs`'s job function: :func:`run_engine`, its rounds kept in
    ``report.partial`` (they go with an error: the engine is not counted, its numbers stay in the JSON)."""
    return run_engine(job, report.partial, report)


def greedy_counts(worker) -> dict[str, int] | None:
    """``collective_rpc`` target: the drafter's ``KIMI_DRAFT_GREEDY=check`` counts
    (``kimi.spec.draft_greedy.GreedyCheck``)."""
    check = getattr(getattr(worker.model_runner, "drafter", None), "draft_greedy", None)
    return check.counts() if hasattr(check, "counts") else None


def run_engine(job: dict, result: dict, report: JobReport | None = None) -> dict:
    """Start one engine, measure every concurrency of ``job``, shut it down. ``result`` is filled as the rounds go
    (the caller keeps it on an error).

    With ``job["turn"]`` (a parallel start) the engine reports ``ready`` once started, then measures at each turn
    the orchestrator gives (:func:`kimi_lab.bench.workers.await_turn`; what a turn measures:
    :func:`turn_concurrency`), reporting ``round`` with the turn's number after each; ``report`` carries those
    events.
    """
    import vllm  # first: the variant's PYTHONPATH decides which vLLM this is
    from vllm import LLM

    t0 = time.monotonic()
    llm = LLM(model=job["target"], speculative_config=job["spec"], disable_log_stats=False, **job["engine"])
    result.update({"vllm_version": vllm.__version__, "vllm_file": vllm.__file__,
                   "start_s": round(time.monotonic() - t0, 1), "engine": engine_info(llm), "device": device(),
                   "greedy_env": os.environ.get("KIMI_DRAFT_GREEDY"),
                   "runner": model_runner(llm.llm_engine.vllm_config),
                   "cpus": sorted(os.sched_getaffinity(0)), "cpu_cores": machine_cores(),
                   "by_concurrency": {}})
    turn = Path(job["turn"]) if job.get("turn") else None
    try:
        if turn is not None:
            report.emit("ready", start_s=result["start_s"])
        for number in itertools.count():
            order = "last" if turn is None else await_turn(turn, number, job["turn_timeout_s"])
            if order == "stop":
                break
            for key, c, prompts in turn_points(job, number):
                by_c = result["by_concurrency"]
                entry = measure(llm, job, c, first=key not in by_c, prompts=prompts)
                merge_round(by_c, key, entry)
                log(f"{job['name']} turn {number + 1} {key}: {entry['tok_s']:.0f} tok/s, tau {entry['tau']}, "
                    f"steal share {entry['steal_share']}")
            if order == "last":
                break
            report.emit("round", round=number)
        if job.get("profile_dir"):
            c = max(job["concurrency"])
            result["profile"] = profile_batch(llm, job, c, Path(job["profile_dir"]))
            log(f"{job['name']}: profile of one batch at c={c}: {result['profile']}")
        if os.environ.get("KIMI_DRAFT_GREEDY") == "check":
            result["greedy_check"] = llm.collective_rpc(greedy_counts)[0]
    finally:
        llm.llm_engine.engine_core.shutdown()
    return result


def points(job: dict) -> list[tuple[str, int, list[list[int]] | None]]:
    """What the engine of ``job`` measures, in order: ``(key, c, prompts)`` per measurement point. Without
    ``job["points"]``, one per concurrency of ``job["concurrency"]``, keyed ``str(c)``, on ``job["prompts"]``
    (``prompts`` None); with it (``[[set, c], ...]``), one per entry, keyed ``"<set>/<c>"``, on the prompt set
    ``job["prompt_sets"][set]``."""
    if "points" not in job:
        return [(str(c), c, None) for c in job["concurrency"]]
    return [(f"{name}/{c}", c, job["prompt_sets"][name]) for name, c in job["points"]]


def call_points(job: dict, concurrency: list[int]) -> list[str]:
    """The keys of every point of a call (:func:`points` of ``job`` at the call's ``concurrency``): what one turn
    after another measures with turns per point (:func:`turn_points`)."""
    return [key for key, _, _ in points({**job, "concurrency": concurrency})]


def turn_points(job: dict, number: int) -> list[tuple[str, int, list[list[int]] | None]]:
    """The points (:func:`points`) the engine of ``job`` measures at turn ``number``: all of them (``job["turns"]``
    is ``engine``, the default: a turn is a round), or with ``concurrency`` the turn's one of the call's points in
    order, round after round (``job["call_points"]``, else ``job["call_concurrency"]``) -- none when this engine
    does not measure it (the check engine measures only the largest concurrency: it still takes the turn, and the
    turn numbers stay the orchestrator's)."""
    mine = points(job)
    if job.get("turns") != "concurrency":
        return mine
    every = job.get("call_points") or [str(c) for c in job.get("call_concurrency", job["concurrency"])]
    key = every[number % len(every)]
    return [point for point in mine if point[0] == key]


def turn_concurrency(job: dict, number: int) -> list[int]:
    """The concurrencies of :func:`turn_points` (a job without prompt sets)."""
    return [c for _, c, _ in turn_points(job, number)]


def batch_of(job: dict, c: int, tokens: int | None = None, prompts: list[list[int]] | None = None):
    """``c`` requests of ``prompts`` (default ``job["prompts"]``; repeated past their number) and their sampling
    parameters (``tokens`` output tokens, default ``job["tokens"]``; EOS ignored): greedy, or with
    ``job["temperature"]`` above 0 sampled at it, request ``i`` seeded with ``i`` (the same seeds in every engine)."""
    from vllm import SamplingParams

    prompts = prompts or job["prompts"]
    batch = [{"prompt_token_ids": prompts[i % len(prompts)]} for i in range(c)]
    temperature = job.get("temperature") or 0
    if not temperature:
        return batch, SamplingParams(temperature=0, max_tokens=tokens or job["tokens"], ignore_eos=True,
                                     detokenize=False)
    return batch, [SamplingParams(temperature=temperature, seed=i, max_tokens=tokens or job["tokens"],
                                  ignore_eos=True, detokenize=False) for i in range(c)]


def profile_batch(llm, job: dict, c: int, folder: Path) -> str:
    """One batch of ``c`` requests under cProfile (the engine runs in this process and thread:
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0``): writes ``folder/<engine>.cprofile.txt``, the 50 functions with the
    most own time and the 50 with the most cumulative time, headed by the batch's wall time with and without the
    profiler (its overhead inflates Python-heavy engines more). Returns the file's path."""
    import cProfile
    import io
    import pstats

    batch, params = batch_of(job, c)
    t0 = time.perf_counter()
    llm.generate(batch, params, use_tqdm=False)
    plain = time.perf_counter() - t0
    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.enable()
    llm.generate(batch, params, use_tqdm=False)
    profiler.disable()
    profiled = time.perf_counter() - t0
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(50)
    stats.sort_stats("cumulative").print_stats(50)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{job['name'].replace('/', '-')}.cprofile.txt"
    write_lines(path, [f"# {job['name']}: one batch of {c} requests x {job['tokens']} tokens",
                       f"wall {plain:.3f} s without the profiler, {profiled:.3f} s with it", "", text.getvalue()])
    return str(path)


def measure(llm, job: dict, c: int, first: bool, prompts: list[list[int]] | None = None) -> dict:
    """``c`` requests at once (of ``prompts``, default ``job["prompts"]``): a warm-up batch, ``job["reps"]`` timed
    batches (the best counts), the spec-decode counters over them (``draft_tokens``: the drafts vLLM counts,
    scheduled; ``verified``: the drafts adaptive verification verified, None without it), the share of this
    engine's CPU time the hypervisor took meanwhile (``steal_share``, :func:`steal_share`) and where its busy
    threads ran (``busy``, ``shared_core``: :func:`busy_threads`). The ``first`` measurement of ``c`` warms up with a
    full-length batch (lazily compiled kernels, every batch shape it meets) and, unless ``job["step_times"]`` is
    false, adds a shorter batch under the step timer (:mod:`kimi_lab.bench.timers`); a later one warms up with
    ``job["rewarm_tokens"]`` output tokens (default: the full length) -- the shapes are known by then, the warm-up
    only wakes the engine."""
    from vllm import SamplingParams

    tokens = job["tokens"]
    batch, params = batch_of(job, c, prompts=prompts)
    llm.generate(*batch_of(job, c, None if first else job.get("rewarm_tokens"), prompts), use_tqdm=False)
    metrics = llm.get_metrics()
    before, verified, stolen, threads = spec_metrics(metrics), adaptive_verified(metrics), steal_seconds(), thread_cpu()
    walls = []
    for _ in range(job["reps"]):
        t1 = time.perf_counter()
        outputs = llm.generate(batch, params, use_tqdm=False)
        walls.append(time.perf_counter() - t1)
    threads_after, metrics, stolen_after = thread_cpu(), llm.get_metrics(), steal_seconds()
    after, verified_after = spec_metrics(metrics), adaptive_verified(metrics)
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    drafts = after["num_drafts"] - before["num_drafts"]
    accepted = after["num_accepted_tokens"] - before["num_accepted_tokens"]
    wall = min(walls)
    entry = {"tok_s": produced / wall, "tpot_ms": 1e3 * wall / tokens, "walls_s": walls, "output_tokens": produced,
             "drafts": drafts, "accepted": accepted, "tau": 1 + accepted / drafts if drafts else None,
             "draft_tokens": after["num_draft_tokens"] - before["num_draft_tokens"],
             "verified": None if verified_after is None else verified_after - (verified or 0.0),
             "steal_share": steal_share(stolen, stolen_after, sum(walls)),
             **busy_threads(threads, threads_after, sum(walls), machine_cores()),
             "tokens": [list(o.outputs[0].token_ids) for o in outputs]}
    if first and job.get("step_times", True):
        llm.collective_rpc(install_timer)
        try:
            llm.generate(batch, SamplingParams(temperature=0, max_tokens=min(tokens, 48), ignore_eos=True,
                                               detokenize=False), use_tqdm=False)
        finally:
            calls = llm.collective_rpc(collect_timer)[0]
        entry["steps"] = step_times(calls)
    return entry


def steal_share(before: float | None, after: float | None, seconds: float) -> float | None:
    """The share of this process's CPUs' time over ``seconds`` of wall time that the hypervisor took
    (``after - before`` stolen seconds from :func:`kimi_lab.bench.hardware.steal_seconds`, over the CPUs the process
    may run on), rounded to 1e-4; None where steal time is not known."""
    if before is None or after is None or seconds <= 0:
        return None
    return round((after - before) / (seconds * len(os.sched_getaffinity(0))), 4)


@functools.cache
def machine_cores() -> list[list[int]]:
    """Every CPU of the machine (``os.cpu_count()``, not only this process's) grouped by physical core
    (:func:`kimi_lab.bench.hardware.cpu_cores`): siblings outside the engine's CPUs still count as one core. Read once
    per process (the topology does not change while an engine runs)."""
    return cpu_cores(list(range(os.cpu_count() or 1)))


BUSY_SHARE = 0.2
"""A thread that used at least this share of one CPU over the timed batches counts as busy (:func:`busy_threads`)."""


def busy_threads(before: dict[int, tuple[float, int]], after: dict[int, tuple[float, int]], seconds: float,
                 cores: list[list[int]]) -> dict:
    """Where the engine's busy threads ran over ``seconds`` of timed batches, from two
    :func:`kimi_lab.bench.hardware.thread_cpu` readings of this process and its descendants (the engine core):
    ``busy``, ``[cpu, share]`` per thread that used at least :data:`BUSY_SHARE` of a CPU (the CPU it ran on last,
    at the end; its CPU seconds over ``seconds``, rounded to 0.01), busiest first; ``shared_core``, whether two of
    them ended on one physical core of ``cores`` (SMT siblings, or the same CPU); None without readings."""
    if not before or not after or seconds <= 0:
        return {"busy": None, "shared_core": None}
    core_of = {cpu: i for i, core in enumerate(cores) for cpu in core}
    shares = [(cpu, (used - before[tid][0]) / seconds) for tid, (used, cpu) in after.items() if tid in before]
    busy = sorted(([cpu, round(share, 2)] for cpu, share in shares if share >= BUSY_SHARE), key=lambda e: -e[1])
    places = [core_of.get(cpu, ("cpu", cpu)) for cpu, _ in busy]
    return {"busy": busy, "shared_core": len(set(places)) < len(places)}


ROUND_KEYS = ("tok_s", "tau", "draft_tokens", "verified", "steal_share", "busy", "shared_core")
"""The per-measurement values :func:`merge_round` keeps for every round (as ``<key>_rounds``)."""


def merge_round(by_c: dict, c: str, entry: dict) -> None:
    """Fold one round's ``entry`` for concurrency ``c`` into ``by_c``: the fastest round's numbers, every round's
    values of :data:`ROUND_KEYS` in ``<key>_rounds`` (``tok_s_rounds``, ``steal_share_rounds``, ...; None where a
    round lacks one), the step times of the first round."""
    prev = by_c.get(c, {})
    best = entry if entry["tok_s"] > prev.get("tok_s", -1.0) else prev
    by_c[c] = {**best, "steps": prev.get("steps", entry.get("steps", {})),
               **{f"{key}_rounds": [*prev.get(f"{key}_rounds", [None] * len(prev.get("tok_s_rounds", []))),
                                    entry.get(key)] for key in ROUND_KEYS}}
