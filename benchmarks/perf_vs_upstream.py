"""Fork versus upstream vLLM side by side on one GPU, with EAGLE-3 and without speculation (issue G).

One GPU call (``benchmarks/gpu_call.sh`` installs the pinned upstream release, keeps a pristine copy of its
``vllm`` package and puts the fork on the installed one; the shipped pair ``models/pair`` travels with the tree)::

    python3 benchmarks/perf_vs_upstream.py --upstream-site /tmp/upstream --fork-site /tmp/site --out $OUT

For each model, engines run one at a time, each in its own process with its own ``PYTHONPATH``:

* ``nospec``: the target alone (the fork's vLLM; no patch changes the target's GPU path without a drafter);
* ``upstream_k{k}``: the pinned upstream release with the EAGLE-3 drafter, k draft tokens, as it runs by default
  (0.32.0: the V2 model runner for every model, its drafting loop captured in FULL CUDA graphs; 0.26.0, the
  v0.26 line's pin: V1 for ``DeepseekV3ForCausalLM``, whose drafter steps are PIECEWISE CUDA graphs, vLLM RFC
  45258);
* ``fork_k{k}``: the fork with the same drafter and k, as it runs by default: greedy drafts from the draft
  vocabulary (patch 0009, ``KIMI_DRAFT_GREEDY=auto``, with the fork's draft-head kernel where
  ``KIMI_DRAFT_HEAD_LIB`` is set), on the V2 model runner (upstream's default on 0.32.0; on the v0.26 line the
  fork's patch 0013, for drafters whose attention is not MLA). No step times there (the loop is one graph);
* ``fork_v1_k{k}`` (k in ``--v1-ks``): the fork held on the V1 runner (``VLLM_USE_V2_MODEL_RUNNER=0``; on the
  v0.26 line the fork before patch 0013); ``fork_v2_k{k}`` (k in ``--v2-ks``): the fork with
  ``VLLM_USE_V2_MODEL_RUNNER=1`` (results from before patch 0013, when the fork's default was V1);
* ``hookoff_k3`` (``--hook-off``): the fork with ``KIMI_DRAFT_GREEDY=upstream`` on its default runner: patch
  0009's hook off, the rest of the fork on (the rows' ``fork_vs_hookoff`` is the hook's share);
* ``check_k3``: the fork on V1 with ``KIMI_DRAFT_GREEDY=check`` at the largest concurrency (draft ids of
  patch 0009 against upstream's, counted on the device; the count needs V1, see
  ``kimi/spec/draft_greedy.py``).

Models: ``pair``, the shipped reference pair (``models/pair``; k = 1, 2, 3, 5), and ``kimi_slice``,
a Kimi-K2-dimension slice with random weights (``kimi.models.kimi_slice``; k = 3) plus a shallower slice
without speculation, for the per-layer projection below.

Each engine keeps vLLM's defaults (torch.compile, CUDA graphs, async scheduling), prefix caching off, and
serves every concurrency ``c`` in 1, 4, 16, 64: ``c`` requests submitted at once (greedy, ``--tokens``
output tokens each, EOS ignored), so the batch holds ``c`` sequences from start to end. Per ``c``:

* ``tok_s``: output tokens / wall time of the batch (best of ``--reps``), ``tpot_ms``: wall time per output
  token of a request (the batch's wall time / ``--tokens``, prefill included);
* ``tau``: mean acceptance length, 1 + accepted / drafts, from vLLM's spec-decode counters;
* step times from a separate timed pass (each call below between two device synchronizations, so they hold
  the GPU time plus launch overhead and exclude the scheduler): ``t_target_ms`` the target's forward + logits
  on the decode batch of the ``nospec`` engine; ``t_verify_ms`` the same on the verification batch
  (``c (k + 1)`` tokens) of the fork's engine (else ``fork_v1_k{k}``, else ``upstream_k{k}``); ``t_draft_ms``
  the drafter's forward passes plus its draft heads per draft token, same engine. ``ideal_speedup = tau *
  t_target / (t_verify + k * t_draft)`` with the fork's tau (EAGLE-3's bound with no overhead outside the
  forward passes).

Engine starts (torch.compile and CUDA-graph capture, a minute or more each, mostly CPU) can overlap:
``--parallel-start`` starts all of the pair's engines at once (each with a fixed 2 GiB KV cache and
``gpu_memory_utilization`` 0.05, so they fit side by side), waits until all are ready, then lets them measure
one at a time while the others wait idle, in ``--rounds`` interleaved rounds (each concurrency keeps its fastest
round and lists every round's rate in ``tok_s_rounds``). With ``--turns concurrency`` the engines take turns at
each concurrency (fork, upstream and baseline rates at one c seconds apart, not a whole engine's turn apart);
``--rewarm-tokens N`` shortens the warm-up batch of every measurement after a concurrency's first. ``--pin``
holds each engine to its own whole physical cores (``--pin cores``: every engine to one thread of each core; see
``kimi_lab.bench.hardware.cpu_groups``); ``--gpu-clocks`` samples the GPU's clocks meanwhile
(``kimi_lab.bench.hardware.gpu_clocks``). The Kimi
slice's engines (about 107 GB each) always start one at a time. On a host with two GPUs, run one model per GPU
(``CUDA_VISIBLE_DEVICES``) in two processes and join the results with ``--combine``.

Kimi slice projection to the 61-layer model at TP 8: the per-MoE-layer time ``t_moe`` is the difference of the
decode step times of the 4- and 3-layer slices (1 dense + 3 or 2 MoE layers); the 61-layer step is
``t(L4) + 57 t_moe`` on one GPU and ``t(L4) - 3 t_moe + 60 t_moe / 8`` at TP 8 (MoE layer work split 8 ways;
embedding, head and the dense layer unsplit; no all-reduce cost). Verification scales by the slice's measured
``t_verify / t_target``; the drafter is not split. ``break_even_tau`` is the acceptance length at which the
ideal speed-up is 1.

Writes ``perf_vs_upstream.json``, ``perf_vs_upstream.md`` and ``perf_vs_upstream.png`` (with matplotlib) under
``--out``; the JSON is rewritten after every engine, so a call stopped by its time limit keeps what finished.
``--pool A.json B.json ...`` joins calls of the same plan (the same engines measured again): each row's per-round
ratios become every call's rounds. ``--noise A.json B.json ...`` writes how noisy each call's rounds are
(``kimi_lab.bench.perf.noise``). ``--chart-only FILE`` redraws the PNG and markdown from a JSON.
``--cpu-smoke`` runs the same logic on CPU (tiny slice, float32, eager, both variants on the fork) and writes
under ``--out`` only; ``--no-chart`` leaves out the PNG (a device call returns few files: draw it from the
combined JSON).
Needs ``kimi`` importable (a site made by ``kimi install-into`` on ``PYTHONPATH``, the fork's venv, or
``PYTHONPATH=.``); the logic is ``kimi_lab.bench.perf``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))  # kimi_lab alone: docs/benchmarks.md

from kimi.errors import KimiError
from kimi_lab.bench.hardware import gpu_clocks
from kimi_lab.bench.perf import log, measure
from kimi_lab.bench.perf.analysis import combine, pool, summarize
from kimi_lab.bench.perf.noise import markdown, noise
from kimi_lab.bench.perf.orchestrate import run_all
from kimi_lab.bench.perf.plan import (
    CONCURRENCY,
    PAIR_KS,
    SLICE_KS,
    add_side_by_side_options,
    add_turn_options,
    engine_settings,
    inputs,
    plan,
    turn_errors,
    v1_runner_removed,
)
from kimi_lab.bench.perf.render import write_outputs
from kimi_lab.bench.results import stamp, write_json, write_lines
from kimi_lab.bench.workers import serve_jobs, site_errors

ROOT = Path(__file__).resolve().parents[1]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_side_by_side_options(p, ROOT / "benchmarks" / "results",
                             "the trained reference pair (target/, drafter/; default: the shipped models/pair)")
    p.add_argument("--models", nargs="+", default=["pair", "kimi_slice"], choices=["pair", "kimi_slice"])
    p.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    p.add_argument("--ks", type=int, nargs="+", default=list(PAIR_KS))
    p.add_argument("--slice-ks", type=int, nargs="+", default=list(SLICE_KS))
    p.add_argument("--v1-ks", type=int, nargs="*", default=[3],
                   help="k values where the fork also runs held on vLLM's V1 runner (VLLM_USE_V2_MODEL_RUNNER=0)")
    p.add_argument("--v2-ks", type=int, nargs="*", default=[],
                   help="k values where the fork also runs held on vLLM's V2 runner (VLLM_USE_V2_MODEL_RUNNER=1)")
    p.add_argument("--engines", nargs="+", metavar="NAME",
                   help="run only these engines of the plan (e.g. kimi_slice/nospec_shallow)")
    p.add_argument("--parallel-start", action="store_true",
                   help="start the pair's engines at once, then measure them one at a time")
    p.add_argument("--rounds", type=int, default=2,
                   help="with --parallel-start: measure every engine this many times, interleaved")
    add_turn_options(p, "with --parallel-start")
    p.add_argument("--gpu-clocks", action="store_true",
                   help="sample each GPU's SM and memory clocks, power, temperature and utilization every second "
                        "while the engines run, into gpu-clocks.csv under --out (nvidia-smi, stopped at the end)")
    p.add_argument("--no-chart", dest="chart", action="store_false", help="no PNG (draw it after --combine)")
    p.add_argument("--tokens", type=int, default=128, help="output tokens per request")
    p.add_argument("--slice-tokens", type=int, default=64, help="output tokens per request on the Kimi slice")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--slice-kv-gib", type=int, default=8)
    p.add_argument("--fork-greedy", default="auto", help="KIMI_DRAFT_GREEDY for the fork's engines")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="leave out the KIMI_DRAFT_GREEDY=check engine of each model")
    p.add_argument("--hook-off", action="store_true",
                   help="add hookoff_k3: the fork with KIMI_DRAFT_GREEDY=upstream (patch 0009's hook off)")
    p.add_argument("--profile", action="store_true",
                   help="after its rounds, each engine runs one batch at the largest concurrency under cProfile "
                        "(Python time per function) and writes <engine>.cprofile.txt under --out/profiles")
    p.add_argument("--budget-s", type=float, default=float(os.environ.get("KIMI_BUDGET_S", 540)))
    p.add_argument("--job-timeout-s", type=float, default=240)
    p.add_argument("--scratch", type=Path, default=Path("/tmp/perf_vs_upstream"))
    p.add_argument("--cpu-smoke", action="store_true")
    files = p.add_mutually_exclusive_group()  # what to do with earlier results instead of measuring: one of these
    files.add_argument("--chart-only", type=Path, metavar="JSON", help="redraw PNG and markdown from a result JSON")
    files.add_argument("--combine", type=Path, nargs="+", metavar="JSON",
                   help="merge the results of several calls (e.g. one per model) into --out")
    files.add_argument("--pool", type=Path, nargs="+", metavar="JSON",
                   help="join calls of the same plan into --out: every call's per-round ratios pooled per row")
    files.add_argument("--noise", type=Path, nargs="+", metavar="JSON",
                   help="how noisy the rounds of these calls are (their own perf_vs_upstream.json files; "
                        "kimi_lab.bench.perf.noise): perf_noise.md and .json under --out, a line per call and "
                        "concurrency")
    p.add_argument("--invalid", nargs="+", default=[], metavar="ENGINE=REASON",
                   help="with --combine: a fork engine whose rows do not count, and why")
    p.add_argument("--note", action="append", default=[],
                   help="with --combine or --pool: a note printed under the table")
    p.add_argument("--worker", nargs=2, type=Path, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    if args.worker:
        return serve_jobs(*args.worker, run_job=measure.run)
    if args.chart_only:
        summary = json.loads(args.chart_only.read_text())
        write_outputs(args.chart_only.parent, summary)
        return 0
    if args.noise:
        labels = [f"{path.resolve().parent.name}/{path.stem}" for path in args.noise]
        if len(set(labels)) < len(labels):
            cli.error(f"--noise: two files would share a label (folder/name): {labels}; copy or rename one")
        calls = []
        for label, path in zip(labels, args.noise, strict=True):
            try:
                calls.append((label, noise(json.loads(path.read_text()))))
            except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
                cli.error(f"--noise {path}: {exc}")
        args.out.mkdir(parents=True, exist_ok=True)
        write_json(args.out / "perf_noise.json", dict(calls))
        write_lines(args.out / "perf_noise.md", markdown(calls))
        print(f"perf: wrote {args.out / 'perf_noise.md'}")
        return 0
    if args.pool:
        try:
            summary = pool([json.loads(path.read_text()) for path in args.pool], args.note)
        except ValueError as exc:
            cli.error(str(exc))
        write_outputs(args.out, summary, chart=args.chart)
        return 0
    if args.combine:
        bad = [item for item in args.invalid if "=" not in item]
        if bad:
            cli.error(f"--invalid takes ENGINE=REASON (e.g. kimi_slice/fork_k3=why), got {bad}")
        invalid = dict(item.split("=", 1) for item in args.invalid)
        try:
            summary = combine([json.loads(path.read_text()) for path in args.combine], invalid, args.note)
        except ValueError as exc:
            cli.error(str(exc))
        write_outputs(args.out, summary)
        return 0
    started = time.monotonic()
    made = stamp("benchmarks/perf_vs_upstream.py", argv if argv is not None else sys.argv[1:])
    args.command, args.date = made["command"], made["date"]
    args.engine = engine_settings(args.cpu_smoke, args.concurrency)
    if args.rounds < 1:
        cli.error(f"--rounds must be at least 1, got {args.rounds}")
    bad = turn_errors(args, args.parallel_start)
    if bad:
        cli.error("; ".join(bad))
    if args.gpu_clocks and shutil.which("nvidia-smi") is None:
        cli.error("--gpu-clocks samples with nvidia-smi, which is not on PATH: leave --gpu-clocks out here")
    if args.cpu_smoke:
        args.upstream_site = args.upstream_site or args.fork_site
    bad = site_errors(upstream_site=args.upstream_site, fork_site=args.fork_site)
    if bad:
        cli.error("; ".join(bad) + " (the same folder for both with --cpu-smoke is allowed)")
    if v1_runner_removed(args.fork_site) and (args.v1_ks or args.check):
        log(f"the fork's vLLM in {args.fork_site} has no V1 runner (removed in vLLM 0.34.0): "
            "no fork_v1 or check engines")
        args.v1_ks, args.check = [], False
    args.out.mkdir(parents=True, exist_ok=True)
    args.scratch.mkdir(parents=True, exist_ok=True)
    try:
        pair_prompts, slice_dirs = inputs(args)
    except KimiError as exc:
        raise SystemExit(f"perf: {exc}") from None
    jobs = plan(args, pair_prompts, slice_dirs)
    if args.profile:
        jobs = [{**job, "profile_dir": str(args.out / "profiles")} for job in jobs]
    log(f"{len(jobs)} engines, budget {args.budget_s:.0f} s: {', '.join(j['name'] for j in jobs)}")
    with gpu_clocks(args.out / "gpu-clocks.csv" if args.gpu_clocks else None):
        runs = run_all(args, jobs, started)
    summary = summarize(args, jobs, runs, started)
    write_outputs(args.out, summary, chart=args.chart)
    mismatch = [v for n, v in summary["versions"].items() if ("+kimi." in (v or "")) != (n == "fork")]
    if mismatch and not args.cpu_smoke:
        log(f"version mix-up: {summary['versions']} (upstream must be plain 0.26.0, the fork +kimi)")
        return 1
    log(f"rows: {len(summary['rows'])}, goal {summary['goal']}")
    return 0 if all(r.get("status") == "done" for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
