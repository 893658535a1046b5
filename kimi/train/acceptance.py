"""Served acceptance: the target with an EAGLE-3 drafter in vLLM, greedy, and vLLM's own spec-decode metrics.

τ (mean acceptance length) = 1 + accepted tokens / drafts; per-position acceptance i = accepted tokens at
draft position i / drafts (``vllm:spec_decode_num_accepted_tokens_per_pos``).
"""

from __future__ import annotations

import gc

from kimi.e2e.engine import spec_metrics
from kimi.train.engine import engine_settings


def summarize(found: dict, k: int) -> dict:
    """τ and per-position rates from :func:`spec_metrics`'s counters."""
    drafts = found["num_drafts"]
    per_pos = (found["accepted_per_pos"] + [0.0] * k)[:k]
    return {"k": k, "tau": 1 + found["num_accepted_tokens"] / drafts if drafts else float("nan"),
            "per_position": [p / drafts if drafts else float("nan") for p in per_pos],
            "counters": {key: found[key] for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}}


def served_acceptance(target: str, drafter: str, prompt_ids: list[list[int]], k: int = 3, max_tokens: int = 64,
                      engine: dict | None = None) -> dict:
    """Serve ``target`` with ``drafter`` (EAGLE-3, ``k`` tokens), greedy ``max_tokens`` per prompt.

    Returns:
        {"k", "tau", "per_position": [k] floats, "counters": {...}, "tokens": per prompt the output ids}.
    """
    from vllm import LLM, SamplingParams

    spec = {"method": "eagle3", "model": drafter, "num_speculative_tokens": k}
    llm = LLM(model=target, speculative_config=spec, disable_log_stats=False, **(engine or engine_settings()))
    try:
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
        result = summarize(spec_metrics(llm.get_metrics()), k)
        result["tokens"] = [list(out.outputs[0].token_ids) for out in outputs]
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    return result
