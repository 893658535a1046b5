"""Adaptive verification against fixed EAGLE-3 and no speculation on the mainline's CPU platform.

``benchmarks/adaptive.py`` runs each setting (:data:`SETTINGS`) as a fresh child process of the mainline's
python, settings in turns round after round (the same machine load for each); a child measures one engine on
both prompt sets (:func:`measure`) and the orchestrator compares medians (:func:`summarize`).
"""

from __future__ import annotations

import random
import statistics
import time

#: setting -> what it adds to EAGLE-3's speculative config (None: no speculation).
SETTINGS = {"nospec": None, "eagle3": {}, "adaptive": {"enable_adaptive_verification": True}}
#: Prompt sets, in the order a child measures them.
DOMAINS = ("off", "in")


def speculative_config(setting: str, drafter: str, k: int) -> dict | None:
    """vLLM's ``speculative_config`` for ``setting`` of :data:`SETTINGS` (None for no speculation).

    Raises:
        ValueError: an unknown setting.
    """
    if setting not in SETTINGS:
        raise ValueError(f"unknown setting {setting!r}: one of {', '.join(SETTINGS)}")
    extra = SETTINGS[setting]
    if extra is None:
        return None
    return {"method": "eagle3", "model": drafter, "num_speculative_tokens": k, **extra}


def random_prompts(vocab_size: int, count: int, length: int, seed: int = 0) -> list[list[int]]:
    """``count`` prompts of ``length`` token ids drawn uniformly from ``[0, vocab_size)`` (off-domain text)."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(length)] for _ in range(count)]


def measure(target: str, drafter: str, setting: str, k: int, prompts: dict[str, list[list[int]]], tokens: int,
            max_num_seqs: int) -> dict:
    """One engine (the mainline's CPU platform, float32, eager) for ``setting``; for each prompt set of
    ``prompts`` (keys :data:`DOMAINS`, in that order): a 4-token warm-up batch, then ``tokens`` greedy tokens
    per prompt in one batch, timed.

    Returns ``{"vllm", "start_s", "<domain>": {"seconds", "tok_s", "tau", "draft_tokens", "tokens"}}``; ``tau``
    is 1 + accepted / drafts of the timed batch (None without drafts), ``draft_tokens`` the drafts the engine
    counted as verified.
    """
    import vllm
    from vllm import LLM

    from kimi.e2e.engine import timed_greedy
    from kimi.e2e.presets import CPU_EAGER

    began = time.monotonic()
    llm = LLM(model=target, speculative_config=speculative_config(setting, drafter, k), disable_log_stats=False,
              **{**CPU_EAGER, "max_num_seqs": max_num_seqs})
    found: dict = {"vllm": vllm.__version__, "start_s": round(time.monotonic() - began, 1)}
    try:
        for domain in DOMAINS:
            seconds, counted, token_ids = timed_greedy(llm, prompts[domain], tokens)
            drafts = counted["num_drafts"]
            found[domain] = {"seconds": round(seconds, 3), "tok_s": round(tokens * len(token_ids) / seconds, 2),
                             "tau": round(1 + counted["num_accepted_tokens"] / drafts, 3) if drafts else None,
                             "draft_tokens": counted["num_draft_tokens"],
                             "tokens": token_ids}
    finally:
        llm.llm_engine.engine_core.shutdown()
    return found


def summarize(runs: dict[str, list[dict]]) -> list[dict]:
    """One row per prompt set: each setting's median tok/s over rounds, ``adaptive`` over ``nospec`` and over
    ``eagle3`` (ratio of medians, with every round's ratio), tau per setting (first round) and ``lossless``
    (every speculative round's tokens equal the first no-speculation round's).

    ``runs``: setting -> its rounds' :func:`measure` results (every setting of :data:`SETTINGS`, same rounds).
    """
    rows = []
    for domain in DOMAINS:
        rounds = {setting: [r[domain] for r in runs[setting]] for setting in SETTINGS}
        median = {setting: statistics.median(r["tok_s"] for r in rs) for setting, rs in rounds.items()}
        plain = rounds["nospec"][0]["tokens"]
        row = {"domain": domain, "rounds": len(rounds["nospec"]), "tok_s": median,
               "tok_s_rounds": {s: [r["tok_s"] for r in rs] for s, rs in rounds.items()},
               "tau": {s: rs[0]["tau"] for s, rs in rounds.items()},
               "draft_tokens": {s: rs[0]["draft_tokens"] for s, rs in rounds.items()},
               "lossless": all(r["tokens"] == plain for s in ("eagle3", "adaptive") for r in rounds[s])}
        for other in ("nospec", "eagle3"):
            row[f"adaptive_vs_{other}"] = round(median["adaptive"] / median[other], 3)
            row[f"adaptive_vs_{other}_rounds"] = [round(a["tok_s"] / b["tok_s"], 3) for a, b in
                                                  zip(rounds["adaptive"], rounds[other], strict=True)]
        row["eagle3_vs_nospec"] = round(median["eagle3"] / median["nospec"], 3)
        rows.append(row)
    return rows
