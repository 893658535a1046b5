"""gpu_e2e's results: each run against its baseline, the checks, ``gpu_e2e.json``, ``gpu_e2e.md`` and
``logs/tokens.json`` (every run's tokens), rewritten after every run so that a call stopped by its time
limit keeps what finished."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from kimi.fork.fsutil import write_atomic
from kimi_lab.bench.hardware import describe
from kimi_lab.bench.results import header, write_json, write_lines

if TYPE_CHECKING:  # lanes.Run writes its results with write_results
    from kimi_lab.bench.gpu_e2e.lanes import Run

#: A drafter run is lossless when at least this share of its sequences equals the baseline's; under
#: ``VLLM_BATCH_INVARIANT=1`` every sequence must (a divergence is then a bug, not a bf16 near-tie).
LOSSLESS_MIN = 0.9
#: The baseline of each group of runs; a run's group is its name's prefix (``k25_...``, ``pair_...``).
BASELINES = {"target": "base", "k25": "k25_base", "pair": "pair_base"}


def group_of(name: str) -> str:
    """The group (a key of :data:`BASELINES`) of the run called ``name``."""
    return next((g for g in BASELINES if g != "target" and name.startswith(g + "_")), "target")


def batch_invariant() -> bool:
    """Whether the engines run in vLLM's batch-invariant mode (``VLLM_BATCH_INVARIANT=1``, inherited by the lanes)."""
    return os.environ.get("VLLM_BATCH_INVARIANT", "0") not in ("", "0")


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


def summarize(run: Run) -> dict:
    """The call's summary (the keys of ``gpu_e2e.json``): per run its status, engine and timings; lossless
    comparisons and spec-decode counters of the drafter runs; the serve check; the checks and ``passed``."""
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
            base = BASELINES[group_of(name)]
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
        **({"batch_invariant_every_sequence_identical": bool(lossless) and all(
            v["identical"] == v["total"] for v in lossless.values())} if batch_invariant() else {}),
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
        "device": describe(device),
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
                     "lanes": run.args.lanes, "budget_s": run.args.budget_s,
                     "batch_invariant": batch_invariant(), "profile":
                     "cpu-smoke" if run.args.cpu_smoke else ("small" if run.args.small else "full")},
        "models": run.models,
        "orchestrator_errors": run.errors,
        "seconds": round(run.elapsed(), 1),
    }


def write_results(run: Run) -> dict:
    """Write ``gpu_e2e.json``, ``gpu_e2e.md`` and ``logs/tokens.json`` for ``run`` (atomically); the summary."""
    summary = summarize(run)
    run.out.mkdir(parents=True, exist_ok=True)
    write_json(run.out / "gpu_e2e.json", summary)
    details = summary["device_details"]
    lines = [*header("GPU end to end", summary["command"], summary["date"]),
             f"- hardware: {summary['device']}, torch {details.get('torch')}, CUDA {details.get('cuda')}",
             f"- vLLM: {summary['vllm_version']}",
             (f"- CUDA graphs on in every run: {summary['cuda_graphs']}; {len(run.prompts)} prompts x "
              f"{run.args.tokens} tokens, greedy"),
             f"- VLLM_BATCH_INVARIANT=1: {summary['settings']['batch_invariant']}",
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
    write_lines(run.out / "gpu_e2e.md", lines)
    tokens = {n: o.result["tokens"] for n, o in run.outcomes.items() if o.status == "done"}
    write_atomic(run.logs / "tokens.json", json.dumps({"prompts": run.prompts, "outputs": tokens}) + "\n")
    return summary

