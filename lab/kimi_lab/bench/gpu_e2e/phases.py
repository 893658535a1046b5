"""The order of a gpu_e2e call: phase 1 runs the baseline alone (it decides the MLA backend for all); phase 2
spreads the drafter styles over ``lanes - 1`` lanes while the last lane serves, then runs Kimi-K2.5."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from kimi.e2e.presets import K25_FALLBACK, MLA_FALLBACK
from kimi_lab.bench.gpu_e2e import log
from kimi_lab.bench.gpu_e2e.lanes import Job, Run, guarded, run_lane
from kimi_lab.bench.gpu_e2e.plan import plan
from kimi_lab.bench.gpu_e2e.serve import run_serve
from kimi_lab.bench.gpu_e2e.summary import write_results


def run_phases(run: Run, models: Path) -> dict:
    """Plan and run everything for ``run`` (models made, prompts cut); the final summary (results written).

    A baseline that fails with vLLM's MLA backend choice is tried again with
    :data:`~kimi.e2e.presets.MLA_FALLBACK`, and then every run takes it (``--no-fallback``: not); a Kimi-K2.5
    baseline that fails with its vision tower profiled is tried again text-only
    (:data:`~kimi.e2e.presets.K25_FALLBACK`).
    """
    args = run.args
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
    return write_results(run)
