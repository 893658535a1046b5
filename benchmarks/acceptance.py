"""Acceptance of the trained reference pair served with EAGLE-3 (issue F): tau, per-position, wiring check.

Run in the fork's venv, on CPU or on a GPU host (engine settings are picked per platform)::

    .venv/bin/python benchmarks/acceptance.py [--models DIR] [--out DIR] [-k 3] [--prompts 16] [--tokens 64]

1. The trained pair (``kimi models train-pair``, default ``.kimi/models/trained``) is made when missing
   (minutes on a CPU; deterministic).
2. The target is served with its drafter, greedy, on held-out code prompts (stdlib packages the
   tokenizer and the models never saw); tau = 1 + accepted / drafts and per-position acceptance come
   from vLLM's spec-decode metrics.
3. The same drafter with every aux layer id shifted by one is served the same way (``tau_shifted_ids``):
   a drafter fed the wrong layers must lose acceptance - the guard that the wiring is right.

Writes ``acceptance.json`` ({device, k, tau, per_position, tau_shifted_ids, command, date, ...}) and
``acceptance.md`` to ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kimi.drafter.conventions import IDS_FIELD  # noqa: E402
from kimi.e2e.engine import tokenize  # noqa: E402
from kimi.e2e.prompts import code_prompts  # noqa: E402
from kimi.fork.fsutil import write_atomic  # noqa: E402
from kimi.train.acceptance import served_acceptance  # noqa: E402
from kimi.train.engine import engine_settings, on_cuda  # noqa: E402
from kimi.train.export import with_ids  # noqa: E402
from kimi.train.pair import train_pair  # noqa: E402


def device_name() -> str:
    import torch

    if on_cuda():
        return f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"
    return f"CPU {platform.machine()} ({os.cpu_count()} cores)"


def markdown(result: dict) -> str:
    per = " | ".join(f"{p:.3f}" for p in result["per_position"])
    shifted = " | ".join(f"{p:.3f}" for p in result["per_position_shifted_ids"])
    return "\n".join([
        "# EAGLE-3 acceptance of the trained reference pair", "",
        (f"{result['date']} on {result['device']}; k = {result['k']}, greedy, {result['prompts']} held-out code "
         f"prompts x {result['tokens']} tokens; aux layer ids {result['aux_layer_ids']} (vLLM's convention)."), "",
        "| drafter | tau | " + " | ".join(f"pos {i}" for i in range(result["k"])) + " |",
        "|---|---|" + "---|" * result["k"],
        f"| as trained | {result['tau']:.3f} | {per} |",
        f"| aux ids shifted by one {result['shifted_ids']} | {result['tau_shifted_ids']:.3f} | {shifted} |", "",
        f"tau - tau_shifted_ids = {result['tau'] - result['tau_shifted_ids']:.3f}. Command: `{result['command']}`", ""])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=ROOT / ".kimi" / "models" / "trained")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("-k", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    started = time.monotonic()
    manifest = train_pair(args.models)
    target, drafter = args.models / "target", args.models / "drafter"
    ids = json.loads((drafter / "config.json").read_text())[IDS_FIELD]
    layers = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    shifted = [i + 1 for i in ids] if ids[-1] + 1 < layers else [i - 1 for i in ids]
    prompt_ids = tokenize(str(target), code_prompts(args.prompts))
    engine = engine_settings(eager=not on_cuda())
    print(f"acceptance: serving {target} with {drafter} (ids {ids}), k = {args.k}", flush=True)
    ours = served_acceptance(str(target), str(drafter), prompt_ids, args.k, args.tokens, engine)
    print(f"acceptance: tau {ours['tau']:.3f}, per position {ours['per_position']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="kimi-shifted-") as tmp:
        moved = with_ids(drafter, shifted, Path(tmp) / "drafter")
        theirs = served_acceptance(str(target), str(moved), prompt_ids, args.k, args.tokens, engine)
    print(f"acceptance: ids {shifted}: tau {theirs['tau']:.3f}", flush=True)
    result = {"device": device_name(), "k": args.k, "tau": ours["tau"], "per_position": ours["per_position"],
              "tau_shifted_ids": theirs["tau"], "per_position_shifted_ids": theirs["per_position"],
              "aux_layer_ids": ids, "shifted_ids": shifted, "prompts": args.prompts, "tokens": args.tokens,
              "counters": ours["counters"], "counters_shifted_ids": theirs["counters"],
              "engine": {k: v for k, v in engine.items()},
              "pair": {"target_final_loss": manifest["target_final_loss"], "recipe": manifest["recipe"],
                       "seconds": manifest["seconds"]},
              "command": "python " + " ".join([os.path.relpath(__file__, ROOT), *sys.argv[1:]]),
              "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "seconds": round(time.monotonic() - started, 1)}
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "acceptance.json", json.dumps(result, indent=2) + "\n")
    write_atomic(args.out / "acceptance.md", markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
