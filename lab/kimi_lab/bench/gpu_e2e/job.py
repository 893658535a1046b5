"""One gpu_e2e run in a worker process (``benchmarks/gpu_e2e.py --worker``): start an engine, decode the prompts
greedily, read the spec-decode counters, shut the engine down. Imports vLLM and torch when it runs."""

from __future__ import annotations

import json
import time
import traceback

from kimi.e2e.engine import engine_info, spec_metrics, spec_metrics_since
from kimi_lab.bench.hardware import device
from kimi_lab.bench.workers import JobReport


def run(job: dict, spec: dict, report: JobReport) -> dict:
    """:func:`kimi_lab.bench.workers.serve_jobs`'s job function: :func:`run_job` on the jobs file's prompts and
    tokens, with a line in the lane's log before and after."""
    print(f"=== {job['name']}: {job['target']} spec={json.dumps(job['spec'])} engine={json.dumps(job['engine'])}",
          flush=True)
    result = run_job(job, job.get("prompts") or spec["prompts"], spec["tokens"])
    print(f"=== {job['name']}: done, counters {result['counters']}", flush=True)
    return result


def margin(step: dict) -> float | None:
    """Top-1 minus top-2 logprob at one position (None when fewer than two were returned)."""
    values = sorted((lp.logprob for lp in step.values()), reverse=True)
    return round(values[0] - values[1], 5) if len(values) > 1 else None


def image_run(llm, images: dict, tokens: int) -> dict:
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
        info = engine_info(llm)
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
        images = image_run(llm, job.get("images"), min(tokens, 16)) if job.get("images") else {}
    finally:
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception as exc:
            print(f"engine shutdown: {exc!r}", flush=True)
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    counters = spec_metrics_since(after, before)
    out_tokens = [list(o.outputs[0].token_ids) for o in outputs]
    generated = sum(len(t) for t in out_tokens)
    margins = [[margin(step) for step in (o.outputs[0].logprobs or [])] for o in outputs] \
        if job["spec"] is None else None
    return {"tokens": out_tokens, "counters": counters, "engine": info, "vllm_version": vllm.__version__, **images,
            "margins": margins,
            "device": device(), "start_s": round(started, 1), "generate_s": round(seconds, 3),
            "tokens_per_s": round(generated / seconds, 1) if seconds else None}
