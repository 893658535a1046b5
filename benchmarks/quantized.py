"""EAGLE-3 on quantized targets, fork against upstream vLLM on one GPU (issue 22).

One GPU call (``benchmarks/gpu_call.sh`` installs the pinned upstream release, keeps a pristine copy of its ``vllm``
package and puts the fork on the installed one; the shipped pair ``models/pair`` travels with the tree)::

    python3 benchmarks/quantized.py --upstream-site $KIMI_UPSTREAM_SITE --fork-site $KIMI_SITE --out $OUT

The pair (``--pair``, default the shipped one) is first widened to 128-multiple widths (``kimi models widen``, into
``--scratch``; the same function: block-FP8 kernels take 128 x 128 blocks, the shipped pair's widths 16 x 16 at most);
its target is rewritten as block-FP8 and as INT4 routed experts (``kimi models quantize``, into ``--scratch``), and
served with the widened pair's drafter (trained on the bf16 target) at k = 3 with vLLM's defaults
(torch.compile, CUDA graphs for the measured batch sizes), prefix caching off. The variants
(``kimi_lab.bench.quantized.VARIANTS``): the three weight layouts with ``nospec``, ``fork_k3`` and ``upstream_k3``;
an FP8 KV cache on the bf16 target (all three engines) and on the FP8 target (``nospec`` and ``fork_k3``); the FP8
target with an FP8 KV cache and the drafter's own bf16 KV cache on Triton attention (``speculative_config``
``kv_cache_dtype`` / ``attention_backend``; ``fork_k3`` against the previous variant's ``nospec``); and controls:
the bf16 target with each KV cache dtype and the block-FP8 target without speculation, every request alone
(``max_num_seqs`` 1), to tell what batching alone flips from what speculation flips. All engines start at once and are
measured one at a time in ``--rounds`` interleaved rounds (``kimi_lab.bench.perf.orchestrate.run_parallel``; ``--pin``,
``--turns`` and ``--rewarm-tokens`` as in ``perf_vs_upstream.py``), every concurrency: c requests at once, greedy,
``--tokens`` output tokens, EOS ignored.

Writes ``quantized.json`` and ``quantized.md`` under ``--out`` (rewritten after every engine): per variant and c,
identical / total greedy sequences against the same target without speculation, τ (and τ over the bf16 target's),
tok/s of fork, upstream and no speculation, fork/upstream per round; the engines that failed, with their error.
``--cpu-smoke`` runs the bf16 variant on CPU (float32, eager; the fork's vLLM for both sides): vLLM's CPU backend
runs neither quantized layout.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))  # kimi_lab alone: docs/benchmarks.md

from kimi.e2e.presets import PERF_CPU_SMOKE, PERF_GPU, PERF_PAIR_KV_BYTES, PERF_SIDE_BY_SIDE
from kimi_lab.bench.hardware import describe
from kimi_lab.bench.perf import measure
from kimi_lab.bench.perf.analysis import versions_of
from kimi_lab.bench.perf.orchestrate import run_parallel
from kimi_lab.bench.perf.plan import add_side_by_side_options, add_turn_options, turn_errors
from kimi_lab.bench.quantized import (
    RUNS_FILE,
    controls,
    earlier_call,
    failures,
    jobs_of,
    markdown,
    merged,
    pick,
    quantization_of,
    rows,
    totals,
    variant_settings,
)
from kimi_lab.bench.results import stamp, write_json, write_lines
from kimi_lab.bench.workers import serve_jobs, site_errors

ROOT = Path(__file__).resolve().parents[1]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_side_by_side_options(p, ROOT / "benchmarks" / "results", "the reference pair (default: models/pair)")
    p.add_argument("--variants", nargs="+", metavar="NAME", help="run only these (kimi_lab.bench.quantized.VARIANTS)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    p.add_argument("--tokens", type=int, default=128, help="output tokens per request")
    p.add_argument("--reps", type=int, default=1, help="timed batches per concurrency and round (the best counts)")
    p.add_argument("--rounds", type=int, default=3)
    add_turn_options(p, "rounds of the engines started at once")
    p.add_argument("--budget-s", type=float, default=float(os.environ.get("KIMI_BUDGET_S", 540)))
    p.add_argument("--job-timeout-s", type=float, default=400, help="for an engine's start, and for each round")
    p.add_argument("--scratch", type=Path, default=Path("/tmp/quantized"))
    p.add_argument("--merge", action="store_true",
                   help=f"add to what an earlier call on this machine left in --scratch ({RUNS_FILE}): the report "
                        "shows both calls' variants (run the variants over several device calls)")
    p.add_argument("--cpu-smoke", action="store_true")
    p.add_argument("--worker", nargs=2, type=Path, help=argparse.SUPPRESS)
    return p


def engine_settings(args: argparse.Namespace) -> dict:
    """The ``LLM(...)`` settings every engine shares: a fixed 2 GiB KV cache; on a GPU a low memory share (engines
    side by side) and CUDA graphs for exactly the batch sizes measured (c and c (k + 1))."""
    if args.cpu_smoke:
        return {**PERF_CPU_SMOKE, "kv_cache_memory_bytes": PERF_PAIR_KV_BYTES}
    sizes = sorted({c * m for c in args.concurrency for m in (1, 4)})
    return {**PERF_GPU, **PERF_SIDE_BY_SIDE, "max_num_seqs": max(args.concurrency),
            "kv_cache_memory_bytes": PERF_PAIR_KV_BYTES, "compilation_config": {"cudagraph_capture_sizes": sizes}}


def make_targets(args: argparse.Namespace, schemes: set[str | None]) -> dict[str | None, str]:
    """``{scheme: target folder}`` for ``schemes``: the widened pair's bf16 target (``args.wide``) for None, each
    quantized one written into the scratch."""
    from kimi.models.quantize import quantize_target

    source = args.wide / "target"
    targets: dict[str | None, str] = {None: str(source)} if None in schemes else {}
    for scheme in sorted(s for s in schemes if s):
        out = args.scratch / "targets" / scheme
        quantize_target(source, out, scheme, force=True)
        targets[scheme] = str(out)
    return targets


def main(argv: list[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    if args.worker:
        return serve_jobs(*args.worker, run_job=measure.run)
    started = time.monotonic()
    made = stamp("benchmarks/quantized.py", argv if argv is not None else sys.argv[1:])
    if args.cpu_smoke:
        args.upstream_site = args.upstream_site or args.fork_site
    bad = site_errors(upstream_site=args.upstream_site, fork_site=args.fork_site)
    if bad:
        cli.error("; ".join(bad) + " (the same folder for both with --cpu-smoke is allowed)")
    bad = turn_errors(args, parallel=True)
    if bad:
        cli.error("; ".join(bad))
    try:
        variants = pick(args.variants, args.cpu_smoke)
    except ValueError as exc:
        cli.error(str(exc))
    runs_file = args.scratch / RUNS_FILE
    measured = {"concurrency": args.concurrency, "tokens": args.tokens, "reps": args.reps, "rounds": args.rounds,
                "pin": args.pin, "turns": args.turns, "rewarm_tokens": args.rewarm_tokens,
                "cpu_smoke": args.cpu_smoke, "pair": str(args.pair)}
    try:
        earlier = earlier_call(runs_file, measured) if args.merge else None
    except ValueError as exc:
        cli.error(f"--merge: {exc}")
    args.out.mkdir(parents=True, exist_ok=True)
    args.scratch.mkdir(parents=True, exist_ok=True)
    args.fork_greedy = "auto"  # kimi_lab.bench.perf.plan.variant_env: the fork as it runs by default
    from kimi.models.prompts import code_prompt_ids
    from kimi.models.widen import widen_pair

    args.wide = args.scratch / "pair-wide"
    widen_pair(args.pair, args.wide, force=True)
    targets = make_targets(args, {v.scheme for v in variants})
    prompts = code_prompt_ids(args.pair / "target" / "tokenizer.json", min(max(args.concurrency), 48), 256)
    common = {"concurrency": args.concurrency, "tokens": args.tokens, "reps": args.reps, "prompts": prompts,
              "rewarm_tokens": args.rewarm_tokens, "engine": engine_settings(args)}
    jobs = jobs_of(variants, targets, str(args.wide / "drafter"), common)
    runs: dict[str, dict] = {}
    paths = {**(earlier or {}).get("targets", {}), **{scheme or "bf16": path for scheme, path in targets.items()}}
    info = {scheme: f"{path} ({quantization_of(Path(path))})" for scheme, path in paths.items()}
    commands = [*(earlier or {}).get("commands", []), made["command"]]
    shown = merged(earlier, variants, {})[0]  # both calls' variants: the engines of the report
    shown_jobs = jobs_of(shown, {None if s == "bf16" else s: p for s, p in paths.items()}, str(args.wide / "drafter"),
                         common)

    def report(job: dict | None = None) -> None:
        engines = merged(earlier, variants, runs)[1]
        done = [r for r in engines.values() if r.get("status") == "done"]
        table = rows(shown, engines)
        result = {"device": describe(done[0]["device"], versions=True) if done else None, **made,
                  "commands": commands, "versions": versions_of(engines, shown_jobs), "targets": info,
                  "settings": {"concurrency": args.concurrency, "tokens": args.tokens, "reps": args.reps,
                               "rounds": args.rounds, "pinned": args.pin, "turns": args.turns,
                               "rewarm_tokens": args.rewarm_tokens, "k": 3, "engine": common["engine"],
                               "variants": {v.name: variant_settings(v) for v in shown}},
                  "rows": table, "controls": controls(shown, engines), "totals": totals(table),
                  "failures": failures(shown_jobs, engines),
                  "engines": {j["name"]: {k: v for k, v in engines.get(j["name"], {"status": "not run"}).items()
                                          if k not in ("by_concurrency",)} for j in shown_jobs},
                  "seconds": round(time.monotonic() - started, 1)}
        write_json(runs_file, {"variants": [v.name for v in shown], "runs": engines, "targets": paths,
                               "commands": commands, "measured": measured})
        write_json(args.out / "quantized.json", result)
        write_lines(args.out / "quantized.md", markdown(result))
        if job is not None:
            run = runs[job["name"]]
            print(f"quantized: {job['name']}: " + (f"done (start {run.get('start_s')} s)" if run.get("status") == "done"
                                                   else failures([job], runs)[job["name"]]), flush=True)

    print(f"quantized: {len(jobs)} engines, budget {args.budget_s:.0f} s: {', '.join(j['name'] for j in jobs)}",
          flush=True)
    run_parallel(args, jobs, started + args.budget_s, runs, report)
    report()
    return 0 if not failures(jobs, runs) else 1


if __name__ == "__main__":
    sys.exit(main())
