"""Greedy generation with the fork's vLLM and, independently, with transformers; their comparison.

Used by ``benchmarks/cpu_e2e.py``, ``kimi_lab.bench``, ``kimi train`` and the tests. Needs the fork's venv (vLLM,
torch, transformers; imported inside the functions). ``CPU_ENGINE`` (the settings of a CPU run) is
:data:`kimi.e2e.presets.CPU_ENGINE`, importable from here too. Prompts are given as text and tokenized once
with the model folder's tokenizer, so both implementations see the same token ids.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

from kimi.e2e.presets import CPU_ENGINE

__all__ = ["CPU_ENGINE", "GreedyRun", "SPEC_METRICS", "common_prefix", "engine_info", "hf_greedy", "identical",
           "parity",
           "self_draft_model", "spec_metrics", "spec_metrics_since", "tokenize", "vllm_greedy"]


@dataclass
class GreedyRun:
    """Result of one engine run.

    Attributes:
        tokens: per prompt, the generated token ids (``max_tokens`` each; EOS is ignored).
        counters: spec-decode counters (``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens``);
            zeros without speculation.
        top_logits: per prompt and position, ``{token_id: raw logit}`` for the top tokens, when asked for.
        start_s: seconds the engine took to start (``LLM(...)``: config, weights, KV cache, compilation).
    """

    tokens: list[list[int]]
    counters: dict[str, float]
    top_logits: list[list[dict[int, float]]] = field(default_factory=list)
    start_s: float = 0.0


def tokenize(model: str, prompts: list[str]) -> list[list[int]]:
    """Token ids of ``prompts`` with the tokenizer saved in the model folder (special tokens as it adds them)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    return [tokenizer(prompt).input_ids for prompt in prompts]


def vllm_greedy(model: str, prompt_ids: list[list[int]], max_tokens: int, speculative: dict | None = None,
                top_logits: int = 0, **engine) -> GreedyRun:
    """Greedy ``max_tokens`` per prompt with ``vllm.LLM``; the engine is shut down before returning.

    ``engine`` goes to ``LLM(...)`` on top of nothing (pass :data:`~kimi.e2e.presets.CPU_ENGINE` on CPU);
    ``speculative`` is vLLM's ``speculative_config``; ``top_logits`` > 0 also returns that many raw logits per
    position (``logprobs_mode="raw_logits"``).
    """
    from vllm import LLM, SamplingParams

    if top_logits:
        engine["logprobs_mode"] = "raw_logits"
    began = time.monotonic()
    llm = LLM(model=model, speculative_config=speculative, disable_log_stats=False, **engine)
    start_s = time.monotonic() - began
    try:
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                                logprobs=top_logits or None)
        outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
        tokens = [list(out.outputs[0].token_ids) for out in outputs]
        logits = [[{tok: lp.logprob for tok, lp in step.items()} for step in out.outputs[0].logprobs]
                  for out in outputs] if top_logits else []
        found = spec_metrics(llm.get_metrics())
        counters = {key: found[key] for key in SPEC_METRICS.values()}
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    return GreedyRun(tokens, counters, logits, round(start_s, 1))


#: ``LLM.get_metrics()`` counter name -> key in :func:`spec_metrics`'s result.
SPEC_METRICS = {"vllm:spec_decode_num_drafts": "num_drafts", "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
                "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens"}


def spec_metrics(metrics) -> dict:
    """``{"num_drafts", "num_draft_tokens", "num_accepted_tokens": float, "accepted_per_pos": [k] floats}``
    from ``LLM.get_metrics()`` (summed over engines; zeros and ``[]`` without speculation).

    ``accepted_per_pos`` is vLLM's ``vllm:spec_decode_num_accepted_tokens_per_pos`` vector: accepted
    tokens at each draft position.
    """
    found: dict = dict.fromkeys(SPEC_METRICS.values(), 0.0)
    per_pos: list[float] = []
    for metric in metrics:
        if metric.name in SPEC_METRICS:
            found[SPEC_METRICS[metric.name]] += float(metric.value)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            values = [float(v) for v in metric.values]
            per_pos = [a + b for a, b in zip(per_pos + [0.0] * (len(values) - len(per_pos)), values, strict=True)]
    found["accepted_per_pos"] = per_pos
    return found


