"""Acceptance of the trained reference pair served with EAGLE-3 (issue F): tau, per-position, wiring check.

Run in the fork's venv, on CPU or on a GPU host (engine settings are picked per platform: float32 and eager
on CPU; bf16, 40 % of the GPU's memory and CUDA graphs on CUDA, ``--eager`` to do without them)::

    .venv/bin/python benchmarks/acceptance.py [--models DIR] [--out DIR] [-k 3] [--prompts 16] [--tokens 64]

On a GPU host with the fork installed into an existing vLLM (``kimi install-into``), carry the pair made on
a CPU (its ``target/``, ``drafter/`` and ``MANIFEST.json``, about 10 MB; ``work/`` is not needed)::

    PYTHONPATH=/tmp/site python3 benchmarks/acceptance.py --models PAIR --out OUT

1. The trained pair (``kimi models train-pair``, default ``.kimi/models/trained``) is made when the default
   folder lacks it or holds one made with another recipe (minutes on a CPU; deterministic); a pair named
   with ``--models`` is used as it is and never trained (a folder without ``MANIFEST.json`` is an error).
2. The target is served with its drafter, greedy, on held-out code prompts (stdlib packages the
   tokenizer and the models never saw); tau = 1 + accepted / drafts and per-position acceptance come
   from vLLM's spec-decode metrics.
3. The same drafter with every aux layer id shifted by one (up, or down where the top id is the target's
   last layer: :func:`kimi.train.export.shifted_ids`) is served the same way (``tau_shifted_ids``): a
   drafter fed the wrong layers must lose acceptance - the guard that the wiring is right.

Writes ``acceptance.json`` ({device, k, tau, per_position, tau_shifted_ids, command, date, ...}),
``acceptance.md`` and ``acceptance.png`` (per-position acceptance with the right and the shifted ids; where
matplotlib is importable) to ``--out`` (default ``benchmarks/results``), each atomically.
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
from kimi.errors import KimiError  # noqa: E402
from kimi.fork.fsutil import write_atomic  # noqa: E402
from kimi.train.acceptance import served_acceptance  # noqa: E402
from kimi.train.charts import acceptance_chart  # noqa: E402
from kimi.train.engine import engine_settings, on_cuda  # noqa: E402
from kimi.train.export import shifted_ids, with_ids  # noqa: E402


def device_name() -> str:
    import torch

    if on_cuda():
        return f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"
    return f"CPU {platform.machine()} ({os.cpu_count()} cores)"


def folder_mb(path: Path) -> float:
    """Size of the regular files under ``path`` in MB (links not followed)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / 1e6


def load_pair(models: Path, default: Path) -> dict:
    """The pair's manifest; trains the pair only in the default folder, when missing or made with another recipe
    (a carried pair is used as it is).

    Raises:
        KimiError: ``models`` is not the default folder and is not a complete pair.
    """
    from kimi.train.pair import train_pair

    missing = [name for name in ("MANIFEST.json", "target/config.json", "drafter/config.json")
               if not (models / name).is_file()]
    if missing and models.resolve() != default.resolve():
        raise KimiError(f"{models} is not a trained pair (no {', '.join(missing)}): make one with "
                        "`kimi models train-pair DIR` and carry its target/, drafter/ and MANIFEST.json")
    if models.resolve() == default.resolve():
        return train_pair(models)  # kept when complete and made with the current recipe
    return json.loads((models / "MANIFEST.json").read_text())


def chart(result: dict, path: Path) -> Path | None:
    """``path``: per-position acceptance as trained and with the shifted ids; None without matplotlib."""
    series = {f"aux ids {result['aux_layer_ids']}: tau {result['tau']:.2f}": result["per_position"],
              f"shifted {result['shifted_ids']}: tau {result['tau_shifted_ids']:.2f}":
                  result["per_position_shifted_ids"]}
    return acceptance_chart(path, series, f"EAGLE-3 acceptance, k = {result['k']}, greedy ({result['device']})")


def markdown(result: dict, png: str | None = None) -> str:
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
        f"tau - tau_shifted_ids = {result['tau'] - result['tau_shifted_ids']:.3f}. Command: `{result['command']}`", "",
        *([f"![per-position acceptance]({png})", ""] if png else [])])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = ROOT / ".kimi" / "models" / "trained"
    parser.add_argument("--models", type=Path, default=default,
                        help="the pair (default: .kimi/models/trained, trained there when missing)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("-k", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs on a GPU (always eager on CPU)")
    parser.add_argument("--render", type=Path, metavar="JSON",
                        help="only redraw acceptance.md and acceptance.png beside a recorded acceptance.json "
                             "(e.g. one brought back from a GPU host without matplotlib)")
    args = parser.parse_args()
    if args.render:
        render(json.loads(args.render.read_text()), args.render.parent)
        return 0
    started = time.monotonic()
    try:
        manifest = load_pair(args.models, default)
    except KimiError as exc:
        print(f"acceptance: {exc}", file=sys.stderr)
        return 1
    target, drafter = args.models / "target", args.models / "drafter"
    sizes = {"target_mb": round(folder_mb(target), 2), "drafter_mb": round(folder_mb(drafter), 2)}
    print(f"acceptance: pair {args.models}: target {sizes['target_mb']:.1f} MB, drafter {sizes['drafter_mb']:.1f} MB",
          flush=True)
    ids = json.loads((drafter / "config.json").read_text())[IDS_FIELD]
    layers = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    shifted = shifted_ids(ids, layers)
    prompt_ids = tokenize(str(target), code_prompts(args.prompts))
    engine = engine_settings(eager=args.eager or not on_cuda())
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
              "engine": {k: v for k, v in engine.items()}, "pair_sizes": sizes,
              "pair": {"target_final_loss": manifest["target_final_loss"], "recipe": manifest["recipe"],
                       "seconds": manifest["seconds"]},
              "command": "python " + " ".join([os.path.relpath(__file__, ROOT), *sys.argv[1:]]),
              "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "seconds": round(time.monotonic() - started, 1)}
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "acceptance.json", json.dumps(result, indent=2) + "\n")
    render(result, args.out)
    return 0


def render(result: dict, out: Path) -> None:
    """Write ``acceptance.png`` (where matplotlib is importable) and ``acceptance.md`` for ``result`` in ``out``."""
    png = chart(result, out / "acceptance.png")
    if png is None:
        print("acceptance: no acceptance.png: matplotlib is not installed here (`kimi setup` installs it)",
              file=sys.stderr)
    write_atomic(out / "acceptance.md", markdown(result, png.name if png else None))
    print(markdown(result, png.name if png else None))


if __name__ == "__main__":
    sys.exit(main())
