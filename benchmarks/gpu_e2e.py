"""The fork end to end on a GPU (issue C): EAGLE-3 with CUDA graphs, lossless check, counters, `vllm serve`.

One call on the GPU host, after the kit and the fork are installed (``benchmarks/gpu_call.sh`` does both)::

    python3 benchmarks/gpu_e2e.py --out $OUT

1. Reference models: ``python -m kimi models make`` (target, drafter-llama, drafter-mla, and the Kimi-K2.5
   wrapper ``kimi-k25`` where this checkout's ``kimi models make`` writes it).
2. Greedy decoding of real code the models never saw (prompts cut from the held-out stdlib packages), with
   vLLM's defaults: torch.compile and CUDA graphs on (no ``enforce_eager``). One run of the target alone is
   the baseline; each EAGLE-3 drafter style (``llama``, ``mla``) runs at k = 1, 3, 5 and is compared with
   it token by token (lossless: identical sequences). Spec-decode counters come from ``LLM.get_metrics()``.
   The Kimi-K2.5 wrapper runs alone and with the Llama-style drafter (k = 3) when present.
3. ``vllm serve`` of the target with the Llama-style drafter (k = 3): 8 concurrent OpenAI completion requests
   (standard library HTTP), answers checked against the offline baseline, counters read from ``/metrics``.

Engines run in worker processes ("lanes"; several at once on one GPU, each with a fixed KV cache and its own
compile cache), so a crash or a hang costs one run, not the call. After each run ``gpu_e2e.json`` is
rewritten, so a call stopped by its time limit still returns what finished. Runs that would not fit in
``--budget-s`` are skipped and listed. ``--cpu-smoke`` checks the same logic on a machine without a GPU
(eager, float32, tiny counts); ``--small`` is the short form the GPU tests run.

Writes ``gpu_e2e.json``, ``gpu_e2e.md`` and ``logs/`` under ``--out`` (default ``benchmarks/results``).
Exit status 0 when every check passed (lossless >= 90 % of sequences in every run, CUDA graphs on, the
server answered), 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kimi.e2e.engine import SPEC_METRICS, spec_metrics  # noqa: E402
from kimi.e2e.server import free_port, request, spec_counters  # noqa: E402

LOSSLESS_MIN = 0.9
#: Engine settings. A fixed KV cache (kv_cache_memory_bytes) skips vLLM's memory profiling, which
#: refuses to run while another process on the GPU changes its memory use; gpu_memory_utilization only
#: has to pass the start-up check "free memory >= utilization x total".
GPU_ENGINE = {"dtype": "bfloat16", "max_model_len": 512, "gpu_memory_utilization": 0.12,
              "kv_cache_memory_bytes": 1 << 30, "seed": 0}
CPU_ENGINE = {"dtype": "float32", "max_model_len": 512, "kv_cache_memory_bytes": 512 << 20, "seed": 0,
              "enforce_eager": True}
#: If the baseline cannot start with vLLM's MLA backend choice, everything runs with this one.
MLA_FALLBACK = {"attention_config": {"backend_per_kind": {"mla_attention": "TRITON_MLA"}}}
#: If the Kimi-K2.5 wrapper cannot start with its vision tower profiled, it runs text-only.
K25_FALLBACK = {"limit_mm_per_prompt": {"vision_chunk": 0}}
#: Image requests of the Kimi-K2.5 runs: the wrapper's placeholder token (kimi.models.kimi_k25.MEDIA_TOKEN) in
#: a text prompt, one plain 224 x 224 image per color (16 x 16 patches of 14 pixels, merged 2 x 2: 64 tokens).
K25_IMAGE_PROMPT = "# an image: <|media_pad|>\ndef describe(image):\n"
IMAGE_COLORS = ("red", "blue", "green", "white", "black", "yellow", "cyan", "magenta")


def log(msg: str) -> None:
    print(f"gpu_e2e [{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- prompts -------------------------------------------------------------------------------------------------

def code_prompts(tokenizer_json: Path, count: int, max_len: int) -> list[list[int]]:
    """``count`` prompts of 24..``max_len`` tokens cut at line starts from held-out stdlib files (deterministic)."""
    from tokenizers import Tokenizer

    from kimi.models.tokenizer import held_out_files

    files = held_out_files()
    if not files:
        raise SystemExit("gpu_e2e: this Python has no held-out stdlib packages (json, email, http, xml)")
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    step = max(1, len(files) // count)
    order = files[::step] + [f for i, f in enumerate(files) if i % step]  # spread over the packages first
    prompts: list[list[int]] = []
    for path in order:
        if len(prompts) == count:
            break
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        if len(lines) < 30:
            continue
        start = len(lines) // 3
        ids = tokenizer.encode("".join(lines[start:start + 60])).ids
        want = 24 + (len(prompts) * 37) % max(1, max_len - 23)
        if len(ids) >= want and ids[:want] not in prompts:
            prompts.append(ids[:want])
    if len(prompts) < count:
        raise SystemExit(f"gpu_e2e: only {len(prompts)} prompts could be cut from the held-out files")
    return prompts


# -- worker: one process running engines one after the other -------------------------------------------------

def _engine_info(llm) -> dict:
    info: dict = {}
    try:
        config = llm.llm_engine.vllm_config
        info["enforce_eager"] = bool(config.model_config.enforce_eager)
        info["cudagraph_mode"] = str(config.compilation_config.cudagraph_mode)
        info["compilation_mode"] = str(config.compilation_config.mode)
        sizes = config.compilation_config.cudagraph_capture_sizes or []
        info["cudagraph_capture_sizes"] = [min(sizes), max(sizes), len(sizes)] if sizes else []
        info["architecture"] = (config.model_config.architectures or ["?"])[0]
        # the fork's default for DeepSeek-V3 targets with a non-MLA EAGLE-3 drafter is V2 (patch 0013)
        info["model_runner"] = "v2" if config.use_v2_model_runner else "v1"
        if config.speculative_config is not None:
            spec = config.speculative_config
            info["draft_architecture"] = (spec.draft_model_config.architectures or ["?"])[0]
            hf = spec.draft_model_config.hf_config
            info["aux_layer_ids"] = list(getattr(hf, "eagle_aux_hidden_state_layer_ids", []) or [])
    except Exception as exc:  # report, never fail a run for it
        info["error"] = repr(exc)
    return info


def _device() -> dict:
    import torch

    out = {"torch": torch.__version__, "python": platform.python_version()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out.update(name=torch.cuda.get_device_name(0), memory_gib=round(props.total_memory / 2**30, 1),
                   capability=f"{props.major}{props.minor}", cuda=torch.version.cuda,
                   count=torch.cuda.device_count())
    else:
        out.update(name=f"CPU: {_cpu_name()}", cuda=None, count=0)
    return out


def _margin(step: dict) -> float | None:
    """Top-1 minus top-2 logprob at one position (None when fewer than two were returned)."""
    values = sorted((lp.logprob for lp in step.values()), reverse=True)
    return round(values[0] - values[1], 5) if len(values) > 1 else None


def _image_run(llm, images: dict, tokens: int) -> dict:
    """Greedy decoding of one image request per color (the multimodal path of the Kimi-K2.5 wrapper)."""
    try:
        from PIL import Image
        from vllm import SamplingParams

        params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, detokenize=False)
        requests = [{"prompt": images["prompt"], "multi_modal_data": {"vision_chunk": [
            {"type": "image", "image": Image.new("RGB", (224, 224), color)}]}} for color in images["colors"]]
        outputs = llm.generate(requests, params, use_tqdm=False)
        return {"image_tokens": [list(o.outputs[0].token_ids) for o in outputs],
                "image_prompt_len": [len(o.prompt_token_ids) for o in outputs]}
    except Exception:
        return {"image_error": traceback.format_exc()[-3000:]}


def run_job(job: dict, prompts: list[list[int]], tokens: int) -> dict:
    """Start an engine for ``job``, decode ``prompts`` greedily, read the counters, shut the engine down."""
    import gc

    import torch
    import vllm
    from vllm import LLM, SamplingParams

    t0 = time.monotonic()
    llm = LLM(model=job["target"], speculative_config=job["spec"], disable_log_stats=False, **job["engine"])
    started = time.monotonic() - t0
    try:
        info = _engine_info(llm)
        # a baseline also keeps its top-2 logprobs: the margin where a run parts from it tells a near-tie
        # flipped by numerics from a real difference
        top = 2 if job["spec"] is None else None
        params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, detokenize=False, logprobs=top)
        warm = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, detokenize=False)
        # warm-up on other token sequences: no prefix-cache hits for the measured prompts
        llm.generate([{"prompt_token_ids": p[::-1]} for p in prompts[:2]], warm, use_tqdm=False)
        before = spec_metrics(llm.get_metrics())
        t1 = time.monotonic()
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        seconds = time.monotonic() - t1
        after = spec_metrics(llm.get_metrics())
        images = _image_run(llm, job.get("images"), min(tokens, 16)) if job.get("images") else {}
    finally:
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception as exc:
            print(f"engine shutdown: {exc!r}", flush=True)
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    counters = {k: after[k] - before[k] for k in SPEC_METRICS.values()}
    pos_before = before["accepted_per_pos"] or [0.0] * len(after["accepted_per_pos"])
    counters["accepted_per_pos"] = [a - b for a, b in zip(after["accepted_per_pos"], pos_before, strict=False)]
    out_tokens = [list(o.outputs[0].token_ids) for o in outputs]
    generated = sum(len(t) for t in out_tokens)
    margins = [[_margin(step) for step in (o.outputs[0].logprobs or [])] for o in outputs] \
        if job["spec"] is None else None
    return {"tokens": out_tokens, "counters": counters, "engine": info, "vllm_version": vllm.__version__, **images,
            "margins": margins,
            "device": _device(), "start_s": round(started, 1), "generate_s": round(seconds, 3),
            "tokens_per_s": round(generated / seconds, 1) if seconds else None}


def worker_main(jobs_path: Path, events_path: Path) -> int:
    """Run the jobs of ``jobs_path`` in order, appending one JSON event per line to ``events_path``."""
    import faulthandler

    faulthandler.enable()
    spec = json.loads(jobs_path.read_text())
    prompts, tokens = spec["prompts"], spec["tokens"]

    def emit(event: dict) -> None:
        with open(events_path, "a") as fh:
            fh.write(json.dumps(event) + "\n")

    for job in spec["jobs"]:
        print(f"=== {job['name']}: {job['target']} spec={json.dumps(job['spec'])} engine={json.dumps(job['engine'])}",
              flush=True)
        emit({"event": "start", "job": job["name"], "t": time.time()})
        faulthandler.dump_traceback_later(max(30, spec["job_timeout_s"] - 15), exit=False)
        try:
            result = run_job(job, prompts, tokens)
            emit({"event": "done", "job": job["name"], **result})
            print(f"=== {job['name']}: done, counters {result['counters']}", flush=True)
        except Exception:
            text = traceback.format_exc()
            print(text, flush=True)
            emit({"event": "error", "job": job["name"], "error": text[-4000:]})
        finally:
            faulthandler.cancel_dump_traceback_later()
    return 0


# -- orchestration -------------------------------------------------------------------------------------------

@dataclass
class Job:
    name: str
    target: str
    spec: dict | None
    engine: dict
    group: str
    timeout_s: float
    images: dict | None = None


@dataclass
class Outcome:
    name: str
    status: str                    # done / error / timeout / skipped
    result: dict = field(default_factory=dict)
    error: str = ""
    seconds: float = 0.0
    attempts: list[str] = field(default_factory=list)


class Run:
    """Shared state of one gpu_e2e call: outcomes (written to disk after each change), deadline, settings."""

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

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def record(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes[outcome.name] = outcome
        self.save()

    def save(self) -> None:
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


def _kill(proc: subprocess.Popen) -> None:
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


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _worker_env(run: Run, lane: str) -> dict:
    env = dict(os.environ)
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env["PYTHONUNBUFFERED"] = "1"
    # one compile cache per lane: two processes never write the same cache entry at once
    env["VLLM_CACHE_ROOT"] = str(run.args.scratch / f"vllm-cache-{lane}")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_lane(run: Run, lane: str, jobs: list[Job], on_error=None) -> None:
    """Run ``jobs`` in a worker process, one after the other; a worker that dies or hangs is replaced."""
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
        jobs_path = run.args.scratch / f"jobs-{lane}-{attempt}.json"
        events_path = run.args.scratch / f"events-{lane}-{attempt}.jsonl"
        events_path.unlink(missing_ok=True)
        # one engine per process by default: a fresh CUDA context, no state carried from the previous engine
        batch = remaining[:1] if run.args.fresh_process else remaining
        jobs_path.write_text(json.dumps({
            "prompts": run.prompts, "tokens": run.args.tokens, "job_timeout_s": max(j.timeout_s for j in batch),
            "jobs": [{"name": j.name, "target": j.target, "spec": j.spec, "engine": j.engine, "images": j.images}
                     for j in batch]}))
        with open(log_path, "ab") as out:
            proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", str(jobs_path),
                                     str(events_path)], stdout=out, stderr=subprocess.STDOUT,
                                    env=_worker_env(run, lane), cwd=ROOT, start_new_session=True)
        seen = 0
        current: Job | None = None
        started_any = False
        began = time.monotonic()
        try:
            while True:
                exited = proc.poll() is not None  # before reading: a worker writes its events before it exits
                text = events_path.read_text() if events_path.exists() else ""
                events = text.split("\n")[:-1]  # complete lines only
                restart = False
                for line in events[seen:]:
                    event = json.loads(line)
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
                        restart = True  # the next worker takes the remaining jobs with the new settings
                        break
                    run.record(Outcome(job.name, "error", error=event["error"], seconds=seconds))
                seen = len(events)
                if restart:
                    break
                if exited:
                    failed = current or (None if started_any else batch[0])
                    if failed is not None and failed in remaining:
                        remaining.remove(failed)
                        run.record(Outcome(failed.name, "error", seconds=round(time.monotonic() - began, 1),
                                           error=f"worker exited with status {proc.returncode}:\n"
                                                 f"{_tail(log_path)}"))
                        log(f"{failed.name}: FAILED (worker exited with status {proc.returncode})")
                    break
                if current is not None:
                    limit = min(current.timeout_s, run.left() + run.args.grace_s)
                    if time.monotonic() - began > limit:
                        remaining.remove(current)
                        why = "time budget" if run.left() + run.args.grace_s < current.timeout_s else "timeout"
                        _kill(proc)
                        run.record(Outcome(current.name, "timeout", seconds=round(time.monotonic() - began, 1),
                                           error=f"{why} after {limit:.0f} s:\n{_tail(log_path)}"))
                        log(f"{current.name}: KILLED ({why} after {limit:.0f} s)")
                        break
                elif not started_any and time.monotonic() - began > min(run.args.job_timeout_s,
                                                                        run.left() + run.args.grace_s):
                    remaining.remove(batch[0])  # a worker that never starts its first job
                    _kill(proc)
                    run.record(Outcome(batch[0].name, "timeout", error=f"the worker did not start it:\n"
                                                                      f"{_tail(log_path)}"))
                    log(f"{batch[0].name}: KILLED (its worker did not start it)")
                    break
                time.sleep(0.5)
        finally:
            _kill(proc)


# -- vllm serve ----------------------------------------------------------------------------------------------

def serve_command(run: Run, models: Path, spec: dict) -> list[str]:
    vllm = Path(sys.executable).with_name("vllm")
    head = [str(vllm)] if vllm.is_file() else [sys.executable, "-m", "vllm.entrypoints.cli.main"]
    engine = {**run.engine, **run.variant}
    args = [*head, "serve", str(models / "target"), "--host", "127.0.0.1", "--port", str(free_port()),
            "--dtype", engine["dtype"], "--max-model-len", str(engine["max_model_len"]),
            "--kv-cache-memory-bytes", str(engine["kv_cache_memory_bytes"]), "--seed", "0",
            "--max-num-seqs", str(max(8, run.args.clients)), "--speculative-config", json.dumps(spec)]
    if "gpu_memory_utilization" in engine:
        args += ["--gpu-memory-utilization", str(engine["gpu_memory_utilization"])]
    if engine.get("enforce_eager"):
        args.append("--enforce-eager")
    if "attention_config" in engine:
        args += ["--attention-config", json.dumps(engine["attention_config"])]
    return args


def run_serve(run: Run, models: Path, baseline: list[list[int]] | None) -> dict:
    """``vllm serve`` with the Llama-style drafter; concurrent completions; /metrics; stop."""
    k = run.args.serve_k
    spec = {"method": "eagle3", "model": str(models / "drafter-llama"), "num_speculative_tokens": k}
    cmd = serve_command(run, models, spec)
    port = cmd[cmd.index("--port") + 1]
    base = f"http://127.0.0.1:{port}"
    log_path = run.logs / "serve.log"
    max_tokens = min(run.args.tokens, 32)
    result: dict = {"ok": False, "requests": run.args.clients, "command": " ".join(cmd), "speculative": spec}
    if run.left() < run.args.min_job_s:
        result["error"] = f"skipped: time budget ({run.left():.0f} s left)"
        log("serve: skipped (time budget)")
        return result
    log(f"serve: starting `vllm serve` (EAGLE-3 llama, k = {k})")
    env = dict(os.environ)
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    env["VLLM_CACHE_ROOT"] = str(run.args.scratch / "vllm-cache-serve")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    t0 = time.monotonic()
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                start_new_session=True)
    try:
        limit = min(run.args.job_timeout_s, run.left() + run.args.grace_s)
        while True:
            if proc.poll() is not None:
                result["error"] = f"vllm serve exited with status {proc.returncode}:\n{_tail(log_path)}"
                log(f"serve: FAILED (exited with status {proc.returncode})")
                return result
            try:
                if request(f"{base}/health", timeout=5).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() - t0 > limit:
                result["error"] = f"not ready after {limit:.0f} s:\n{_tail(log_path)}"
                log("serve: FAILED (not ready in time)")
                return result
            time.sleep(1)
        result["start_s"] = round(time.monotonic() - t0, 1)
        log(f"serve: ready after {result['start_s']:.0f} s; {run.args.clients} concurrent requests")
        prompts = run.prompts[:run.args.clients]

        def ask(ids: list[int]) -> tuple[int, dict | str]:
            body = {"model": str(models / "target"), "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                    "ignore_eos": True, "return_token_ids": True}
            try:
                answer = request(f"{base}/v1/completions", json.dumps(body).encode(), timeout=180)
            except OSError as exc:  # timeout, connection reset: an unanswered request
                return 0, repr(exc)
            try:
                return answer.status, answer.json()
            except ValueError:
                return answer.status, answer.body

        t1 = time.monotonic()
        with ThreadPoolExecutor(len(prompts)) as pool:
            replies = list(pool.map(ask, prompts))
        result["requests_s"] = round(time.monotonic() - t1, 2)
        answered, same, details = 0, 0, []
        for i, (status, reply) in enumerate(replies):
            choice = reply["choices"][0] if status == 200 and isinstance(reply, dict) else {}
            ids = choice.get("token_ids")
            good = status == 200 and bool(choice.get("text")) and \
                (reply.get("usage") or {}).get("completion_tokens") == max_tokens
            answered += good
            if ids is not None and baseline is not None:
                same += list(ids) == baseline[i][:max_tokens]
            details.append({"status": status, "ok": good, "text": (choice.get("text") or str(reply))[:80]})
        try:
            answer = request(f"{base}/metrics", timeout=30)
            status, metrics = answer.status, answer.body
        except OSError as exc:
            status, metrics = 0, repr(exc)
        counters = spec_counters(metrics) if status == 200 else {}
        result.update(answered=answered, identical_to_offline=same if baseline is not None else None,
                      max_tokens=max_tokens, counters=counters, replies=details)
        result["ok"] = answered == len(prompts) and counters.get("num_drafts", 0) > 0
        log(f"serve: {answered}/{len(prompts)} answered, {same} identical to the offline baseline, "
            f"counters {counters}")
        return result
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
        _kill(proc)
        result["stopped"] = proc.returncode is not None
        result["seconds"] = round(time.monotonic() - t0, 1)


# -- results -------------------------------------------------------------------------------------------------

def compare(a: list[list[int]], b: list[list[int]], margins: list[list[float | None]] | None = None) -> dict:
    """How many sequences of ``a`` equal those of ``b`` (the baseline), the token match and where they part.

    ``margins`` (the baseline's top-1 minus top-2 logprob per position) gives, for each sequence that parts,
    the baseline's margin at that position: a near-tie (a few hundredths) is a flip by numerics.
    """
    pairs = list(zip(a, b, strict=True))
    total_tokens = sum(len(y) for y in b)
    matched = sum(p == q for x, y in pairs for p, q in zip(x, y, strict=False))
    first = [next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), None) for x, y in pairs]
    out = {"identical": sum(x == y for x, y in pairs), "total": len(b),
           "token_match": round(matched / total_tokens, 4) if total_tokens else None,
           "first_divergence": [f for f in first if f is not None]}
    if margins:
        out["divergence_margins"] = [margins[i][f] if f < len(margins[i]) else None
                                     for i, f in enumerate(first) if f is not None]
    return out


BASELINES = {"target": "base", "k25": "k25_base"}


def summarize(run: Run) -> dict:
    done = {n: o for n, o in run.outcomes.items() if o.status == "done"}
    lossless, counters, runs = {}, {}, {}
    for name, outcome in sorted(run.outcomes.items()):
        entry = {"status": outcome.status, "seconds": outcome.seconds}
        if outcome.status == "done":
            r = outcome.result
            entry.update(engine=r["engine"], start_s=r["start_s"], generate_s=r["generate_s"],
                         tokens_per_s=r["tokens_per_s"])
            if "image_tokens" in r or "image_error" in r:
                entry["images"] = {"requests": len(r.get("image_tokens", [])),
                                   "prompt_tokens": r.get("image_prompt_len"), "error": r.get("image_error")}
            base = BASELINES["k25" if name.startswith("k25") else "target"]
            if name in run.spec_names:
                counters[name] = {k: r["counters"][k] for k in ("num_drafts", "num_draft_tokens",
                                                                "num_accepted_tokens", "accepted_per_pos")}
                c = counters[name]
                c["mean_acceptance_length"] = round(1 + c["num_accepted_tokens"] / c["num_drafts"], 3) \
                    if c["num_drafts"] else None
                if base in done:
                    lossless[name] = compare(r["tokens"], done[base].result["tokens"], done[base].result.get("margins"))
                    ref_images = done[base].result.get("image_tokens")
                    if ref_images and r.get("image_tokens"):
                        # the multimodal requests count as sequences of this run too
                        images = compare(r["image_tokens"], ref_images)
                        text = lossless[name]
                        lossless[name] = {"identical": text["identical"] + images["identical"],
                                          "total": text["total"] + images["total"],
                                          "token_match": text["token_match"], "text": text, "images": images}
        else:
            entry["error"] = outcome.error[-1500:]
        runs[name] = entry
    if "k25_base" in done and "base" in done:
        runs["k25_base"]["same_as_target"] = compare(done["k25_base"].result["tokens"], done["base"].result["tokens"])
    if run.serve.get("counters"):
        counters["serve"] = run.serve["counters"]
    first = next(iter(done.values()), None)
    device = first.result["device"] if first else {}
    engines = [o.result["engine"] for o in done.values()]
    graphs = bool(engines) and all(not e.get("enforce_eager", True) and e.get("cudagraph_mode", "NONE") not in
                                   ("NONE", "CUDAGraphMode.NONE") for e in engines)
    expected = sorted(run.spec_names)
    checks = {
        "every_run_finished": all(run.outcomes.get(n) and run.outcomes[n].status == "done"
                                  for n in [*expected, *BASELINES.values()] if n in run.planned),
        "lossless_at_least_90_percent": bool(lossless) and len(lossless) == len(expected) and all(
            v["identical"] >= LOSSLESS_MIN * v["total"] for v in lossless.values()),
        "cuda_graphs": graphs,
        "serve_ok": bool(run.serve.get("ok")),
        "fork_version": bool(first) and "+kimi." in first.result["vllm_version"],
    }
    k25_runs = [o for n, o in done.items() if n.startswith("k25")]
    if run.models.get("kimi_k25") and getattr(run.args, "k25", True) and getattr(run.args, "k25_images", 0):
        # the wrapper's multimodal path ran: every Kimi-K2.5 run answered its image requests
        checks["k25_multimodal"] = bool(k25_runs) and all(o.result.get("image_tokens") for o in k25_runs)
    if run.args.cpu_smoke:
        checks.pop("cuda_graphs")
    if not getattr(run.args, "serve", True):
        checks.pop("serve_ok")
    if run.errors:
        checks["orchestrator_ok"] = False
    return {
        "device": (f"{device.get('name')} ({device.get('memory_gib')} GiB, sm_{device.get('capability')})"
                   if device.get("cuda") else device.get("name")),
        "device_details": device,
        "vllm_version": first.result["vllm_version"] if first else None,
        "lossless": lossless,
        "spec_counters": counters,
        "cuda_graphs": graphs,
        "serve": run.serve,
        "command": run.args.command,
        "date": run.args.date,
        "checks": checks,
        "passed": all(checks.values()),
        "runs": runs,
        "settings": {"prompts": len(run.prompts), "prompt_tokens": [min(map(len, run.prompts)),
                                                                    max(map(len, run.prompts))],
                     "max_tokens": run.args.tokens, "engine": run.engine, "variant": run.variant,
                     "lanes": run.args.lanes, "budget_s": run.args.budget_s, "profile":
                     "cpu-smoke" if run.args.cpu_smoke else ("small" if run.args.small else "full")},
        "models": run.models,
        "orchestrator_errors": run.errors,
        "seconds": round(run.elapsed(), 1),
    }


def write_results(run: Run) -> dict:
    summary = summarize(run)
    run.out.mkdir(parents=True, exist_ok=True)
    tmp = run.out / ".gpu_e2e.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.replace(run.out / "gpu_e2e.json")
    details = summary["device_details"]
    lines = ["# GPU end to end (issue C)", "",
             f"- command: `{summary['command']}`", f"- date: {summary['date']}",
             f"- hardware: {summary['device']}, torch {details.get('torch')}, CUDA {details.get('cuda')}",
             f"- vLLM: {summary['vllm_version']}",
             (f"- CUDA graphs on in every run: {summary['cuda_graphs']}; {len(run.prompts)} prompts x "
              f"{run.args.tokens} tokens, greedy"),
             f"- passed: {summary['passed']} {summary['checks']}", "",
             ("| run | identical / total | token match | drafts | draft tokens | accepted | mean acceptance length "
              "| engine start s | tok/s | runner |"), "|---|---|---|---|---|---|---|---|---|---|"]
    for name, entry in summary["runs"].items():
        if entry["status"] != "done":
            lines.append(f"| {name} | {entry['status']}: {entry.get('error', '').strip().splitlines()[-1:]} "
                         "| | | | | | | | |")
            continue
        ll = summary["lossless"].get(name, {})
        c = summary["spec_counters"].get(name, {})
        margins = ll.get("divergence_margins") or ll.get("text", {}).get("divergence_margins")
        note = f" (baseline margin where they part: {', '.join(map(str, margins[:3]))})" if margins else ""
        same = f"{ll.get('identical', '-')} / {ll.get('total', '-')}{note}"
        lines.append(f"| {name} | {same} | {ll.get('token_match', '-')} "
                     f"| {c.get('num_drafts', '-')} | {c.get('num_draft_tokens', '-')} | "
                     f"{c.get('num_accepted_tokens', '-')} | {c.get('mean_acceptance_length', '-')} | "
                     f"{entry['start_s']} | {entry['tokens_per_s']} | {entry['engine'].get('model_runner', '-')} |")
    serve = summary["serve"]
    if serve:
        lines.append(f"| serve (llama k={run.args.serve_k}) | {serve.get('identical_to_offline', '-')} / "
                     f"{serve.get('requests')} | | {serve.get('counters', {}).get('num_drafts', '-')} | "
                     f"{serve.get('counters', {}).get('num_draft_tokens', '-')} | "
                     f"{serve.get('counters', {}).get('num_accepted_tokens', '-')} | | {serve.get('start_s', '-')} "
                     f"| ok={serve.get('ok')} | |")
    (run.out / "gpu_e2e.md").write_text("\n".join(lines) + "\n")
    tokens = {n: o.result["tokens"] for n, o in run.outcomes.items() if o.status == "done"}
    (run.logs / "tokens.json").write_text(json.dumps({"prompts": run.prompts, "outputs": tokens}) + "\n")
    return summary


# -- main ----------------------------------------------------------------------------------------------------

def ensure_models(run: Run, models: Path, make: bool) -> None:
    if (models / "MANIFEST.json").is_file() and not make:
        log(f"models: using {models}")
    else:
        log(f"models: python -m kimi models make {models}")
        t0 = time.monotonic()
        with open(run.logs / "models.log", "wb") as out:
            proc = subprocess.run([sys.executable, "-m", "kimi", "models", "make", str(models), "--force"],
                                  cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
        if proc.returncode != 0:
            raise SystemExit(f"gpu_e2e: kimi models make failed:\n{_tail(run.logs / 'models.log')}")
        log(f"models: made in {time.monotonic() - t0:.0f} s")
    manifest = json.loads((models / "MANIFEST.json").read_text())
    run.models = {"dir": str(models), "aux_layer_ids": manifest.get("aux_layer_ids"),
                  "python": manifest.get("corpus", {}).get("python"),
                  "kimi_k25": (models / "kimi-k25" / "config.json").is_file(),
                  "files": sorted(manifest.get("files", {}))}


def plan(run: Run, models: Path) -> tuple[list[Job], dict[str, list[Job]], list[Job]]:
    """(phase-1 jobs, phase-2 lanes, Kimi-K2.5 jobs)."""
    a = run.args
    timeout = a.job_timeout_s

    def job(name: str, target: str, style: str | None, k: int | None, group: str = "target") -> Job:
        spec = None if style is None else {"method": "eagle3", "model": str(models / f"drafter-{style}"),
                                           "num_speculative_tokens": k}
        engine = {**run.engine, "max_num_seqs": max(8, len(run.prompts))}
        return Job(name, str(models / target), spec, engine, group, timeout)

    base = job("base", "target", None, None)
    styles = {style: [job(f"{style}_k{k}", "target", style, k) for k in a.ks] for style in a.styles}
    k25 = []
    if run.models["kimi_k25"] and a.k25:
        k25 = [job("k25_base", "kimi-k25", None, None, "k25"),
               *[job(f"k25_{style}_k{a.k25_k}", "kimi-k25", style, a.k25_k, "k25") for style in a.k25_styles]]
        if a.k25_images:
            for j in k25:
                j.images = {"prompt": K25_IMAGE_PROMPT, "colors": IMAGE_COLORS[:a.k25_images]}
    run.spec_names = {j.name for jobs in styles.values() for j in jobs} | {j.name for j in k25 if j.spec}
    run.planned = {base.name} | run.spec_names | {j.name for j in k25}
    return [base], styles, k25


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--models", type=Path, default=None,
                        help="reference models folder (default: SCRATCH/models, made with `kimi models make`)")
    parser.add_argument("--make-models", action="store_true", help="make the models even if the folder has them")
    parser.add_argument("--scratch", type=Path, default=None, help="work folder (default: a new temporary one)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 3, 5])
    parser.add_argument("--styles", nargs="+", default=["llama", "mla"])
    parser.add_argument("--k25-k", type=int, default=3)
    parser.add_argument("--k25-styles", nargs="*", default=["llama"])
    parser.add_argument("--k25-images", type=int, default=4, help="image requests in the Kimi-K2.5 runs (0: none)")
    parser.add_argument("--no-k25", dest="k25", action="store_false", help="leave the Kimi-K2.5 wrapper out")
    parser.add_argument("--serve-k", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--no-serve", dest="serve", action="store_false")
    parser.add_argument("--lanes", type=int, default=3, help="engines running at once (processes on one GPU)")
    parser.add_argument("--budget-s", type=float, default=450, help="no run starts after this many seconds")
    parser.add_argument("--job-timeout-s", type=float, default=240)
    parser.add_argument("--min-job-s", type=float, default=45, help="a run starts only with this much budget left")
    parser.add_argument("--grace-s", type=float, default=30, help="a running engine may overrun the budget by this")
    parser.add_argument("--engines-per-process", dest="fresh_process", action="store_false",
                        help="run a lane's engines one after the other in one worker process (default: one process "
                             "per engine)")
    parser.add_argument("--mla-backend", default=None, help="force the MLA attention backend (e.g. TRITON_MLA)")
    parser.add_argument("--no-fallback", dest="fallback", action="store_false",
                        help="do not retry a failed baseline with the Triton MLA backend")
    parser.add_argument("--small", action="store_true", help="short form: 8 prompts x 16 tokens, k = 3, 2 lanes")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="no GPU: eager float32 engines, 4 prompts x 8 tokens, k = 1, one lane")
    parser.add_argument("--worker", nargs=2, type=Path, metavar=("JOBS", "EVENTS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(*args.worker)
    explicit = {a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:]) if a.startswith("--")}
    if args.small:
        for key, value in (("prompts", 8), ("tokens", 16), ("ks", [3]), ("lanes", 2), ("k25_styles", [])):
            if "--" + key.replace("_", "-") not in explicit:
                setattr(args, key, value)
    if args.cpu_smoke:
        for key, value in (("prompts", 4), ("tokens", 8), ("ks", [1]), ("lanes", 1), ("k25_k", 1),
                           ("serve_k", 1), ("clients", 4), ("budget_s", 3000), ("job_timeout_s", 900),
                           ("min_job_s", 10)):
            if "--" + key.replace("_", "-") not in explicit:
                setattr(args, key, value)
    args.command = " ".join(["python3", "benchmarks/gpu_e2e.py", *(argv if argv is not None else sys.argv[1:])])
    args.date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    args.scratch = (args.scratch or Path(tempfile.mkdtemp(prefix="gpu_e2e-"))).resolve()
    args.scratch.mkdir(parents=True, exist_ok=True)
    out = args.out.resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    models = (args.models or args.scratch / "models").resolve()

    engine = dict(CPU_ENGINE if args.cpu_smoke else GPU_ENGINE)
    run = Run(args, out, engine, [])
    run.spec_names, run.planned = set(), set()
    log(f"out {out}, scratch {args.scratch}, budget {args.budget_s:.0f} s, {args.lanes} lanes")
    ensure_models(run, models, args.make_models)
    run.prompts = code_prompts(models / "target" / "tokenizer.json", args.prompts,
                               min(96, engine["max_model_len"] - args.tokens - 8))
    if args.mla_backend:
        run.variant = {"attention_config": {"backend_per_kind": {"mla_attention": args.mla_backend}}}
    first, styles, k25 = plan(run, models)
    for job in [*first, *[j for jobs in styles.values() for j in jobs], *k25]:
        job.engine.update(run.variant)
    if not run.models["kimi_k25"]:
        log(f"Kimi-K2.5 wrapper: not in {models} (this checkout's `kimi models make` does not write kimi-k25/); "
            "its runs are left out")
    write_results(run)

    def base_failed(job: Job, error: str) -> Job | None:
        if args.fallback and not args.cpu_smoke and not run.variant and job.name == "base":
            run.variant = dict(MLA_FALLBACK)
            log(f"base failed with vLLM's MLA backend choice; everything now runs with {json.dumps(run.variant)}")
            for j in [*[j for jobs in styles.values() for j in jobs], *k25]:
                j.engine.update(run.variant)
            return Job(job.name, job.target, job.spec, {**job.engine, **run.variant}, job.group, job.timeout_s)
        return None

    log(f"phase 1: the baseline ({len(run.prompts)} prompts x {args.tokens} tokens)")
    guarded(run, "lane base", run_lane, run, "base", first, base_failed)
    base = run.outcomes.get("base")
    baseline = base.result["tokens"] if base and base.status == "done" else None

    k25_state = {"fallback_used": False}

    def k25_failed(job: Job, error: str) -> Job | None:
        if not k25_state["fallback_used"] and job.name == "k25_base":
            k25_state["fallback_used"] = True
            for j in k25:
                j.engine.update(K25_FALLBACK)
                j.images = None
            log("k25_base failed with the vision tower profiled; the Kimi-K2.5 runs go on text-only")
            return Job(job.name, job.target, job.spec, {**job.engine, **K25_FALLBACK}, job.group, job.timeout_s)
        return None

    # phase 2: the drafter styles spread over lanes - 1 lanes; the last lane serves, then runs Kimi-K2.5
    n_lanes = max(1, args.lanes)
    merged: dict[str, list[Job]] = {}
    for i, jobs in enumerate(styles.values()):
        merged.setdefault(chr(ord("A") + i % max(1, n_lanes - 1)), []).extend(jobs)

    def serve() -> None:
        run.serve = run_serve(run, models, baseline)
        run.save()

    def last_lane() -> None:
        if args.serve:
            guarded(run, "serve", serve)
        if k25:
            guarded(run, "lane k25", run_lane, run, "k25", k25, k25_failed)

    log(f"phase 2: {', '.join(f'lane {n}: {[j.name for j in js]}' for n, js in merged.items())}; "
        f"last lane: {'serve, ' if args.serve else ''}{[j.name for j in k25]}")
    threads = [threading.Thread(target=guarded, args=(run, f"lane {name}", run_lane, run, name, jobs),
                                name=f"lane-{name}") for name, jobs in merged.items()]
    if n_lanes == 1:
        for t in threads:
            t.start()
            t.join()
        last_lane()
    else:
        threads.append(threading.Thread(target=last_lane, name="lane-last"))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    summary = write_results(run)
    log(f"done in {run.elapsed():.0f} s: passed={summary['passed']} {summary['checks']}")
    print((out / "gpu_e2e.md").read_text(), flush=True)
    return 0 if summary["passed"] else 1


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return platform.machine()


if __name__ == "__main__":
    sys.exit(main())
