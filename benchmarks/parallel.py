"""EAGLE-3 on DeepSeek-V3 targets across tensor- and pipeline-parallel layouts on CPU (issue K).

Run in the fork's venv (``python3 -m kimi setup`` makes it; ``python3 -m kimi models make`` the reference models)::

    .venv/bin/python benchmarks/parallel.py [--prompts 8] [--tokens 48] [-k 3]

For the shipped trained pair (its Llama-style drafter) and the reference target with both drafter styles
(Llama-style and MLA-style, random weights), every layout of ``kimi_lab.bench.parallel.LAYOUTS`` (TP 1, TP 2, PP 2,
TP 2 x PP 2, PP 3; vLLM's multiprocessing executor, gloo between the CPU workers, one CPU per worker, shared where
there are more workers than CPUs) serves the same greedy prompts without speculation and with each drafter. Each
run is compared with the target alone on one rank: greedy output identical, τ from vLLM's counters, start-up
seconds. A layout the fork refuses before loading keeps the refusal's message in its row.

``--executors ray`` (issue 19; ``.venv/bin/python -m pip install ray`` first) runs the multi-worker layouts of
``kimi_lab.bench.parallel.RAY_LAYOUTS`` (TP 2, PP 2, TP 2 x PP 2) through vLLM's Ray executor
(``--distributed-executor-backend ray``; on CPU the fork's patch 0021) on a local Ray cluster that the run starts
and stops with as many CPUs as the largest layout's placement group asks for (``kimi_lab.bench.parallel.ray_cpus``),
or on the one ``RAY_ADDRESS`` names, compared with the target on one rank; ``--executors mp ray`` runs both.
``--targets pair`` leaves out the reference models. ``--merge`` keeps the rows of ``--out``'s ``parallel.json`` that
this run does not redo, so that the Ray rows can be added alone::

    .venv/bin/python benchmarks/parallel.py --executors ray --targets pair --merge

``--executors serve`` runs the layouts of ``kimi_lab.bench.parallel.SERVE_LAYOUTS`` (PP 2) as ``vllm serve`` answering
the prompts sent at once by the official ``openai`` client (server logs under ``--out``/logs/parallel)::

    .venv/bin/python benchmarks/parallel.py --executors serve --targets pair --merge

Writes ``parallel.json`` and ``parallel.md`` to ``--out`` (default ``benchmarks/results``), both rewritten after each
model; ``--render FILE`` rewrites them from a ``parallel.json``. The runs are ``kimi_lab.bench.parallel``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))  # kimi_lab alone: docs/benchmarks.md

from kimi.e2e.engine import tokenize
from kimi.models import SHIPPED_PAIR
from kimi.models.prompts import code_prompts
from kimi_lab.bench.hardware import cpu_name
from kimi_lab.bench.parallel import (
    boundary_drafter,
    executor,
    failure,
    local_ray,
    model_rows,
    ray_cpus,
    reference_drafters,
)
from kimi_lab.bench.results import header, stamp, write_json, write_lines

ROOT = Path(__file__).resolve().parents[1]
#: Under the header when there are Ray rows.
RAY_NOTE = ("- executor `ray`: vLLM's Ray executor (`distributed_executor_backend=\"ray\"`) on a local Ray cluster "
            "started and stopped by the run; `unsupported`: vLLM refuses it before loading anything")
#: Under the header when there are PP 3 rows.
PP3_NOTE = ("- pp 3: vLLM splits the pair's 6 layers 2 + 2 + 2 and the reference's 8 layers 3 + 3 + 2 "
            "(`get_pp_indices`); the middle stage receives the first stage's aux states, makes its own and sends "
            "both on")
#: Under the header when there are ``vllm serve`` rows.
SERVE_NOTE = ("- executor `serve`: `vllm serve` (vLLM's multiprocessing executor) answering every prompt at once, "
              "sent by the official `openai` client (completions, greedy, token ids returned); compared with the "
              "target alone on one rank in-process")


def markdown(result: dict) -> list[str]:
    """The result as a markdown table under the command, date, CPU and versions."""
    v = result["versions"]
    lines = [*header("EAGLE-3 across parallel layouts on CPU (issue K)", result["command"], result["date"]),
             f"- CPU: {result['cpu']} ({result['cpus']} CPUs for this process)",
             f"- versions: vLLM {v['vllm']}, torch {v['torch']}, Python {v['python']}"
             + (f", Ray {v['ray']}" if v.get("ray") else ""),
             (f"- {result['prompts']} held-out prompts x {result['tokens']} greedy tokens, float32, torch.compile; "
             "identical: sequences equal to the same target alone on one rank (and at the same layout)"),
             *[f"- rows added by `{run['command']}` ({run['date']}" + (f", {run['cpu']}" if run.get("cpu") else "")
               + f"): {run['rows']}" for run in result.get("added", [])],
             *([(f"- drafter `llama-boundary`: the pair's drafter served with aux ids {result['boundary_ids']} "
                 "(trained on [2, 4, 5]): one inside each of PP 2's stages and one exactly at their boundary; its "
                 "τ is whatever those layers give, its output must stay lossless")]
               if result.get("boundary_ids") and any(r["drafter"] == "llama-boundary" for r in result["rows"])
               else []),
             *([PP3_NOTE] if any(r["pp"] == 3 for r in result["rows"]) else []),
             *([RAY_NOTE] if any(r["executor"] == "ray" for r in result["rows"]) else []),
             *([SERVE_NOTE] if any(r["executor"] == "serve" for r in result["rows"]) else []), "",
             ("| model | drafter | tp | pp | executor | status | identical to TP 1 | to same layout, no spec | τ "
             "| start-up s | message |"), "|---|---|---|---|---|---|---|---|---|---|---|"]

    def frac(value: dict | None) -> str:
        return f"{value['identical']}/{value['total']}" if value else "-"

    for r in result["rows"]:
        lines.append(f"| {r['model']} | {r['drafter']} | {r['tp']} | {r['pp']} | {r['executor']} | {r['status']} "
                     f"| {frac(r.get('identical_to_tp1'))} | {frac(r.get('identical_to_layout_nospec'))} "
                     f"| {r.get('tau') or '-'} | {r.get('start_s', '-')} | {r.get('error', '')[:160]} |")
    return lines


def merged(previous: dict, new: dict) -> dict:
    """``previous`` (a parallel.json) with ``new``'s rows: a row of the same model, drafter, layout and executor
    replaced in place, others after the last row of their model; ``new``'s command, date and versions noted
    under ``added``."""
    def key(row: dict) -> tuple:
        return row["model"], row["drafter"], row["tp"], row["pp"], row["executor"]

    fresh = {key(r): r for r in new["rows"]}
    rows = [fresh.pop(key(r), r) for r in previous["rows"]]
    for row in fresh.values():
        last = max((i for i, r in enumerate(rows) if r["model"] == row["model"]), default=len(rows) - 1)
        rows.insert(last + 1, row)
    note = {"command": new["command"], "date": new["date"], "seconds": new.get("seconds"), "cpu": new.get("cpu"),
            "rows": ", ".join(sorted({f"{r['model']} tp {r['tp']} pp {r['pp']} {r['executor']}" for r in new["rows"]}))}
    return {**previous, "versions": {**previous["versions"], **new["versions"]},
            **{key: new[key] for key in ("boundary_ids",) if key in new},
            "added": [*previous.get("added", []), note], "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=ROOT / ".kimi/models/reference",
                        help="the reference models (python3 -m kimi models make)")
    parser.add_argument("--pair", type=Path, default=SHIPPED_PAIR, help="the trained pair (default: models/pair)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("-k", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    parser.add_argument("--executors", nargs="+", choices=("mp", "ray", "serve"), default=["mp"],
                        help="mp: every layout with vLLM's default executors; ray: TP 2, PP 2, TP 2 x PP 2 "
                        "through vLLM's Ray executor on a local Ray cluster (pip install ray); serve: PP 2 as vllm "
                        "serve, asked by the openai client")
    parser.add_argument("--targets", nargs="+", choices=("pair", "reference"), default=["pair", "reference"])
    parser.add_argument("--layouts", nargs="+", metavar="TPxPP",
                        help="only these layouts of each executor (e.g. 1x1 1x2 2x2; the one-rank run 1x1 is what "
                        "the mp rows compare with)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the rows of --out's parallel.json that this run does not redo")
    parser.add_argument("--render", type=Path, metavar="JSON", help="rewrite the markdown of a parallel.json")
    args = parser.parse_args()
    if args.render:
        result = json.loads(args.render.read_text())
        for row in result["rows"]:  # the fields derived from what was recorded, as this version derives them
            row.update(failure(row["error"]) if "error" in row else {},
                       executor=executor(row["tp"], row["pp"], row["executor"] if row["executor"] in ("ray", "serve")
                                         else "mp"))
        write_json(args.render, result)
        write_lines(args.render.with_suffix(".md"), markdown(result))
        return 0
    if "reference" in args.targets and not (args.models / "MANIFEST.json").is_file():
        parser.error(f"no reference models in {args.models}: run `python3 -m kimi models make` first")
    import os

    import torch
    import vllm

    began = time.monotonic()
    previous = json.loads((args.out / "parallel.json").read_text()) if args.merge else None
    if "ray" in args.executors:
        try:
            import ray
        except ImportError:
            parser.error("--executors ray needs Ray: .venv/bin/python -m pip install ray")
    result = {**stamp("benchmarks/parallel.py", sys.argv[1:], python="python"), "cpu": cpu_name(),
              "cpus": len(os.sched_getaffinity(0)), "prompts": args.prompts, "tokens": args.tokens,
              "versions": {"vllm": vllm.__version__, "torch": torch.__version__, "python": sys.version.split()[0],
                           **({"ray": ray.__version__} if "ray" in args.executors else {})},
              "rows": []}
    prompts = code_prompts(args.prompts)
    try:
        layouts = None if args.layouts is None else tuple(
            (int(tp), int(pp)) for tp, pp in (layout.lower().split("x") for layout in args.layouts))
    except ValueError:
        parser.error(f"--layouts takes TPxPP (e.g. 1x2 2x2), got {args.layouts}")

    def log(msg: str) -> None:
        print(f"parallel [{time.monotonic() - began:6.0f} s] {msg}", flush=True)

    boundary, ids = boundary_drafter(args.pair / "drafter", args.pair / "target",
                                     Path(tempfile.gettempdir()) / "kimi-parallel-boundary-drafter")
    result["boundary_ids"] = list(ids)
    models = {"pair": (args.pair / "target", {"llama": str(args.pair / "drafter"), "llama-boundary": str(boundary)}),
              "reference": (args.models / "target", reference_drafters(args.models))}
    for name in args.targets:
        target, drafters = models[name]
        prompt_ids = tokenize(str(target), prompts)
        for backend in args.executors:
            with local_ray(ray_cpus()) if backend == "ray" else nullcontext():
                result["rows"] += model_rows(name, str(target), drafters, prompt_ids, args.tokens, args.k, log,
                                             backend=backend, logs=args.out / "logs" / "parallel", layouts=layouts)
        result["seconds"] = round(time.monotonic() - began)
        shown = merged(previous, result) if previous else result
        write_json(args.out / "parallel.json", shown)
        write_lines(args.out / "parallel.md", markdown(shown))
    result = shown
    print("\n".join(markdown(result)))
    return 0 if all(r["status"] in ("done", "refused", "unsupported") for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
