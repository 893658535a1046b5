"""Engine worker processes: the one way the benchmarks run vLLM engines in child processes.

An engine runs in a worker process so that a crash or a hang costs one run, not the call, and so that every
engine gets a fresh CUDA context and the environment of its variant (``PYTHONPATH``, runner, compile cache).

Protocol, files in a scratch folder:

* **jobs file** (JSON), written by the orchestrator before the start: ``{"jobs": [job, ...], ...}``. Every job
  is a dict with a ``"name"``; the other keys are shared by the jobs (prompts, tokens, ...). With
  ``"job_timeout_s"`` the worker dumps its threads' tracebacks to its log 15 s before a job's time is up.
* **events file** (JSON lines), appended by the worker: ``{"event": "start", "job", "t"}`` before each job,
  then ``{"event": "done", "job", **result}`` or ``{"event": "error", "job", **partial, "error": traceback}``;
  in between, a job may emit events of its own (``"ready"``, ``"round"``). Readers take complete lines only.
* **turn files** ``<base>.go<r>`` (text, written atomically), only for a worker that measures in turns: the
  orchestrator's order for round ``r`` (:func:`give_turn`, :func:`await_turn`).

The worker command is ``[python, SCRIPT, "--worker", JOBS, EVENTS]``: SCRIPT is the benchmark script that
runs the orchestrator (:func:`program`), whose hidden ``--worker`` flag calls :func:`serve_jobs` with its job
function. Its output goes to a log file, whose tail is quoted when a job fails. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from kimi.fork.fsutil import write_atomic
from kimi_lab import PATH as LAB_PATH


def program() -> Path:
    """The benchmark script this process runs (``sys.argv[0]``, resolved): workers run it with ``--worker``."""
    return Path(sys.argv[0]).resolve()


def checkout() -> Path:
    """The checkout that :func:`program` is in (the folder above ``benchmarks/``): the workers' current folder
    and an entry of their ``PYTHONPATH`` (the ``kimi`` package there)."""
    return program().parents[1]


def kimi_path(scratch: Path) -> Path:
    """``scratch/kimi-path``, a folder holding only ``kimi`` (a link to the package of the checkout this lab is in).
    First on a worker's ``PYTHONPATH`` it gives the whole ``kimi`` package before an installed site's runtime copy
    (``kimi install-into`` copies the hooks only), without the checkout's laid ``vllm/`` shadowing the site's
    ``vllm``; the worker, a benchmark script, puts the lab (``lab/``) on its path itself."""
    folder = scratch / "kimi-path"
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        (folder / "kimi").symlink_to(LAB_PATH.parent / "kimi", target_is_directory=True)
    return folder


# -- the orchestrator's side ---------------------------------------------------------------------------------

def site_errors(**sites: Path | None) -> list[str]:
    """What is wrong with the vLLM sites a benchmark puts first on its workers' ``PYTHONPATH`` (``--fork-site``,
    ``--upstream-site``): one line per option that is missing or names a folder without ``vllm/__init__.py`` (a
    mistyped site would let the worker import whatever ``vllm`` comes next, and compare the fork with itself)."""
    out = []
    for name, site in sites.items():
        flag = "--" + name.replace("_", "-")
        if site is None:
            out.append(f"{flag} is required")
        elif not (Path(site) / "vllm" / "__init__.py").is_file():
            out.append(f"{flag} {site} holds no vllm package (no vllm/__init__.py there)")
    return out


def vllm_env(pythonpath: list, cache: Path) -> dict[str, str]:
    """This process's environment for a child that runs vLLM: ``PYTHONPATH`` = ``pythonpath`` (in that order,
    empty and repeated entries left out, the caller's own not added), ``VLLM_CACHE_ROOT`` = ``cache`` (one
    compile cache per concurrent child: two processes never write the same entry at once), and
    ``VLLM_USE_FLASHINFER_SAMPLER=0`` unless set."""
    env = dict(os.environ)
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    env["VLLM_CACHE_ROOT"] = str(cache)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(str(p) for p in pythonpath if p))
    return env


def worker_env(pythonpath: list, cache: Path) -> dict[str, str]:
    """:func:`vllm_env` for a worker: also the engine in the worker's own process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless set: a traceback names the line) and unbuffered output."""
    env = vllm_env(pythonpath, cache)
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def kill(proc: subprocess.Popen) -> None:
    """End ``proc``'s process group (it runs in a session of its own): SIGTERM, then SIGKILL after 10 s."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log ("" when it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class WorkerProcess:
    """A worker started on ``jobs`` (written to ``jobs_path``; ``events_path`` is emptied first), its output in
    ``log_path`` (appended to with ``append_log``), in a session of its own (:func:`kill` ends all of it), held
    with its children to ``cpus`` when given.

    ``events`` holds every event read so far (:meth:`read_events`).
    """

    def __init__(self, jobs: dict, jobs_path: Path, events_path: Path, log_path: Path, env: dict[str, str],
                 append_log: bool = False, cpus: list[int] | None = None) -> None:
        jobs_path.write_text(json.dumps(jobs))
        events_path.unlink(missing_ok=True)
        self.events_path, self.log_path = events_path, log_path
        self.events: list[dict] = []
        with open(log_path, "ab" if append_log else "wb") as out:
            self.proc = subprocess.Popen([sys.executable, str(program()), "--worker", str(jobs_path),
                                          str(events_path)], stdout=out, stderr=subprocess.STDOUT, env=env,
                                         cwd=checkout(), start_new_session=True,
                                         preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)

    def read_events(self) -> list[dict]:
        """The events appended since the last call (complete lines only)."""
        text = self.events_path.read_text() if self.events_path.exists() else ""
        new = [json.loads(line) for line in text.split("\n")[:-1][len(self.events):]]
        self.events += new
        return new

    def find(self, kind: str, **fields) -> dict | None:
        """The first event read so far of ``kind`` whose ``fields`` match, or None (reads new events first)."""
        self.read_events()
        return next((e for e in self.events if e["event"] == kind and all(e.get(k) == v for k, v in fields.items())),
                    None)

    def outcome(self, job: str) -> dict | None:
        """``{"status": "done", **result}`` or ``{**partial, "status": "error", "error": ...}`` from ``job``'s last
        event, or None when the worker reported neither."""
        self.read_events()
        final = [e for e in self.events if e.get("job") == job and e["event"] in ("done", "error")]
        if not final:
            return None
        fields = {k: v for k, v in final[-1].items() if k not in ("event", "job")}
        if final[-1]["event"] == "done":
            return {"status": "done", **fields}
        error = fields.pop("error")
        return {**fields, "status": "error", "error": error}

    def kill(self) -> None:
        kill(self.proc)

    def tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines)


def give_turn(base: Path, number: int, order: str) -> None:
    """Turn ``number``'s order to the worker waiting in :func:`await_turn` on ``base``: ``more`` (measure, then wait
    for the next turn), ``last`` (measure, then finish) or ``stop`` (finish now)."""
    write_atomic(base.with_suffix(f".go{number}"), order)


# -- the worker's side ---------------------------------------------------------------------------------------

def await_turn(base: Path, number: int, timeout_s: float) -> str:
    """Wait idle until the orchestrator writes ``base.go{number}`` (:func:`give_turn`); its text, the order.

    Raises:
        TimeoutError: no turn within ``timeout_s`` seconds.
    """
    go, waited = base.with_suffix(f".go{number}"), time.monotonic()
    while not go.exists():
        if time.monotonic() - waited > timeout_s:
            raise TimeoutError(f"no turn to measure (turn {number}) within {timeout_s:.0f} s")
        time.sleep(0.05)
    return go.read_text()


class JobReport:
    """What a job tells its orchestrator while it runs: events of its own (:meth:`emit`) and, in ``partial``,
    the results it has so far (they go with the error event if the job fails)."""

    def __init__(self, events_path: Path, job: str) -> None:
        self.events_path, self.job = events_path, job
        self.partial: dict = {}

    def emit(self, kind: str, /, **fields) -> None:
        with open(self.events_path, "a") as fh:
            fh.write(json.dumps({"event": kind, "job": self.job, **fields}) + "\n")


def serve_jobs(jobs_path: Path, events_path: Path, run_job: Callable[[dict, dict, JobReport], dict]) -> int:
    """The worker: run the jobs of ``jobs_path`` in order, ``run_job(job, spec, report)`` each (``spec``: the
    whole jobs file), and report them in ``events_path`` (module docstring). A job that raises is reported
    with its traceback and the next one runs. Returns the exit status: 0 when every job was done, else 1."""
    import faulthandler

    faulthandler.enable()
    spec = json.loads(jobs_path.read_text())
    timeout = spec.get("job_timeout_s")
    failed = False
    for job in spec["jobs"]:
        report = JobReport(events_path, job["name"])
        report.emit("start", t=time.time())
        if timeout:
            faulthandler.dump_traceback_later(max(30, timeout - 15), exit=False)
        try:
            report.emit("done", **run_job(job, spec, report))
        except Exception:
            text = traceback.format_exc()
            print(text, flush=True)
            report.emit("error", **report.partial, error=text[-4000:])
            failed = True
        finally:
            if timeout:
                faulthandler.cancel_dump_traceback_later()
    return 1 if failed else 0
