"""Drafters made by other tools: our drafter written by speculators and in SpecForge's layout,
inspected, converted and served, against our own drafter's run.

Same weights give the same drafts, so each checkpoint served directly and its ``kimi drafter convert`` copy must
give our drafter's greedy tokens and its spec-decode counters (drafts, draft and accepted tokens) exactly. The
checkpoints are :mod:`kimi_lab.drafter.other_tools`'s; the engines are :func:`kimi.e2e.engine.vllm_greedy` with
:data:`kimi.e2e.presets.CPU_EAGER`. Needs the fork's venv, and speculators for its part (``docs/drafters.md``).
"""

from __future__ import annotations

from pathlib import Path

from kimi.drafter.convert import convert
from kimi.drafter.inspect import inspect
from kimi.e2e.engine import GreedyRun, identical, tokenize, vllm_greedy
from kimi.e2e.presets import CPU_EAGER
from kimi.models.prompts import code_prompts
from kimi_lab.drafter.other_tools import specforge_checkpoint, speculators_checkpoint

#: Draft tokens per step.
K = 3
#: Per tool: the format ``kimi drafter inspect`` must name, and how the checkpoint is made
#: ``(drafter, target, dst) -> dst``.
TOOLS = {
    "speculators": ("speculators", lambda ours, target, dst: speculators_checkpoint(ours, target, dst, force=True)),
    "specforge": ("eagle3-llama", lambda ours, target, dst: specforge_checkpoint(ours, dst, force=True)),
}


def _served(target: Path, drafter: Path, prompt_ids: list[list[int]], tokens: int) -> GreedyRun:
    spec = {"method": "eagle3", "model": str(drafter), "num_speculative_tokens": K}
    return vllm_greedy(str(target), prompt_ids, tokens, speculative=spec, **CPU_EAGER)


def _against(run: GreedyRun, ours: GreedyRun) -> dict:
    return {**identical(run, ours), "counters": run.counters, "counters_equal": run.counters == ours.counters}


def check_tool(tool: str, target: Path, drafter: Path, work: Path, prompt_ids: list[list[int]], tokens: int,
               ours: GreedyRun) -> dict:
    """One tool's checkpoint of ``drafter`` in ``work/TOOL``: made, inspected, converted to ``work/TOOL-vllm``,
    both served against ``ours``.

    Returns:
        ``{"format", "format_expected", "format_ok", "aux_layer_ids", "problems", "inspect_ok", "converted",
        "served": {"original" | "converted": {"identical", "total", "counters", "counters_equal"}}}``; a step
        that fails ends it with ``"error"`` (the message) and ``"failed_at"`` (the step).
    """
    expected, make = TOOLS[tool]
    ours_ids = inspect(drafter, target).aux_layer_ids
    result: dict = {"format_expected": expected, "converted": False, "served": {}}
    step = "make"
    try:
        original = make(drafter, target, work / tool)
        step = "inspect"
        report = inspect(original, target)
        result.update(format=report.format, format_ok=report.format == expected, aux_layer_ids=report.aux_layer_ids,
                      problems=report.problems)
        result["inspect_ok"] = result["format_ok"] and not report.problems and report.aux_layer_ids == ours_ids
        step = "convert"
        converted = work / f"{tool}-vllm"
        convert(original, converted, target, force=True)
        result["converted"] = inspect(converted, target).aux_layer_ids == ours_ids
        for kind, model in (("original", original), ("converted", converted)):
            step = f"serve {kind}"
            result["served"][kind] = _against(_served(target, model, prompt_ids, tokens), ours)
    except Exception as exc:  # recorded in the result: the other tool's check still runs
        result.update(error=f"{type(exc).__name__}: {exc}", failed_at=step)
    return result


def check_other_tools(pair: Path, work: Path, drafter: str = "drafter", prompts: int = 4, tokens: int = 32) -> dict:
    """Every tool of :data:`TOOLS` on the Llama-style drafter ``pair/DRAFTER`` of the target ``pair/target``.

    Args:
        pair: a folder with ``target`` and the drafter (``models/pair``; ``.kimi/models/reference`` with
            ``drafter="drafter-llama"``).
        work: where the checkpoints are written (``work/speculators``, ``work/specforge`` and their
            ``-vllm`` copies; replaced on a rerun).
        prompts, tokens: greedy requests of :func:`kimi.models.prompts.code_prompts` and tokens per request.

    Returns:
        ``{"target", "drafter", "prompts", "tokens", "k", "ours": {"counters"}, "tools": {TOOL: check_tool(...)},
        "lossless": every checkpoint served with our tokens and counters}``.
    """
    target, ours_path = pair / "target", pair / drafter
    prompt_ids = tokenize(str(target), code_prompts(prompts))
    ours = _served(target, ours_path, prompt_ids, tokens)
    tools = {tool: check_tool(tool, target, ours_path, work, prompt_ids, tokens, ours) for tool in TOOLS}
    lossless = all(len(r["served"]) == 2 and all(s["identical"] == s["total"] and s["counters_equal"]
                                                 for s in r["served"].values()) for r in tools.values())
    return {"target": str(target), "drafter": str(ours_path), "prompts": prompts, "tokens": tokens, "k": K,
            "ours": {"counters": ours.counters}, "tools": tools, "lossless": lossless}
