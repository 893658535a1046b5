"""The fork end to end on a GPU (issue C): EAGLE-3 with CUDA graphs, lossless check, counters, `vllm serve`.

One call on the GPU host, after the kit and the fork are installed (``benchmarks/gpu_call.sh`` does both)::

    python3 benchmarks/gpu_e2e.py --out $OUT

1. Reference models: ``python -m kimi models make`` (target, drafter-llama, drafter-mla, and the Kimi-K2.5
   wrapper ``kimi-k25`` where this checkout's ``kimi models make`` writes it).
2. Greedy decoding of real code the models never saw (prompts cut from the held-out stdlib packages), with
   vLLM's defaults: torch.compile and CUDA graphs on (no ``enforce_eager``). One run of the target alone is
   the baseline; each EAGLE-3 drafter style (``llama``, ``mla``) runs at k = 1, 3, 5 and is compared with
   it token by token (lossless: identical sequences). Spec-decode counters come from ``LLM.get_metrics()``.
   The Kimi-K2.5 wrapper runs alone and with the Llama-style drafter (k = 3) when present. ``--pair`` adds the
   shipped trained pair (``models/pair``: DeepSeek-V3 target, Llama-style drafter) alone and at each k, with
   prompts cut by its own tokenizer (its drafter is trained, so its counters show real acceptance).
3. ``vllm serve`` of the target with the Llama-style drafter (k = 3): 8 concurrent OpenAI completion requests
   (standard library HTTP), answers checked against the offline baseline, counters read from ``/metrics``.

Engines run in worker processes ("lanes"; several at once on one GPU, each with a fixed KV cache and its own
compile cache: ``kimi_lab.bench.workers``), so a crash or a hang costs one run, not the call. After each run
``gpu_e2e.json`` is rewritten, so a call stopped by its time limit still returns what finished. Runs that
would not fit in ``--budget-s`` are skipped and listed. ``--cpu-smoke`` checks the same logic on a machine
without a GPU (eager, float32, tiny counts); ``--small`` is the short form the GPU tests run.

Writes ``gpu_e2e.json``, ``gpu_e2e.md`` and ``logs/`` under ``--out`` (default ``benchmarks/results``).
Exit status 0 when every check passed (lossless >= 90 % of sequences in every run, every sequence under
``VLLM_BATCH_INVARIANT=1``, where a divergence is a bug and not a bf16 near-tie; CUDA graphs on, the server
answered), 1 otherwise. Needs ``kimi`` importable (the fork's venv, or a site made by ``kimi install-into``
on ``PYTHONPATH``); the logic is ``kimi_lab.bench.gpu_e2e``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))  # kimi_lab alone: docs/benchmarks.md

from kimi.e2e.presets import GPU_E2E, GPU_E2E_CPU_SMOKE
from kimi.errors import KimiError
from kimi.models import SHIPPED_PAIR
from kimi.models.prompts import code_prompt_ids
from kimi_lab.bench.gpu_e2e import job, log
from kimi_lab.bench.gpu_e2e.lanes import Run
from kimi_lab.bench.gpu_e2e.phases import run_phases
from kimi_lab.bench.gpu_e2e.plan import apply_profiles, ensure_models, prompt_max_len
from kimi_lab.bench.results import stamp
from kimi_lab.bench.workers import serve_jobs

ROOT = Path(__file__).resolve().parents[1]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--models", type=Path, default=None,
                   help="reference models folder (default: SCRATCH/models, made with `kimi models make`)")
    p.add_argument("--make-models", action="store_true", help="make the models even if the folder has them")
    p.add_argument("--scratch", type=Path, default=None, help="work folder (default: a new temporary one)")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--ks", type=int, nargs="+", default=[1, 3, 5])
    p.add_argument("--styles", nargs="+", default=["llama", "mla"])
    p.add_argument("--k25-k", type=int, default=3)
    p.add_argument("--k25-styles", nargs="*", default=["llama"])
    p.add_argument("--k25-images", type=int, default=4, help="image requests in the Kimi-K2.5 runs (0: none)")
    p.add_argument("--no-k25", dest="k25", action="store_false", help="leave the Kimi-K2.5 wrapper out")
    p.add_argument("--pair", type=Path, nargs="?", const=SHIPPED_PAIR, default=None,
                   help="also run a trained pair (target/, drafter/; default the shipped models/pair) alone and "
                        "with its drafter at each k, compared with its own baseline (runs pair_base, pair_kK)")
    p.add_argument("--serve-k", type=int, default=3)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--no-serve", dest="serve", action="store_false")
    p.add_argument("--lanes", type=int, default=3, help="engines running at once (processes on one GPU)")
    p.add_argument("--budget-s", type=float, default=450, help="no run starts after this many seconds")
    p.add_argument("--job-timeout-s", type=float, default=240)
    p.add_argument("--min-job-s", type=float, default=45, help="a run starts only with this much budget left")
    p.add_argument("--grace-s", type=float, default=30, help="a running engine may overrun the budget by this")
    p.add_argument("--engines-per-process", dest="fresh_process", action="store_false",
                   help="run a lane's engines one after the other in one worker process (default: one process "
                        "per engine)")
    p.add_argument("--mla-backend", default=None, help="force the MLA attention backend (e.g. TRITON_MLA)")
    p.add_argument("--no-fallback", dest="fallback", action="store_false",
                   help="do not retry a failed baseline with the Triton MLA backend")
    p.add_argument("--small", action="store_true", help="short form: 8 prompts x 16 tokens, k = 3, 2 lanes")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="no GPU: eager float32 engines, 4 prompts x 8 tokens, k = 1, one lane")
    p.add_argument("--worker", nargs=2, type=Path, metavar=("JOBS", "EVENTS"), help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.worker:
        return serve_jobs(*args.worker, run_job=job.run)
    given = argv if argv is not None else sys.argv[1:]
    apply_profiles(args, given)
    made = stamp("benchmarks/gpu_e2e.py", given)
    args.command, args.date = made["command"], made["date"]
    args.scratch = (args.scratch or Path(tempfile.mkdtemp(prefix="gpu_e2e-"))).resolve()
    args.scratch.mkdir(parents=True, exist_ok=True)
    out = args.out.resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    models = (args.models or args.scratch / "models").resolve()

    engine = dict(GPU_E2E_CPU_SMOKE if args.cpu_smoke else GPU_E2E)
    run = Run(args, out, engine, [])
    log(f"out {out}, scratch {args.scratch}, budget {args.budget_s:.0f} s, {args.lanes} lanes")
    try:
        ensure_models(run, models, args.make_models)
        run.prompts = code_prompt_ids(models / "target" / "tokenizer.json", args.prompts,
                                      prompt_max_len(engine, args.tokens))
    except KimiError as exc:
        raise SystemExit(f"gpu_e2e: {exc}") from None
    summary = run_phases(run, models)
    log(f"done in {run.elapsed():.0f} s: passed={summary['passed']} {summary['checks']}")
    print((out / "gpu_e2e.md").read_text(), flush=True)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
