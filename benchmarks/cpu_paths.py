"""Step cost of two CPU paths side by side: the v0.32 line's compiled one and the mainline's torch-only platform.

    .venv/bin/python benchmarks/cpu_paths.py --path compiled-0.32=.kimi/envs/v0.32/.venv/bin/python \\
        --path torch-0.34=.venv/bin/python [--model NAME=TARGET:DRAFTER ...] [--prompts 8] [--tokens 32]

The first ``--path`` is the baseline. ``--model`` (repeatable; default ``pair``, the shipped pair) names a target
folder and its EAGLE-3 drafter's, e.g. ``mla=M/target:M/drafter-mla`` or ``k25=M/kimi-k25:M/drafter-llama`` for the
reference models of ``kimi models make M``. For each round, model and path: no speculation, then EAGLE-3 at
``--k``; each measurement in a fresh child process of that path's python (``kimi_lab.bench.cpu_paths``). Writes
``cpu_paths.json`` and ``cpu_paths.md`` to ``--out``.
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

SETTINGS = ("nospec", "eagle3")


def measure(target: str, drafter: str | None, k: int, prompt_ids: list[list[int]], tokens: int) -> dict:
    """One engine, warmed up by a 4-token batch, then ``tokens`` greedy tokens for every prompt in one batch, timed:
    ``{"vllm", "seconds", "steps", "step_ms", "tau", "start_s", "tokens"}``.

    ``drafter`` None runs without speculation; else EAGLE-3 with ``k`` draft tokens. Steps: one per token without
    speculation; with EAGLE-3, the timed batch's drafts per request plus its prefill step. ``tau`` is the mean
    acceptance length (1 + accepted / drafts) of the timed batch, None without speculation.
    """
    import vllm
    from vllm import LLM

    from kimi.e2e.engine import timed_greedy
    from kimi.e2e.presets import CPU_EAGER

    spec = None if drafter is None else {"method": "eagle3", "model": drafter, "num_speculative_tokens": k}
    began = time.monotonic()
    llm = LLM(model=target, speculative_config=spec, disable_log_stats=False, **CPU_EAGER)
    start_s = time.monotonic() - began
    seconds, counted, token_ids = timed_greedy(llm, prompt_ids, tokens)
    drafts = counted["num_drafts"]
    steps = round(drafts / len(prompt_ids)) + 1 if drafter else tokens
    llm.llm_engine.engine_core.shutdown()
    return {"vllm": vllm.__version__, "seconds": round(seconds, 3), "start_s": round(start_s, 1), "steps": steps,
            "step_ms": round(1000 * seconds / steps, 2),
            "tau": round(1 + counted["num_accepted_tokens"] / drafts, 3) if drafts else None,
            "tokens": token_ids}


def parse_model(text: str) -> tuple[str, str, str]:
    """``NAME=TARGET:DRAFTER`` -> ``(name, target, drafter)`` (absolute folders, each with a ``config.json``); a
    folder may hold ``:`` itself: the split is the one ``:`` whose two sides both hold a ``config.json``."""
    def has_config(folder: str) -> bool:
        return (Path(folder) / "config.json").is_file()

    name, sep, folders = text.partition("=")
    splits = [(folders[:i], folders[i + 1:]) for i, char in enumerate(folders) if char == ":"]
    splits = [(target, drafter) for target, drafter in splits if target and drafter]
    if not sep or not name or not splits:
        raise argparse.ArgumentTypeError(f"--model wants NAME=TARGET:DRAFTER, not {text!r}")
    found = [pair for pair in splits if all(map(has_config, pair))]
    if not found:
        missing = [folder for folder in splits[-1] if not has_config(folder)]
        raise argparse.ArgumentTypeError(f"--model {name}: no config.json in {' or '.join(missing)}")
    if len(found) > 1:
        raise argparse.ArgumentTypeError(f"--model {name}: {folders!r} splits into target and drafter more than "
                                         "one way; use folders without ':'")
    target, drafter = found[0]
    return name, str(Path(target).resolve()), str(Path(drafter).resolve())


def parse_path(text: str) -> tuple[str, str]:
    name, sep, python = text.partition("=")
    if not sep or not name or not python:
        raise argparse.ArgumentTypeError(f"--path wants NAME=PYTHON, not {text!r}")
    if not Path(python).is_file():
        raise argparse.ArgumentTypeError(f"--path {name}: no interpreter at {python}")
    return name, python


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", type=parse_path, action="append", default=[], metavar="NAME=PYTHON")
    parser.add_argument("--model", type=parse_model, action="append", default=[], metavar="NAME=TARGET:DRAFTER")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per measurement")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:  # a child: its install's own kimi and vllm
        job = json.loads(args.measure)
        print(json.dumps(measure(**job)))
        return 0
    sys.path.insert(0, str(ROOT))
    from kimi_lab.bench.hardware import cpu_name
    from kimi_lab.bench.results import header, stamp, write_json, write_lines

    if len(args.path) < 2:
        parser.error("give two or more --path NAME=PYTHON (the first is the baseline)")
    if len({name for name, _ in args.path}) != len(args.path):
        parser.error("--path names must differ")
    models = args.model or [("pair", str(ROOT / "models/pair/target"), str(ROOT / "models/pair/drafter"))]
    if len({name for name, _, _ in models}) != len(models):
        parser.error("--model names must differ")
    from kimi.e2e.engine import tokenize
    from kimi.models.prompts import code_prompts
    from kimi_lab.bench.cpu_paths import run_child, summarize

    prompt_ids = {name: tokenize(target, code_prompts(args.prompts)) for name, target, _ in models}
    # each child imports its own install's kimi and vllm: nothing of this checkout on its path
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    cache_root = tempfile.mkdtemp(prefix="cpu-paths-cache-")
    runs: dict = {}
    for number in range(args.rounds):
        for model, target, drafter in models:
            for name, python in args.path:
                for setting in SETTINGS:
                    job = {"target": target, "drafter": drafter if setting == "eagle3" else None, "k": args.k,
                           "prompt_ids": prompt_ids[model], "tokens": args.tokens}
                    began = time.monotonic()
                    # a cache of its own per path (each release writes its own compile and model-info entries)
                    path_env = {**env, "VLLM_CACHE_ROOT": str(Path(cache_root) / name)}
                    result = run_child(str(Path(python).absolute()), str(Path(__file__).resolve()), job, path_env,
                                       args.timeout)
                    runs.setdefault((model, name, setting), []).append(result)
                    print(f"round {number + 1}: {model} {name} {setting}: {result['step_ms']} ms/step, "
                          f"tau {result['tau']} ({time.monotonic() - began:.0f} s)", flush=True)
    rows = summarize(runs, args.path[0][0])
    out = {**stamp("benchmarks/cpu_paths.py", sys.argv[1:], python=".venv/bin/python"), "cpu": cpu_name(),
           "cores": os.cpu_count(),
           "python": platform.python_version(), "prompts": args.prompts, "tokens": args.tokens, "k": args.k,
           "paths": dict(args.path), "models": {name: {"target": target, "drafter": drafter}
                                                for name, target, drafter in models}, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "cpu_paths.json", out)
    lines = header("CPU paths side by side: step cost, tau, lossless", out["command"], out["date"])
    lines += [(f"- machine: {out['cpu']} ({out['cores']} CPUs); {args.prompts} prompts x {args.tokens} tokens "
               f"in one batch, float32, eager, k = {args.k}, {args.rounds} rounds (median)"), "",
              "- models: " + "; ".join(f"{name} = `{target}` + `{drafter}`" for name, target, drafter in models), "",
              ("| model | path | vLLM | setting | ms/step | x baseline | steps | tau | lossless "
               "| same tokens as baseline |"),
              "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['model']} | {row['path']} | {row['vllm']} | {row['setting']} | {row['step_ms']:.1f} | "
                     f"{row['step_ratio']:.2f} | {row['steps']} | {row['tau'] or '-'} | "
                     f"{'-' if row['lossless'] is None else row['lossless']} | {row['same_as_baseline']} |")
    lines += ["", ("Not shown: throughput under concurrency (one batch only), start-up cost (`start_s` in the JSON); "
                   "the first batch after start-up (a 4-token warm-up, not timed); "
              "serving overheads.")]
    write_lines(args.out / "cpu_paths.md", lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
