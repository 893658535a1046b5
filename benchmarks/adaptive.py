"""Adaptive verification against fixed EAGLE-3 and no speculation, on the mainline's torch-only CPU platform.

    .venv/bin/python benchmarks/adaptive.py [--python .venv/bin/python] [--models models/pair] \\
        [--prompts 4] [--tokens 32] [--k 3] [--rounds 2]

Settings (``kimi_lab.bench.adaptive.SETTINGS``): no speculation, EAGLE-3 with the pair's drafter at ``--k``, the same
with ``enable_adaptive_verification``. Each round runs every setting once, in turns, each a fresh child process
of ``--python`` (one engine, ``--prompts`` requests in one batch, ``max_num_seqs`` = ``--prompts``) that
measures off-domain prompts (random token ids) and then in-domain ones (held-out code). Writes ``adaptive.json``
and ``adaptive.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))  # kimi_lab alone: docs/benchmarks.md

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", type=Path, default=ROOT / ".venv/bin/python",
                        help="the mainline's interpreter (python3 -m kimi setup)")
    parser.add_argument("--models", type=Path, default=ROOT / "models/pair")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per child")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:  # a child: the mainline's install
        from kimi_lab.bench.adaptive import measure

        print(json.dumps(measure(**json.loads(args.measure))))
        return 0
    if not args.python.is_file():
        parser.error(f"--python: no interpreter at {args.python}; run python3 -m kimi setup")
    sys.path.insert(0, str(ROOT))
    from kimi.e2e.engine import tokenize
    from kimi.models.prompts import code_prompts
    from kimi_lab.bench.adaptive import SETTINGS, random_prompts, summarize
    from kimi_lab.bench.cpu_paths import run_child
    from kimi_lab.bench.hardware import cpu_name
    from kimi_lab.bench.results import header, stamp, write_json, write_lines

    target, drafter = str(args.models.resolve() / "target"), str(args.models.resolve() / "drafter")
    vocab_size = json.loads((Path(target) / "config.json").read_text())["vocab_size"]
    code = tokenize(target, code_prompts(args.prompts))
    prompts = {"off": random_prompts(vocab_size, args.prompts, len(code[0])), "in": code}
    # the child imports the mainline's vllm and this checkout's kimi
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "VLLM_CACHE_ROOT": tempfile.mkdtemp(prefix="adaptive-cache-")}
    runs: dict[str, list[dict]] = {}
    for number in range(args.rounds):
        for setting in SETTINGS:
            job = {"target": target, "drafter": drafter, "setting": setting, "k": args.k, "prompts": prompts,
                   "tokens": args.tokens, "max_num_seqs": args.prompts}
            began = time.monotonic()
            result = run_child(str(args.python.absolute()), str(Path(__file__).resolve()), job, env, args.timeout)
            runs.setdefault(setting, []).append(result)
            print(f"round {number + 1}: {setting}: off {result['off']['tok_s']} tok/s (tau {result['off']['tau']}),"
                  f" in {result['in']['tok_s']} tok/s (tau {result['in']['tau']}), start {result['start_s']} s"
                  f" ({time.monotonic() - began:.0f} s)", flush=True)
    rows = summarize(runs)
    out = {**stamp("benchmarks/adaptive.py", sys.argv[1:], python=".venv/bin/python"), "cpu": cpu_name(),
           "cores": os.cpu_count(), "python": platform.python_version(), "vllm": runs["nospec"][0]["vllm"],
           "prompts": args.prompts, "tokens": args.tokens, "k": args.k, "rounds": args.rounds,
           "start_s": {s: [r["start_s"] for r in rs] for s, rs in runs.items()}, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "adaptive.json", out)
    lines = header("Adaptive verification (EAGLE-3) against fixed k and no speculation, CPU", out["command"],
                   out["date"])
    lines += [(f"- machine: {out['cpu']} ({out['cores']} CPUs, shared); vLLM {out['vllm']} (torch-only "
               f"CPU platform, float32, eager); the pair `{args.models.name}`; {args.prompts} requests x "
               f"{args.tokens} tokens in one batch, greedy; k = {args.k}; {args.rounds} rounds, settings in turns "
               "(median tok/s)"), "",
              ("| prompts | none tok/s | EAGLE-3 tok/s | adaptive tok/s | EAGLE-3 / none | adaptive / none "
               "(rounds) | adaptive / EAGLE-3 (rounds) | tau EAGLE-3 | tau adaptive | drafts verified EAGLE-3 / "
               "adaptive | lossless |"),
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        t = row["tok_s"]
        lines.append(
            f"| {row['domain']}-domain | {t['nospec']:.1f} | {t['eagle3']:.1f} | {t['adaptive']:.1f} | "
            f"{row['eagle3_vs_nospec']:.2f} | {row['adaptive_vs_nospec']:.2f} ({row['adaptive_vs_nospec_rounds']}) | "
            f"{row['adaptive_vs_eagle3']:.2f} ({row['adaptive_vs_eagle3_rounds']}) | {row['tau']['eagle3']} | "
            f"{row['tau']['adaptive']} | {row['draft_tokens']['eagle3']:.0f} / {row['draft_tokens']['adaptive']:.0f}"
            f" | {row['lossless']} |")
    lines += ["", ("Not shown: concurrency above one batch of the requests given, serving overheads, start-up "
                   "(the adaptive engine also profiles its cost curves: `start_s` in the JSON); each engine "
                   "measures off-domain first, then in-domain, so the in-domain rows of the adaptive engine start "
                   "from an estimator calibrated off-domain; a shared 2-core machine (other jobs' load varies "
                   "between settings even in turns).")]
    write_lines(args.out / "adaptive.md", lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