#: The fork's counter of the drafts adaptive verification verified, one per draft position (``kimi.spec.metrics``).
ADAPTIVE_VERIFIED = "vllm:spec_decode_adaptive_verified_tokens_per_pos"


def adaptive_verified(metrics) -> float | None:
    """Drafts adaptive verification verified (its per-position counter summed over positions and engines) from
    ``LLM.get_metrics()``; None where the engine has no such counter (no adaptive verification). vLLM's
    ``num_draft_tokens`` counts the drafts scheduled, verified or not."""
    found = [float(m.value) for m in metrics if m.name.removesuffix("_total") == ADAPTIVE_VERIFIED]
    return sum(found) if found else None


def spec_metrics_since(after: dict, before: dict) -> dict:
    """What the engine counted between two :func:`spec_metrics` readings: each counter's increase, and
    ``accepted_per_pos`` position by position (a ``before`` read before any draft has ``[]``: zeros)."""
    now = after["accepted_per_pos"]
    then = (before["accepted_per_pos"] + [0.0] * len(now))[:len(now)]
    return {**{k: after[k] - before[k] for k in SPEC_METRICS.values()},
            "accepted_per_pos": [a - b for a, b in zip(now, then, strict=True)]}


def timed_greedy(llm, prompt_ids: list[list[int]], tokens: int) -> tuple[float, dict, list[list[int]]]:
    """Warm ``llm`` with a 4-token greedy batch of ``prompt_ids``, then time ``tokens`` greedy tokens per prompt in
    one batch (``ignore_eos``).

    Returns ``(seconds, counted, token_ids)``: wall seconds of the timed batch, what the engine's speculative
    decoding counters counted during it (:func:`spec_metrics_since`), and each prompt's generated ids.
    """
    from vllm import SamplingParams

    batch = [{"prompt_token_ids": ids} for ids in prompt_ids]
    llm.generate(batch, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    before = spec_metrics(llm.get_metrics())
    began = time.monotonic()
    outputs = llm.generate(batch, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True), use_tqdm=False)
    seconds = time.monotonic() - began
    counted = spec_metrics_since(spec_metrics(llm.get_metrics()), before)
    return seconds, counted, [list(out.outputs[0].token_ids) for out in outputs]


def close_engine(llm) -> None:
    """Shut the in-process engine down and free what it held, so that the next engine of the process starts
    clean (on a GPU: its memory and vLLM's distributed state)."""
    from vllm.distributed import cleanup_dist_env_and_memory

    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()


def model_runner(config) -> str:
    """``"v2"`` or ``"v1"``: the model runner a ``VllmConfig`` serves with. vLLM 0.26 - 0.32 choose by
    ``use_v2_model_runner``; the mainline's release removed Model Runner V1 and the attribute with it (always
    ``"v2"``)."""
    return "v2" if getattr(config, "use_v2_model_runner", True) else "v1"


def engine_info(llm) -> dict:
    """What an ``LLM`` runs with, for a result file: eager or not, CUDA-graph and compilation modes, the
    capture sizes (``[min, max, count]``), the target's architecture, the model runner (``v1``/``v2``) and,
    with speculation, the drafter's architecture and aux layer ids. A failure to read them is reported under
    ``"error"``, never raised."""
    info: dict = {}
    try:
        config = llm.llm_engine.vllm_config
        info["enforce_eager"] = bool(config.model_config.enforce_eager)
        info["cudagraph_mode"] = str(config.compilation_config.cudagraph_mode)
        info["compilation_mode"] = str(config.compilation_config.mode)
        sizes = config.compilation_config.cudagraph_capture_sizes or []
        info["cudagraph_capture_sizes"] = [min(sizes), max(sizes), len(sizes)] if sizes else []
        info["architecture"] = (config.model_config.architectures or ["?"])[0]
        info["model_runner"] = model_runner(config)
        if config.speculative_config is not None:
            spec = config.speculative_config
            info["draft_architecture"] = (spec.draft_model_config.architectures or ["?"])[0]
            hf = spec.draft_model_config.hf_config
            info["aux_layer_ids"] = list(getattr(hf, "eagle_aux_hidden_state_layer_ids", []) or [])
    except Exception as exc:  # report, never fail a run for it
        info["error"] = repr(exc)
    return info


