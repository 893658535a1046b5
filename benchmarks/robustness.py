"""EAGLE-3 through the engine's hard paths with real clients (issue 17): a seeded, bounded torture run on CPU.

Run in the fork's venv (``python3 -m kimi setup`` makes it; ``python3 -m kimi models make`` the reference models)::

    .venv/bin/python benchmarks/robustness.py [--styles llama mla] [--no-bench]

For each drafter style (``llama``: the shipped trained pair, whose drafter is accepted often enough that stops land
inside accepted drafts; ``mla``: the reference DeepSeek-V3 target with its MLA-style drafter, random weights, rarely
accepted) ``vllm serve`` with EAGLE-3 (k = 3) gets every scenario of ``kimi_lab.bench.torture`` through the official
``openai`` client: preemption and recompute in a small KV cache, clients that disconnect mid-stream, prefix-cache
hits, chunked prefill, prompts ending at ``max_model_len``, JSON-schema and regex outputs, mixed sampling, stop
strings and ``max_tokens`` inside an accepted draft, ``n > 1``, logprobs, streaming, multi-turn chat and forced tool
calls on ``/v1/chat/completions`` (the servers get the fork's chat template, ``kimi/e2e/chat_template.jinja``: the
models have none); then malformed requests and ``vllm bench serve`` at c = 1/4/16/64 (``llama`` only). The same calls
go to the same server without speculation (greedy output compared token by token) and the seeded ones to an EAGLE-3
server with another chunking.

Writes ``robustness.json`` and ``robustness.md`` to ``--out`` (default ``benchmarks/results``), the servers' logs to
``--out/logs/robustness``. The run is ``kimi_lab.bench.robustness``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))  # kimi_lab alone: docs/benchmarks.md

from kimi.errors import KimiError
from kimi.models import SHIPPED_PAIR
from kimi.models.prompts import code_prompt_ids
from kimi_lab.bench.hardware import cpu_name, describe, device
from kimi_lab.bench.log import logger
from kimi_lab.bench.other_tools import check_other_tools
from kimi_lab.bench.results import header, stamp, write_json, write_lines
from kimi_lab.bench.robustness import BENCH_TOKENS, SERVER_ENV, K, run_style
from kimi_lab.bench.torture import REQUEST_BOUND_S, PromptPool
from kimi_lab.drafter.assumptions import assumption_table

ROOT = Path(__file__).resolve().parents[1]


def styles(models: Path) -> dict[str, tuple[Path, Path]]:
    """``{style: (target folder, drafter folder)}``."""
    return {"llama": (SHIPPED_PAIR / "target", SHIPPED_PAIR / "drafter"),
            "mla": (models / "target", models / "drafter-mla")}


def cell(text: str) -> str:
    """``text`` as one markdown table cell (newlines and pipes would break the row)."""
    return " ".join(text.split()).replace("|", "\\|")


def markdown(result: dict) -> list[str]:
    """The result as markdown: per style the scenario table, the bad requests, the counters and the bench rows."""
    v = result["versions"]
    host = "" if result["device"].startswith("CPU") else f"; CPU: {result['cpu']}"
    lines = [*header("EAGLE-3 robustness: hard paths and real clients (issue 17)", result["command"],
                     result["date"]),
             (f"- device: {result['device']}{host}; vLLM {v['vllm']}, torch {v['torch']}, openai {v['openai']}; "
              f"VLLM_ environment: {result.get('vllm_env') or 'none'}"
              + (f", and the servers' {result['server_env']}" if "server_env" in result else "")),
             (f"- k = {result['k']}; every request bounded to {result['request_bound_s']:.0f} s (longer = a hang); "
              f"{result['seconds']} s in all"), ""]
    for style, run in result["styles"].items():
        if "error" in run:
            lines += [f"## {style}: `{Path(run['drafter']).name}` on `{Path(run['target']).name}`", "",
                      "A server did not start:", "", "```text", run["error"][-1500:], "```", ""]
            continue
        c = run["counters"]
        lines += [f"## {style}: `{Path(run['drafter']).name}` on `{Path(run['target']).name}`", "",
                  (f"Start-up (s): {run['start_s']}. Spec-decode counters: {c['num_drafts']:.0f} drafts, "
                   f"{c['num_draft_tokens']:.0f} draft tokens, {c['num_accepted_tokens']:.0f} accepted, "
                   f"τ {c['tau']}, consistent (accepted ≤ drafted ≤ k × drafts): {c['consistent']}. Stop calls "
                   f"ending inside a multi-token chunk: {run['stops_inside_multi_token_chunks']}. Server alive after "
                   f"all: {run['server_alive_after']}."), "",
                  ("| scenario | requests | greedy identical / total (control: no speculation, batched = alone) | "
                   "seeded identical across chunkings (and to no speculation; control) | crashes | "
                   "hangs | errors | s | evidence |"), "|---|---|---|---|---|---|---|---|---|"]
        for name, row in run["scenarios"].items():
            evidence = {k: row[k] for k in row if k not in (
                "requests", "identical", "total", "seeded_identical", "seeded_total", "differs", "crashes", "hangs",
                "errors", "seconds", "control_identical", "control_total", "seeded_nospec_identical",
                "seeded_nospec_total", "seeded_control_identical", "seeded_control_total")}
            seeded = f"{row['seeded_identical']} / {row['seeded_total']}" if row["seeded_total"] else "-"
            if row.get("seeded_nospec_total"):
                seeded_control = (f"; control {row['seeded_control_identical']} / {row['seeded_control_total']}"
                                  if "seeded_control_total" in row else "")
                seeded += f" ({row['seeded_nospec_identical']} / {row['seeded_nospec_total']}{seeded_control})"
            control = (f" (control {row['control_identical']} / {row['control_total']})"
                       if "control_total" in row else "")
            lines.append(f"| {name} | {row['requests']} | {row['identical']} / {row['total']}{control} | {seeded} | "
                         f"{row['crashes']} | {row['hangs']} | {len(row['errors'])} | {row['seconds']} | {evidence} |")
        lines += ["", "| request | HTTP status (expected) | message |", "|---|---|---|"]
        lines += [f"| {name} | {r['status']} ({r['expected']}) | {cell(r['message'][:120])} |"
                  for name, r in run["bad_requests"].items()]
        lines.append("")
        if run.get("bench_serve"):
            lines += [f"`vllm bench serve` (random, {BENCH_TOKENS[0]} in / {BENCH_TOKENS[1]} out, ignore EOS):", "",
                      "| c | requests | completed | failed | s | output tok/s | τ |", "|---|---|---|---|---|---|---|"]
            for row in run["bench_serve"]:
                if "error" in row:
                    lines.append(f"| {row['concurrency']} | error: {cell(row['error'][:120])} ||||||")
                    continue
                lines.append(f"| {row['concurrency']} | {row['num_prompts']} | {row['completed']} | {row['failed']} | "
                             f"{row['duration']:.1f} | {row['output_throughput']:.0f} | "
                             f"{row['spec_decode_acceptance_length']:.3f} |")
            failures = [f"- c = {row['concurrency']}: {count} × `{cell(error)}`" for row in run["bench_serve"]
                        for error, count in row.get("errors", {}).items()]
            lines += ["", "Failed requests' errors:", *failures] if failures else []
            lines.append("")
    for style, rows in result.get("drafter_assumptions", {}).items():
        lines += [f"## Drafter checkpoints that lie about themselves ({style}; docs/drafter-assumptions.md)", "",
                  ("| assumption | what vLLM reads | vLLM 0.32.0 without the check | refused by the fork | "
                   "what `kimi drafter inspect` says |"), "|---|---|---|---|---|"]
        lines += [f"| {r['name']}{' (valid)' if r['valid'] else ''} | {cell(r['reads'])} | "
                  f"{cell(r['upstream_behaviour'])} | {r['refused']} | {cell(r['message'][:200])} |" for r in rows]
        lines.append("")
    other = result.get("other_tools")
    if other:
        lines += ["## Drafters written by other tools (kimi_lab.bench.other_tools)", "",
                  (f"Ours: {other['ours']['counters']} on {other['prompts']} prompts x {other['tokens']} tokens, "
                   f"k = {other['k']}. Lossless with our tokens and counters: {other['lossless']}."), "",
                  "| tool | format found | served | identical / total | counters equal to ours |",
                  "|---|---|---|---|---|"]
        for tool, row in other["tools"].items():
            for how, served in row.get("served", {}).items():
                lines.append(f"| {tool} | {row.get('format')} | {how} | {served['identical']} / {served['total']} | "
                             f"{served['counters_equal']} |")
            if "error" in row:
                lines.append(f"| {tool} | {row.get('format')} | error at {row.get('failed_at')} | "
                             f"{cell(row['error'][:150])} | |")
        lines.append("")
    dtypes = sorted({run["dtype"] for run in result["styles"].values() if "dtype" in run})
    lines.append(f"Servers in {', '.join(dtypes) or 'the default dtype'}. Not shown here: throughput on a GPU where "
                 "this ran on CPU (CPU output rates are not comparable), and whether the differences in bfloat16 "
                 "are numerics or a bug beyond the control (the server without speculation, batched against alone).")
    return lines


def offline_parts(result: dict, args: argparse.Namespace, log) -> None:
    """Into ``result``: the drafter-assumption table per style (``kimi_lab.drafter.assumptions``, no engine) and, on
    CPU unless ``--no-other-tools``, the drafters written by other tools served against ours
    (``kimi_lab.bench.other_tools``, engines, a few minutes)."""
    result["drafter_assumptions"] = {style: assumption_table(drafter, target)
                                     for style, (target, drafter) in styles(args.models).items()
                                     if style in args.styles}
    if not args.no_other_tools and not args.gpu:
        log("drafters of other tools: speculators and SpecForge's layout against ours (kimi_lab.bench.other_tools)")
        with tempfile.TemporaryDirectory(prefix="kimi-other-tools-") as work:
            result["other_tools"] = check_other_tools(SHIPPED_PAIR, Path(work))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=ROOT / ".kimi/models/reference")
    parser.add_argument("--styles", nargs="+", choices=("llama", "mla"), default=["llama", "mla"])
    parser.add_argument("--no-bench", action="store_true", help="leave out vllm bench serve")
    parser.add_argument("--no-other-tools", action="store_true",
                        help="leave out the drafters written by speculators and in SpecForge's layout")
    parser.add_argument("--gpu", action="store_true",
                        help="on a GPU: bfloat16, CUDA graphs, and the greedy calls also one by one without "
                             "speculation (the control); writes robustness-gpu.json/.md")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    parser.add_argument("--refresh", type=Path, metavar="JSON",
                        help="only redo the parts without servers (the drafter-assumption table, other tools' "
                             "drafters) into this result and rewrite its .json and .md")
    args = parser.parse_args()
    if "mla" in args.styles and not (args.models / "MANIFEST.json").is_file():
        parser.error(f"no reference models in {args.models}: run `python3 -m kimi models make` first")
    import openai
    import torch
    import vllm
    from tokenizers import Tokenizer

    log = logger("robustness")
    begin = time.monotonic()
    if args.refresh:
        result = json.loads(args.refresh.read_text())
        result["refreshed"] = {**stamp("benchmarks/robustness.py", sys.argv[1:], python="python"),
                               "parts": "drafter_assumptions" + ("" if args.no_other_tools else ", other_tools")}
        offline_parts(result, args, log)
        write_json(args.refresh, result)
        write_lines(args.refresh.with_suffix(".md"), markdown(result))
        return 0 if result.get("other_tools", {"lossless": True})["lossless"] else 1
    result = {**stamp("benchmarks/robustness.py", sys.argv[1:], python="python"), "cpu": cpu_name(),
              "device": describe(device()),
              "versions": {"vllm": vllm.__version__, "torch": torch.__version__, "openai": openai.__version__},
              "vllm_env": {key: value for key, value in sorted(os.environ.items()) if key.startswith("VLLM_")},
              "server_env": SERVER_ENV,
              "k": K, "request_bound_s": REQUEST_BOUND_S, "styles": {}}
    logs = args.out / "logs" / "robustness"
    name = "robustness-gpu" if args.gpu else "robustness"
    args.out.mkdir(parents=True, exist_ok=True)
    for style in args.styles:
        target, drafter = styles(args.models)[style]
        tokenizer = Tokenizer.from_file(str(target / "tokenizer.json"))
        pool = PromptPool([t for ids in code_prompt_ids(target / "tokenizer.json", 48, 400) for t in ids])
        try:
            result["styles"][style] = run_style(style, str(target), str(drafter), pool, tokenizer.decode, logs, log,
                                                bench=style == "llama" and not args.no_bench, gpu=args.gpu,
                                                control=args.gpu)
        except KimiError as exc:  # a server that did not start: kept, and the other styles still run
            result["styles"][style] = {"target": str(target), "drafter": str(drafter), "error": str(exc)[-3000:]}
        result["seconds"] = round(time.monotonic() - begin)
        write_json(args.out / f"{name}.json", result)
        write_lines(args.out / f"{name}.md", markdown(result))
    offline_parts(result, args, log)
    result["seconds"] = round(time.monotonic() - begin)
    write_json(args.out / f"{name}.json", result)
    write_lines(args.out / f"{name}.md", markdown(result))
    print("\n".join(markdown(result)))
    failed = any("error" in run for run in result["styles"].values())
    return 1 if failed or not result.get("other_tools", {"lossless": True})["lossless"] else 0


if __name__ == "__main__":
    sys.exit(main())
