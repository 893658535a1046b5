"""gpu_e2e's ``vllm serve`` check: the target with the Llama-style drafter, concurrent OpenAI completion requests
(standard library HTTP), answers compared with the offline baseline, counters read from ``/metrics``."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kimi.e2e.server import VllmServer, request, serve_args, spec_counters, vllm_command
from kimi.errors import KimiError
from kimi_lab.bench.gpu_e2e import log
from kimi_lab.bench.gpu_e2e.lanes import Run
from kimi_lab.bench.workers import checkout, vllm_env


def serve_engine(run: Run, spec: dict) -> dict:
    """The ``LLM(...)`` settings of the served engine: the call's (with the variant), seed 0, room for every
    client, the speculative config (``kimi.e2e.server.serve_args`` writes them as flags)."""
    return {**run.engine, **run.variant, "seed": 0, "max_num_seqs": max(8, run.args.clients),
            "speculative_config": spec}


def run_serve(run: Run, models: Path, baseline: list[list[int]] | None) -> dict:
    """``vllm serve`` with the Llama-style drafter; concurrent completions; /metrics; stop. The result's ``ok``:
    every request answered in full and the drafter drafted."""
    k = run.args.serve_k
    spec = {"method": "eagle3", "model": str(models / "drafter-llama"), "num_speculative_tokens": k}
    env = vllm_env([checkout(), os.environ.get("PYTHONPATH")], run.args.scratch / "vllm-cache-serve")
    server = VllmServer(vllm_command(), str(models / "target"), serve_args(serve_engine(run, spec)),
                        run.logs / "serve.log", env=env, cwd=checkout())
    max_tokens = min(run.args.tokens, 32)
    result: dict = {"ok": False, "requests": run.args.clients, "command": " ".join(server.cmd), "speculative": spec}
    if run.left() < run.args.min_job_s:
        result["error"] = f"skipped: time budget ({run.left():.0f} s left)"
        log("serve: skipped (time budget)")
        return result
    log(f"serve: starting `vllm serve` (EAGLE-3 llama, k = {k})")
    t0 = time.monotonic()
    try:
        try:
            server.start(timeout=min(run.args.job_timeout_s, run.left() + run.args.grace_s))
        except KimiError as exc:
            result["error"] = str(exc)
            exited = server.proc is not None and server.proc.poll() is not None
            log(f"serve: FAILED ({f'exited with status {server.proc.returncode}' if exited else 'not ready in time'})")
            return result
        result["start_s"] = round(time.monotonic() - t0, 1)
        log(f"serve: ready after {result['start_s']:.0f} s; {run.args.clients} concurrent requests")
        prompts = run.prompts[:run.args.clients]

        def ask(ids: list[int]) -> tuple[int, dict | str]:
            try:
                answer = server.complete(ids, max_tokens, timeout=180, ignore_eos=True, return_token_ids=True)
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
            answer = request(f"{server.base}/metrics", timeout=30)
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
        server.stop()
        result["stopped"] = server.proc is not None and server.proc.returncode is not None
        result["seconds"] = round(time.monotonic() - t0, 1)
