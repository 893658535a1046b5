"""Adaptive verification for EAGLE-3 against fixed k, upstream's batch-size table and no speculation (issue 45).

    .venv/bin/python benchmarks/adaptive.py [--concurrency 1 8 32 64] [--rounds 3] [--tokens 128] [--out DIR]

Five engines per model (``kimi_lab.bench.adaptive.plan.ENGINES``), each in its own worker process, all started at
once and then measured one at a time in ``--rounds`` interleaved rounds (``kimi_lab.bench.perf``: the order reversed
every other turn and round; ``--turns concurrency`` makes a turn one point, so the rates compared are seconds
apart):

* ``adaptive``: the fork, EAGLE-3 k = 3 (``--adaptive-k``: the most drafts per request and step it chooses from)
  with ``"enable_adaptive_verification": true`` (its draft back-off on, as by default);
* ``fork_k3``: the fork, EAGLE-3 k = 3;
* ``upstream_k3``: upstream, EAGLE-3 k = 3;
* ``upstream_table``: upstream with its batch-size table as its docs suggest (``num_speculative_tokens`` 5,
  ``num_speculative_tokens_per_batch_size`` ``[[1,16,5],[17,32,4],[33,64,3],[65,128,1],[129,512,0]]``);
* ``nospec``: the target alone (the fork's vLLM).

On CPU (``--device cpu``, the default; the mainline's torch-only CPU platform, float32, eager) "upstream" is the
laid ``vllm/`` with every ``vllm/`` change of the series taken out but what the platform needs to start (laid
under ``--scratch``; which patches it keeps is written into the results). On a GPU (``--device gpu``, through
``benchmarks/gpu_call.sh``) the sites are the GPU kit's: ``--fork-site $KIMI_SITE --upstream-site
$KIMI_UPSTREAM_SITE``.

Points (``--sets``, ``--concurrency``): every prompt set at every c, c requests at once, ``--tokens`` output tokens
each, EOS ignored, greedy (``--temperature``: sampled, request i seeded with i): ``in``, held-out code
(``kimi.models.prompts``); ``off``, off-domain prompts of ``--off-kind`` (``kimi.models.offdomain``; ``lowest``,
the default: the candidate of the lowest τ in this call); ``mixed``, the two interleaved in one batch (from c = 2).
Before the engines, one fork engine measures τ at k = 3 on every off-domain candidate (``--no-candidates`` skips
it unless ``--off-kind lowest``; ``--candidates-only`` writes ``adaptive-candidates.json``/``.md`` and stops).
``--models pair wide`` adds the pair widened (``kimi models widen``: the same function, wider matrices) as a
second group of five engines.

Writes ``adaptive.json`` and ``adaptive.md`` under ``--out`` (rewritten after every engine): per model, set and c
each engine's median tok/s, adaptive's ratios to the other four per round (median, interval, spread), upstream
k = 3 over none, τ and drafts verified per engine, greedy sequences identical to none, and the goal
(``kimi_lab.bench.adaptive.analysis``). Run it with the mainline's interpreter (``python3 -m kimi setup``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))  # kimi_lab alone: docs/benchmarks.md

from kimi.errors import KimiError
from kimi.models.offdomain import KINDS
from kimi_lab.bench.adaptive.call import run_call
from kimi_lab.bench.adaptive.plan import CONCURRENCY, ENGINES, SETS, K, engine_settings
from kimi_lab.bench.perf import measure
from kimi_lab.bench.perf.plan import add_side_by_side_options, add_turn_options, turn_errors
from kimi_lab.bench.results import stamp
from kimi_lab.bench.workers import serve_jobs, site_errors

ROOT = Path(__file__).resolve().parents[1]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_side_by_side_options(p, ROOT / "benchmarks" / "results", "the reference pair (default: models/pair)")
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--models", nargs="+", choices=["pair", "wide"], default=["pair"])
    p.add_argument("--sets", nargs="+", choices=SETS, default=list(SETS))
    p.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    p.add_argument("--engines", nargs="+", choices=list(ENGINES), help="run only these engines")
    p.add_argument("--adaptive-k", type=int, default=K,
                   help="the adaptive engine's num_speculative_tokens: the most drafts per request and step it chooses "
                        "from (default %(default)s, the fixed-k engines' k; upstream's table drafts up to 5)")
    p.add_argument("--tokens", type=int, default=128, help="output tokens per request")
    p.add_argument("--reps", type=int, default=1, help="timed batches per point and round (the best counts)")
    p.add_argument("--rounds", type=int, default=3)
    add_turn_options(p, "rounds of the engines started at once")
    p.add_argument("--off-kind", choices=["lowest", *KINDS], default="lowest",
                   help="the off-domain prompts (kimi.models.offdomain); lowest: the candidate of the lowest tau here")
    p.add_argument("--off-lengths", type=int, nargs=2, default=[448, 768], metavar=("MIN", "MAX"),
                   help="tokens per off-domain prompt (longer random prompts keep the target off its domain longer)")
    p.add_argument("--no-candidates", dest="candidates", action="store_false",
                   help="skip measuring the off-domain candidates (only with a named --off-kind)")
    p.add_argument("--candidates-only", action="store_true", help="measure the candidates only")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; else sampled, request i seeded with i")
    p.add_argument("--step-times", action="store_true", help="time target, verification and drafter steps per point")
    p.add_argument("--kv-mib", type=int, default=512, help="KV cache per engine")
    p.add_argument("--fork-greedy", default="auto", help="KIMI_DRAFT_GREEDY for the fork's engines")
    p.add_argument("--budget-s", type=float, default=float(os.environ.get("KIMI_BUDGET_S", 8 * 3600)))
    p.add_argument("--job-timeout-s", type=float, default=1800, help="for an engine's start, and for each turn")
    p.add_argument("--scratch", type=Path, default=Path("/tmp/adaptive"))
    p.add_argument("--worker", nargs=2, type=Path, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    if args.worker:
        return serve_jobs(*args.worker, run_job=measure.run)
    made = stamp("benchmarks/adaptive.py", argv if argv is not None else sys.argv[1:], python=".venv/bin/python")
    bad = turn_errors(args, parallel=True)
    if args.rounds < 1:
        bad.append(f"--rounds must be at least 1, got {args.rounds}")
    if args.adaptive_k < 1:
        bad.append(f"--adaptive-k must be at least 1, got {args.adaptive_k}")
    if args.device == "gpu":
        bad += site_errors(upstream_site=args.upstream_site, fork_site=args.fork_site)
    elif args.upstream_site:
        bad.append("--upstream-site is laid by the script on CPU; leave it out (or use --device gpu)")
    if bad:
        cli.error("; ".join(bad))
    args.engine = engine_settings(args.device, args.concurrency, args.kv_mib << 20)
    try:
        return run_call(args, ROOT, made)
    except KimiError as exc:
        raise SystemExit(f"adaptive: {exc}") from None


if __name__ == "__main__":
    sys.exit(main())
