"""perf_vs_upstream's orchestration: one worker process per engine (:mod:`kimi_lab.bench.workers`), started and
measured one at a time, or (``--parallel-start``) all started at once and measured in turns, round after round."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

from kimi_lab.bench.hardware import cpu_groups
from kimi_lab.bench.perf import log
from kimi_lab.bench.perf.analysis import summarize
from kimi_lab.bench.perf.measure import call_points
from kimi_lab.bench.perf.plan import variant_env
from kimi_lab.bench.perf.render import write_outputs
from kimi_lab.bench.workers import WorkerProcess, give_turn


class Worker:
    """One engine's worker process, its files in the scratch folder (a device call brings back only a few files
    from --out; a failed engine's tail goes into the JSON): ``<engine>.job.json``, ``<engine>.events.jsonl``,
    ``<engine>.log``. With ``parallel`` it measures in turns (turn files ``<engine>.go<n>``, events ``ready`` and
    ``round`` with the turn's number) and compiles into a cache of its own; ``threads`` caps inductor's compile
    threads; ``cpus`` holds the worker and its engine to those CPUs."""

    def __init__(self, args: argparse.Namespace, job: dict, scratch: Path, parallel: bool = False,
                 threads: int | None = None, cpus: list[int] | None = None) -> None:
        name = job["name"].replace("/", "-")
        self.job, self.began = job, time.monotonic()
        turn = self.turn = scratch / name if parallel else None
        cache = f"vllm-cache-{name}" if parallel else None
        if turn is not None:
            for old in scratch.glob(f"{turn.name}.go*"):
                old.unlink(missing_ok=True)
            job = {**job, "turn": str(turn), "turn_timeout_s": args.budget_s, "turns": args.turns,
                   "call_concurrency": args.concurrency, "call_points": call_points(job, args.concurrency)}
        env = variant_env(args, job, scratch, cache)
        if threads:
            env["TORCHINDUCTOR_COMPILE_THREADS"] = str(threads)
        self.process = WorkerProcess({"jobs": [job]}, scratch / f"{name}.job.json", scratch / f"{name}.events.jsonl",
                                     scratch / f"{name}.log", env, cpus=cpus)
        self.proc = self.process.proc

    def ready(self) -> bool:
        """Parallel start: the engine is up and waits for its turn."""
        return self.turn is not None and self.process.find("ready") is not None

    def go(self, number: int, order: str) -> None:
        """Turn ``number``: ``order`` is ``more``, ``last`` or ``stop`` (:func:`kimi_lab.bench.workers.give_turn`)."""
        give_turn(self.turn, number, order)

    def wait_turn(self, number: int, limit: float) -> bool:
        """Wait up to ``limit`` s until the worker has measured turn ``number`` (False: it exited or ran over)."""
        end = time.monotonic() + limit
        while True:
            exited = self.proc.poll() is not None  # before reading: a worker reports before it exits
            if self.process.find("round", round=number) is not None:
                return True
            if exited or time.monotonic() > end:
                return False
            time.sleep(0.05)

    def collect(self, limit: float) -> dict:
        """Wait up to ``limit`` seconds for the worker to finish (killed after that); its result."""
        try:
            self.proc.wait(timeout=max(1.0, limit))
        except subprocess.TimeoutExpired:
            self.process.kill()
            return {"status": "timeout", "error": f"killed after {limit:.0f} s:\n{self.process.tail()}",
                    "seconds": round(time.monotonic() - self.began, 1)}
        result = self.process.outcome(self.job["name"]) or {
            "status": "error", "error": f"worker exited with {self.proc.returncode}:\n{self.process.tail()}"}
        result["seconds"] = round(time.monotonic() - self.began, 1)
        return result

    def stop(self, status: str, why: str) -> dict:
        self.process.kill()
        return {"status": status, "error": why, "seconds": round(time.monotonic() - self.began, 1)}


def run_all(args: argparse.Namespace, jobs: list[dict], started: float) -> dict[str, dict]:
    """Run ``jobs`` model by model (the pair's at once with ``--parallel-start``) within ``--budget-s`` of
    ``started``; after each engine its lines are logged and the JSON and markdown rewritten. The results."""
    deadline = started + args.budget_s
    runs: dict[str, dict] = {}

    def report(job: dict) -> None:
        r = runs[job["name"]]
        log(f"{job['name']}: {r['status']} in {r['seconds']} s" + (f" (start {r.get('start_s')} s, {r.get('runner')})"
                                                                   if r["status"] == "done" else
                                                                   f": {r.get('error', '').strip()[-300:]}"))
        for c, entry in r.get("by_concurrency", {}).items():  # in the call's output too
            log(f"  c={c}: {entry['tok_s']:.1f} tok/s, tpot {entry['tpot_ms']:.2f} ms, tau {entry['tau']}, "
                f"steps {json.dumps({k: round(v, 3) for k, v in entry.get('steps', {}).items()})}")
        write_outputs(args.out, summarize(args, jobs, runs, started), chart=False)

    for model in dict.fromkeys(j["model"] for j in jobs):
        group = [j for j in jobs if j["model"] == model]
        if args.parallel_start and model == "pair":
            run_parallel(args, group, deadline, runs, report)
        else:
            run_serial(args, group, deadline, runs, report)
    return runs


def run_serial(args: argparse.Namespace, jobs: list[dict], deadline: float, runs: dict, report) -> None:
    """Each engine started, measured and stopped before the next; a model whose ``nospec`` engine failed skips
    its other engines (the same target fails the same way: keep the device time for the next model)."""
    for job in jobs:
        if deadline - time.monotonic() < 40:
            runs[job["name"]] = {"status": "skipped", "error": "time budget"}
            continue
        baseline = runs.get(f"{job['model']}/nospec", {})
        if baseline.get("status") not in (None, "done"):
            runs[job["name"]] = {"status": "skipped", "error": f"{job['model']}/nospec did not finish"}
            continue
        log(f"{job['name']}: starting")
        worker = Worker(args, job, args.scratch)
        runs[job["name"]] = worker.collect(min(args.job_timeout_s, deadline - time.monotonic()))
        report(job)


def run_parallel(args: argparse.Namespace, jobs: list[dict], deadline: float, runs: dict, report) -> None:
    """All of ``jobs`` start at once (each its own compile cache; inductor's compile threads shared out over the
    CPUs); once every engine is ready (or gone, or past ``--job-timeout-s``) they measure one at a time, the
    others waiting idle, for ``--rounds`` rounds of turns (``--turns``; the engine order is reversed every other
    turn of a round and every other round, so a drift of the host touches every engine alike; each concurrency
    keeps its fastest round; see :func:`measure_rounds`). With ``--pin`` each engine (its worker and engine
    processes) is held to CPUs of :func:`kimi_lab.bench.hardware.cpu_groups` in the mode ``--pin`` names (``shares``:
    its own whole cores; ``cores``: one thread of every core, the same for all). Engines not collected when it
    ends (an error, an interrupt) are killed."""
    groups = cpu_groups(len(jobs), mode=args.pin) if args.pin else [None] * len(jobs)
    threads = max(1, len(os.sched_getaffinity(0)) // len(jobs))  # the CPUs this process may use (taskset)
    log(f"starting {len(jobs)} engines at once ({threads} inductor compile threads each"
        + (f"; pinned ({args.pin}) to CPUs {groups}" if args.pin else "") + ")")
    workers = {job["name"]: Worker(args, job, args.scratch, parallel=True, threads=threads, cpus=cpus)
               for job, cpus in zip(jobs, groups, strict=True)}
    began = time.monotonic()
    waiting = set(workers)
    while waiting and time.monotonic() < min(deadline - 40, began + args.job_timeout_s):
        waiting = {n for n in waiting if not workers[n].ready() and workers[n].proc.poll() is None}
        time.sleep(0.5)
    log(f"{len(workers) - len(waiting)} of {len(workers)} engines up or gone after {time.monotonic() - began:.0f} s")
    for job in jobs:
        worker = workers[job["name"]]
        if worker.proc.poll() is not None:
            runs[job["name"]] = worker.collect(1.0)  # failed at start: its error and log tail
            report(job)
        elif not worker.ready():
            runs[job["name"]] = worker.stop("timeout", f"not ready within {time.monotonic() - began:.0f} s")
            report(job)
    live = [job for job in jobs if job["name"] not in runs]
    try:
        measure_rounds(args, live, workers, deadline, runs, report)
    finally:  # never leave an engine holding the GPU (workers run in their own sessions)
        for job in jobs:
            if job["name"] not in runs:
                runs[job["name"]] = workers[job["name"]].stop("error", "orchestrator stopped")


def measure_rounds(args: argparse.Namespace, live: list[dict], workers: dict, deadline: float, runs: dict,
                   report) -> None:
    """The rounds of :func:`run_parallel` over the engines that are up. A round is one turn per engine (``--turns
    engine``: each measures every concurrency) or one turn per engine and concurrency (``--turns concurrency``:
    the engines take turns at each concurrency -- at each point, where the jobs measure prompt sets
    (:func:`kimi_lab.bench.perf.measure.points`) -- so the rates they are compared by are seconds apart). Turns are
    numbered from 0 across rounds; the engine order is the plan's, reversed every other turn of a round and every
    other round (a drift favours no engine). A round starts only when the time left holds it (as long as the
    previous round, plus a margin), so every engine gets the same number of rounds; otherwise the engines are
    told to stop and keep what they measured. An engine that dies or overruns a turn is collected with what it
    wrote."""
    # a turn per point: per concurrency, or per prompt set and concurrency (kimi_lab.bench.perf.measure.points)
    slots = len(call_points(live[0], args.concurrency)) if args.turns == "concurrency" and live else 1
    last_round_s = 0.0
    for rnd in range(args.rounds):
        round_began = time.monotonic()
        active = [j for j in live if j["name"] not in runs]
        if rnd > 0 and deadline - round_began < 40 + 1.2 * last_round_s:
            for job in active:
                workers[job["name"]].go(rnd * slots, "stop")
            for job in active:
                runs[job["name"]] = workers[job["name"]].collect(max(1.0, deadline - time.monotonic()))
                report(job)
            return
        for slot in range(slots):
            number = rnd * slots + slot
            final = rnd == args.rounds - 1 and slot == slots - 1
            active = [j for j in live if j["name"] not in runs]
            for job in active if (rnd + slot) % 2 == 0 else active[::-1]:
                worker = workers[job["name"]]
                log(f"{job['name']}: measuring (round {rnd + 1}"
                    + (f", turn {slot + 1} of {slots}" if slots > 1 else "") + (", last" if final else "") + ")")
                worker.go(number, "last" if final else "more")
                limit = max(1.0, min(args.job_timeout_s, deadline - time.monotonic()))
                if final:
                    runs[job["name"]] = worker.collect(limit)
                elif not worker.wait_turn(number, limit):
                    worker.go(number + 1, "stop")  # it may still finish this turn; then it stops with it
                    runs[job["name"]] = worker.collect(max(1.0, deadline - time.monotonic()))
                else:
                    continue
                report(job)
        last_round_s = time.monotonic() - round_began