def hf_greedy(model: str, prompt_ids: list[list[int]], max_tokens: int, dtype: str = "float32"):
    """Greedy decoding with transformers' implementation of the model (its own KV cache, no vLLM code).

    Returns ``(tokens, logits)``: per prompt the ``max_tokens`` argmax ids, and the float32 logits
    ``[max_tokens, vocab]`` that chose them.
    """
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).eval()
    tokens, logits = [], []
    with torch.no_grad():
        for ids in prompt_ids:
            step_input, past, chosen, rows = torch.tensor([ids]), None, [], []
            for _ in range(max_tokens):
                out = hf(step_input, past_key_values=past, use_cache=True)
                row = out.logits[0, -1].float()
                past, nxt = out.past_key_values, int(row.argmax())
                chosen.append(nxt)
                rows.append(row)
                step_input = torch.tensor([[nxt]])
            tokens.append(chosen)
            logits.append(torch.stack(rows))
    return tokens, logits


def parity(vllm_run: GreedyRun, hf_tokens: list[list[int]], hf_logits) -> dict:
    """Compare vLLM's greedy run with transformers'.

    Returns ``{"matching": prompts whose tokens are all equal, "total": prompts, "max_logit_diff": the
    largest |vLLM raw logit - transformers logit| over the top tokens vLLM reported, at every position
    up to and including the first difference (later positions see different inputs)}``.
    """
    matching, worst = 0, 0.0
    for ours, theirs, top, rows in zip(vllm_run.tokens, hf_tokens, vllm_run.top_logits, hf_logits, strict=True):
        matching += ours == theirs
        for pos, (step, row) in enumerate(zip(top, rows, strict=True)):
            worst = max(worst, max(abs(value - float(row[tok])) for tok, value in step.items()))
            if ours[pos] != theirs[pos]:
                break
    return {"matching": matching, "total": len(hf_tokens), "max_logit_diff": worst}


def identical(a: GreedyRun, b: GreedyRun) -> dict:
    """``{"identical": sequences equal in both runs, "total": sequences}``."""
    return {"identical": sum(x == y for x, y in zip(a.tokens, b.tokens, strict=True)), "total": len(a.tokens)}


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share: the index where they part, the shorter one's length when one
    starts the other (the length of both when equal)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def self_draft_model(target: str, dest: str) -> str:
    """A copy of ``target`` (weights linked, not copied) that vLLM accepts as a ``draft_model`` drafter.

    vLLM turns every ``deepseek_v3`` draft config into its MTP head (``SpeculativeConfig.hf_config_override``),
    so the copy says ``model_type: kimi_k2`` (how Kimi-K2 ships the same architecture). With the target as
    its own drafter nearly every draft is accepted, which exercises verification with accepted tokens.
    Returns ``dest``.
    """
    import json
    import os

    os.makedirs(dest, exist_ok=True)
    for name in os.listdir(target):
        if name != "config.json" and not os.path.lexists(os.path.join(dest, name)):
            os.symlink(os.path.abspath(os.path.join(target, name)), os.path.join(dest, name))
    with open(os.path.join(target, "config.json")) as f:
        config = json.load(f)
    config["model_type"] = "kimi_k2"
    with open(os.path.join(dest, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return dest
