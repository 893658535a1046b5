"""The state of one gpu_e2e call and its lanes: each lane runs its jobs in worker processes
(:mod:`kimi_lab.bench.workers`), one after the other; a worker that dies or hangs is replaced and the lane goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from kimi_lab.bench.gpu_e2e import log
from kimi_lab.bench.workers import WorkerProcess, checkout, worker_env


@dataclass
class Job:
    """One engine run: ``spec`` is vLLM's ``speculative_config`` (None: the target alone), ``engine`` the
    ``LLM(...)`` settings, ``group`` the baseline it is compared with, ``images`` the Kimi-K2.5 image requests,
    ``prompts`` its own prompt ids where its target's tokenizer is not the reference target's (the shipped pair)."""

    name: str
    target: str
    spec: dict | None
    engine: dict
    group: str
    timeout_s: float
    images: dict | None = None
    prompts: list[list[int]] | None = None


@dataclass
class Outcome:
    name: str
    status: str                    # done / error / timeout / skipped
    result: dict = field(default_factory=dict)
    error: str = ""
    seconds: float = 0.0
    attempts: list[str] = field(default_factory=list)


class Run:
    """Shared state of one gpu_e2e call: outcomes (written to disk after each change), deadline, settings.

    ``spec_names`` are the planned runs with a drafter, ``planned`` all planned runs (set by the plan).
    """

    def __init__(self, args: argparse.Namespace, out: Path, engine: dict, prompts: list[list[int]]) -> None:
        self.args, self.out, self.engine, self.prompts = args, out, engine, prompts
        self.logs = out / "logs"
        self.start = time.monotonic()
        self.deadline = self.start + args.budget_s
        self.outcomes: dict[str, Outcome] = {}
        self.serve: dict = {}
        self.models: dict = {}
        self.lock = threading.Lock()
        self.variant: dict = {}
        self.errors: list[str] = []
        self.spec_names: set[str] = set()
        self.planned: set[str] = set()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def record(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes[outcome.name] = outcome
        self.save()

    def save(self) -> None:
        from kimi_lab.bench.gpu_e2e.summary import write_results

        with self.lock:
            try:
                write_results(self)
            except Exception:  # never lose a lane for a report: the final write says more
                log(f"writing the results failed:\n{traceback.format_exc()}")


def guarded(run: Run, what: str, fn, *args) -> None:
    """Run a lane's body; an error of the orchestrator itself is logged and its runs marked, not raised."""
    try:
        fn(*args)
    except Exception:
        text = traceback.format_exc()
        log(f"{what}: orchestrator error:\n{text}")
        run.errors.append(f"{what}: {text[-2000:]}")


def lane_env(run: Run, lane: str) -> dict:
    """A lane's worker environment: this checkout first on ``PYTHONPATH``, one compile cache per lane."""
    return worker_env([checkout(), os.environ.get("PYTHONPATH")], run.args.scratch / f"vllm-cache-{lane}")


def run_lane(run: Run, lane: str, jobs: list[Job], on_error=None) -> None:
    """Run ``jobs`` in worker processes, one after the other; a worker that dies or hangs is replaced.

    By default each job gets a fresh worker (``run.args.fresh_process``: a fresh CUDA context, no state carried
    from the previous engine). ``on_error(job, error)`` may return a replacement job, which runs next (in a new
    worker, with the jobs left). Jobs that would start with less than ``--min-job-s`` left are skipped.
    """
    remaining = list(jobs)
    log_path = run.logs / f"lane-{lane}.log"
    attempt = 0
    while remaining:
        if run.left() < run.args.min_job_s:
            for job in remaining:
                run.record(Outcome(job.name, "skipped", error=f"time budget: {run.left():.0f} s left"))
                log(f"{job.name}: skipped (time budget, {run.left():.0f} s left)")
            return
        attempt += 1
        batch = remaining[:1] if run.args.fresh_process else remaining
        spec = {"prompts": run.prompts, "tokens": run.args.tokens, "job_timeout_s": max(j.timeout_s for j in batch),
                "jobs": [{"name": j.name, "target": j.target, "spec": j.spec, "engine": j.engine, "images": j.images,
                          "prompts": j.prompts} for j in batch]}
        worker = WorkerProcess(spec, run.args.scratch / f"jobs-{lane}-{attempt}.json",
                               run.args.scratch / f"events-{lane}-{attempt}.jsonl", log_path, lane_env(run, lane),
                               append_log=True)
        try:
            _follow(run, lane, worker, batch, remaining, on_error)
        finally:
            worker.kill()


def _follow(run: Run, lane: str, worker: WorkerProcess, batch: list[Job], remaining: list[Job], on_error) -> None:
    """Record ``worker``'s jobs as it reports them, until it exits, hangs or must restart with a replacement."""
    current: Job | None = None
    started_any = False
    began = time.monotonic()
    while True:
        exited = worker.proc.poll() is not None  # before reading: a worker writes its events before it exits
        for event in worker.read_events():
            job = next(j for j in remaining if j.name == event["job"])
            if event["event"] == "start":
                current, began, started_any = job, time.monotonic(), True
                log(f"{job.name}: starting (lane {lane})")
                continue
            remaining.remove(job)
            current = None
            seconds = round(time.monotonic() - began, 1)
            if event["event"] == "done":
                run.record(Outcome(job.name, "done", result=event, seconds=seconds))
                c = event["counters"]
                log(f"{job.name}: done in {seconds:.0f} s (engine start {event['start_s']:.0f} s, "
                    f"{event['tokens_per_s']} tok/s, drafts {c['num_drafts']:.0f}, accepted "
                    f"{c['num_accepted_tokens']:.0f}/{c['num_draft_tokens']:.0f})")
                continue
            error = event["error"].strip().splitlines()[-1]
            log(f"{job.name}: FAILED after {seconds:.0f} s: {error}")
            replacement = on_error(job, event["error"]) if on_error else None
            if replacement is not None:
                log(f"{job.name}: trying again with {json.dumps(replacement.engine)}")
                remaining.insert(0, replacement)
                return  # the next worker takes the remaining jobs with the new settings
            run.record(Outcome(job.name, "error", error=event["error"], seconds=seconds))
        if exited:
            failed = current or (None if started_any else batch[0])
            if failed is not None and failed in remaining:
                remaining.remove(failed)
                run.record(Outcome(failed.name, "error", seconds=round(time.monotonic() - began, 1),
                                   error=f"worker exited with status {worker.proc.returncode}:\n{worker.tail()}"))
                log(f"{failed.name}: FAILED (worker exited with status {worker.proc.returncode})")
            return
        if current is not None:
            limit = min(current.timeout_s, run.left() + run.args.grace_s)
            if time.monotonic() - began > limit:
                remaining.remove(current)
                why = "time budget" if run.left() + run.args.grace_s < current.timeout_s else "timeout"
                worker.kill()
                run.record(Outcome(current.name, "timeout", seconds=round(time.monotonic() - began, 1),
                                   error=f"{why} after {limit:.0f} s:\n{worker.tail()}"))
                log(f"{current.name}: KILLED ({why} after {limit:.0f} s)")
                return
        elif not started_any and time.monotonic() - began > min(run.args.job_timeout_s,
                                                                run.left() + run.args.grace_s):
            remaining.remove(batch[0])  # a worker that never starts its first job
            worker.kill()
            run.record(Outcome(batch[0].name, "timeout", error=f"the worker did not start it:\n{worker.tail()}"))
            log(f"{batch[0].name}: KILLED (its worker did not start it)")
            return
        time.sleep(0.5)
