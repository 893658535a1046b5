"""One adaptive-verification call: the off-domain candidates (one engine), then each model's five engines started
at once and measured in interleaved rounds (:func:`kimi_lab.bench.perf.orchestrate.run_parallel`), the results
rewritten after every engine."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kimi.errors import KimiError
from kimi_lab.bench.adaptive import log
from kimi_lab.bench.adaptive.analysis import goal, rows_of
from kimi_lab.bench.adaptive.plan import (
    ENGINES,
    engine_options,
    jobs_of,
    measurement_points,
    prompt_sets,
    sites,
    speculative_config,
)
from kimi_lab.bench.adaptive.render import write_candidates, write_outputs
from kimi_lab.bench.hardware import describe
from kimi_lab.bench.perf.analysis import versions_of, without_tokens
from kimi_lab.bench.perf.orchestrate import Worker, run_parallel

#: The concurrency the candidates are measured at (one batch per kind).
CANDIDATE_C = 8


def candidate_sets(tokenizer_json: Path, count: int, lengths: tuple[int, int]) -> tuple[dict, list[str]]:
    """``({kind: prompts}, notes)``: the held-out code prompts (``in``, for scale) and every off-domain kind of
    :data:`kimi.models.offdomain.KINDS` this Python can make at ``lengths``; a note per kind it cannot."""
    from kimi.models.offdomain import KINDS, offdomain_prompts
    from kimi.models.prompts import code_prompt_ids

    sets, notes = {"in": code_prompt_ids(tokenizer_json, count, 256)}, []
    for kind in KINDS:
        try:
            sets[kind] = offdomain_prompts(kind, tokenizer_json, count, lengths[1], lengths[0])
        except KimiError as exc:
            notes.append(f"candidate {kind} left out: {exc}")
    return sets, notes


def candidates_of(result: dict, sets: dict) -> list[dict]:
    """A row per candidate kind measured by the candidates' engine: τ, drafting steps, accepted drafts, prompt
    lengths (min-max)."""
    rows = []
    for key, entry in result.get("by_concurrency", {}).items():
        kind = key.rsplit("/", 1)[0]
        lengths = [len(p) for p in sets[kind]]
        rows.append({"kind": kind, "tau": round(entry["tau"], 3) if entry.get("tau") else None,
                     "drafts": entry.get("drafts"), "accepted": entry.get("accepted"),
                     "lengths": f"{min(lengths)}-{max(lengths)}"})
    return rows


def lowest(rows: list[dict]) -> str | None:
    """The off-domain kind of the lowest τ among candidate ``rows`` (the in-domain row left out)."""
    off = [r for r in rows if r["kind"] != "in" and r["tau"] is not None]
    return min(off, key=lambda r: r["tau"])["kind"] if off else None


def run_candidates(args: argparse.Namespace, pair: Path, deadline: float) -> dict:
    """τ of the fork's fixed k = 3 on every candidate kind, one engine, one greedy batch of :data:`CANDIDATE_C`
    requests per kind (``--tokens`` each): ``{"rows", "notes", "tokens", "concurrency", "error"?}``."""
    sets, notes = candidate_sets(pair / "target" / "tokenizer.json", CANDIDATE_C, tuple(args.off_lengths))
    job = {"name": "candidates/fork_k3", "model": "candidates", "variant": "fork", "setting": "fork_k3", "k": 3,
           "spec": speculative_config("fork_k3", str(pair / "drafter")), "target": str(pair / "target"),
           "prompt_sets": sets, "points": [[kind, CANDIDATE_C] for kind in sets], "concurrency": [CANDIDATE_C],
           "tokens": args.tokens, "reps": 1, "step_times": False, "temperature": args.temperature,
           "engine": args.engine}
    log(f"candidates: {', '.join(sets)} at c = {CANDIDATE_C}")
    result = Worker(args, job, args.scratch).collect(min(args.job_timeout_s, deadline - time.monotonic()))
    out = {"rows": candidates_of(result, sets), "notes": notes, "tokens": args.tokens, "concurrency": CANDIDATE_C,
           "device": result.get("device"), "vllm": result.get("vllm_version")}
    if result.get("status") != "done":
        out["error"] = result.get("error", "")[-2000:]
    for row in out["rows"]:
        log(f"candidates: {row['kind']}: tau {row['tau']} ({row['lengths']} tokens)")
    return out


def summarize(args: argparse.Namespace, made: dict, jobs: list[dict], runs: dict, extra: dict,
              started: float) -> dict:
    """A call's summary (the keys of ``adaptive.json``)."""
    done = [r for r in runs.values() if r.get("status") == "done"]
    rows = rows_of(runs, jobs)
    return {
        **made, "device": describe(done[0]["device"], versions=True) if done else None,
        "versions": versions_of(runs, jobs), "upstream": extra["upstream"],
        "settings": {"device": args.device, "models": args.models, "sets": args.sets, "concurrency": args.concurrency,
                     "tokens": args.tokens, "reps": args.reps, "rounds": args.rounds, "turns": args.turns,
                     "rewarm_tokens": args.rewarm_tokens, "pinned": args.pin, "temperature": args.temperature,
                     "off_kind": extra["off_kind"], "lengths": extra["lengths"], "engine": args.engine,
                     "engines": {e: (ENGINES[e][0], engine_options(e, args.adaptive_k)) for e in ENGINES
                                 if not args.engines or e in args.engines}},
        "rows": rows, "goal": goal(rows), "candidates": extra.get("candidates"), "notes": extra.get("notes", []),
        "runs": {j["name"]: {k: v for k, v in without_tokens(runs.get(j["name"], {"status": "not run"})).items()}
                 for j in jobs},
        "seconds": round(time.monotonic() - started, 1)}


