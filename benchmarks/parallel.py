"""EAGLE-3 on DeepSeek-V3 targets across tensor- and pipeline-parallel layouts on CPU (issue K).

Run in the fork's venv (``python3 -m kimi setup`` makes it; ``python3 -m kimi models make`` the reference models)::

    .venv/bin/python benchmarks/parallel.py [--prompts 8] [--tokens 48] [-k 3]

For the shipped trained pair (its Llama-style drafter) and the reference target with both drafter styles
(Llama-style and MLA-style, random weights), every layout of ``kimi.bench.parallel.LAYOUTS`` (TP 1, TP 2, PP 2,
TP 2 x PP 2; vLLM's multiprocessing executor, gloo between the CPU workers, one CPU per worker) serves the same
greedy prompts without speculation and with each drafter. Each run is compared with the target alone on one rank:
greedy output identical, τ from vLLM's counters, start-up seconds. Layouts that vLLM 0.32.0 cannot serve with
EAGLE-3 (pipeline parallelism on these targets) are refused by the fork before loading; the row keeps the message.

Writes ``parallel.json`` and ``parallel.md`` to ``--out`` (default ``benchmarks/results``), both rewritten after each
model; ``--render FILE`` rewrites them from a ``parallel.json``. The runs are ``kimi.bench.parallel``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from kimi.bench.hardware import cpu_name
from kimi.bench.parallel import executor, failure, model_rows, reference_drafters
from kimi.bench.results import header, stamp, write_json, write_lines
from kimi.e2e.engine import tokenize
from kimi.e2e.prompts import code_prompts
from kimi.models import SHIPPED_PAIR

ROOT = Path(__file__).resolve().parents[1]


def markdown(result: dict) -> list[str]:
    """The result as a markdown table under the command, date, CPU and versions."""
    v = result["versions"]
    lines = [*header("EAGLE-3 across parallel layouts on CPU (issue K)", result["command"], result["date"]),
             f"- CPU: {result['cpu']} ({result['cpus']} CPUs for this process)",
             f"- versions: vLLM {v['vllm']}, torch {v['torch']}, Python {v['python']}",
             (f"- {result['prompts']} held-out prompts x {result['tokens']} greedy tokens, float32, torch.compile; "
             "identical: sequences equal to the same target alone on one rank (and at the same layout)"), "",
             ("| model | drafter | tp | pp | executor | status | identical to TP 1 | to same layout, no spec | τ "
             "| start-up s | message |"), "|---|---|---|---|---|---|---|---|---|---|---|"]

    def frac(value: dict | None) -> str:
        return f"{value['identical']}/{value['total']}" if value else "-"

    for r in result["rows"]:
        lines.append(f"| {r['model']} | {r['drafter']} | {r['tp']} | {r['pp']} | {r['executor']} | {r['status']} "
                     f"| {frac(r.get('identical_to_tp1'))} | {frac(r.get('identical_to_layout_nospec'))} "
                     f"| {r.get('tau') or '-'} | {r.get('start_s', '-')} | {r.get('error', '')[:160]} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=ROOT / ".kimi/models/reference",
                        help="the reference models (python3 -m kimi models make)")
    parser.add_argument("--pair", type=Path, default=SHIPPED_PAIR, help="the trained pair (default: models/pair)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("-k", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    parser.add_argument("--render", type=Path, metavar="JSON", help="rewrite the markdown of a parallel.json")
    args = parser.parse_args()
    if args.render:
        result = json.loads(args.render.read_text())
        for row in result["rows"]:  # the fields derived from what was recorded, as this version derives them
            row.update(failure(row["error"]) if "error" in row else {}, executor=executor(row["tp"], row["pp"]))
        write_json(args.render, result)
        write_lines(args.render.with_suffix(".md"), markdown(result))
        return 0
    if not (args.models / "MANIFEST.json").is_file():
        parser.error(f"no reference models in {args.models}: run `python3 -m kimi models make` first")
    import os

    import torch
    import vllm

    began = time.monotonic()
    result = {**stamp("benchmarks/parallel.py", sys.argv[1:], python="python"), "cpu": cpu_name(),
              "cpus": len(os.sched_getaffinity(0)), "prompts": args.prompts, "tokens": args.tokens,
              "versions": {"vllm": vllm.__version__, "torch": torch.__version__, "python": sys.version.split()[0]},
              "rows": []}
    prompts = code_prompts(args.prompts)

    def log(msg: str) -> None:
        print(f"parallel [{time.monotonic() - began:6.0f} s] {msg}", flush=True)

    for name, target, drafters in (("pair", args.pair / "target", {"llama": str(args.pair / "drafter")}),
                                   ("reference", args.models / "target", reference_drafters(args.models))):
        prompt_ids = tokenize(str(target), prompts)
        result["rows"] += model_rows(name, str(target), drafters, prompt_ids, args.tokens, args.k, log)
        result["seconds"] = round(time.monotonic() - began)
        write_json(args.out / "parallel.json", result)
        write_lines(args.out / "parallel.md", markdown(result))
    print("\n".join(markdown(result)))
    return 0 if all(r["status"] in ("done", "refused") for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