def run_call(args: argparse.Namespace, root: Path, made: dict) -> int:
    """The whole call (module docstring); ``made``: the command and date (:func:`kimi_lab.bench.results.stamp`).
    Returns the exit status: 0 when every engine finished."""
    started = time.monotonic()
    deadline = started + args.budget_s
    args.scratch.mkdir(parents=True, exist_ok=True)
    extra: dict = {"upstream": sites(args, root), "notes": []}
    if extra["upstream"].get("removed"):
        log(f"upstream site {args.upstream_site}: kept {extra['upstream']['kept']}, "
            f"took out {len(extra['upstream']['removed'])} patches")
    pair = args.pair.resolve()
    kind = args.off_kind
    if args.candidates or kind == "lowest":
        extra["candidates"] = run_candidates(args, pair, deadline)
        extra["notes"] += extra["candidates"]["notes"]
        if args.candidates_only:
            extra["candidates"]["chosen"] = lowest(extra["candidates"]["rows"])
            summary = {**made, "device": describe(extra["candidates"].get("device") or {}, versions=True),
                       "versions": extra["candidates"].get("vllm"), "candidates": extra["candidates"]}
            write_candidates(args.out, summary)
            return 0 if "error" not in extra["candidates"] else 1
        if kind == "lowest":
            kind = lowest(extra["candidates"]["rows"])
            if kind is None:
                raise KimiError("no off-domain candidate gave a tau: --off-kind names one")
    extra["candidates"] = {**extra.get("candidates", {}), "chosen": kind}
    count = min(max(args.concurrency), 48)  # the held-out files give about 50 prompts; larger batches repeat them
    sets = prompt_sets(pair / "target" / "tokenizer.json", count, kind, tuple(args.off_lengths))
    extra["off_kind"] = kind
    extra["lengths"] = {name: f"{min(map(len, ps))}-{max(map(len, ps))}" for name, ps in sets.items()}
    common = {"prompt_sets": {s: sets[s] for s in args.sets}, "points": measurement_points(args.sets, args.concurrency),
              "concurrency": args.concurrency, "tokens": args.tokens, "reps": args.reps,
              "rewarm_tokens": args.rewarm_tokens, "step_times": args.step_times, "temperature": args.temperature,
              "engine": args.engine}
    models = {"pair": pair}
    if "wide" in args.models:
        models["wide"] = wide_pair(pair, args.scratch / "pair-wide")
    jobs = [j for model, folder in models.items() if model in args.models
            for j in jobs_of(model, folder, common, args.engines, args.adaptive_k)]
    runs: dict[str, dict] = {}

    def report(job: dict | None = None) -> None:
        write_outputs(args.out, summarize(args, made, jobs, runs, extra, started))
        if job is not None:
            r = runs[job["name"]]
            log(f"{job['name']}: {r['status']}" + (f" (start {r.get('start_s')} s)" if r["status"] == "done"
                                                   else f": {r.get('error', '').strip()[-300:]}"))

    log(f"{len(jobs)} engines, budget {args.budget_s:.0f} s: {', '.join(j['name'] for j in jobs)}")
    for model in models:
        group = [j for j in jobs if j["model"] == model]
        if group:
            run_parallel(args, group, deadline, runs, report)
    report()
    return 0 if all(runs.get(j["name"], {}).get("status") == "done" for j in jobs) else 1


def wide_pair(pair: Path, out: Path) -> Path:
    """The pair widened (:func:`kimi.models.widen.widen_pair`) into ``out``, or the one an earlier call left there."""
    from kimi.models.widen import widen_pair

    if not (out / "MANIFEST.json").is_file():
        log(f"widening {pair} into {out}")
        widen_pair(pair, out, force=True)
    return out
