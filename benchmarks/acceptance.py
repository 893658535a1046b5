"""Acceptance of the reference pair served with EAGLE-3 (issues F, O): tau at several k, the wiring guard, and
how plausible the target's completions are.

Run in the fork's venv, on CPU or on a GPU host (engine settings are picked per platform: float32 and eager
on CPU; bf16, 40 % of the GPU's memory and CUDA graphs on CUDA, ``--eager`` to do without them)::

    .venv/bin/python benchmarks/acceptance.py [--models DIR] [--out DIR] [--ks 1 3 5] [-k 3] [--prompts 16]

On a GPU host with the fork installed into an existing vLLM (``kimi install-into``)::

    PYTHONPATH=/tmp/site python3 benchmarks/acceptance.py --out OUT

1. The pair is the shipped one (``models/pair``: target/, drafter/, MANIFEST.json) unless ``--models`` names
   another complete pair (``kimi models train-pair DIR`` makes one); it is never trained here.
2. The target is served with its drafter, greedy, on held-out code prompts (stdlib packages the tokenizer and
   the models never saw), once per k of ``--ks``; tau = 1 + accepted / drafts and per-position acceptance come
   from vLLM's spec-decode metrics.
3. The same drafter with every aux layer id shifted by one (up, or down where the top id is the target's last
   layer: :func:`kimi.train.export.shifted_ids`) is served at ``-k`` (``tau_shifted_ids``): a drafter fed the
   wrong layers must lose acceptance - the guard that the wiring is right.
4. The completions of the ``-k`` run are judged (:mod:`kimi.models.quality`): ``loop_share`` (the second half
   repeats one n-gram to the end) and corpus-level ``distinct_2``; ``heldout_loss`` is the target's, from its
   MANIFEST. ``gates`` checks them, tau and the guard's gap against :data:`kimi_lab.bench.acceptance.GATES`.

Writes ``acceptance.json``, ``acceptance.md`` and ``acceptance.png`` (per-position acceptance with the right and
the shifted ids; where matplotlib is importable) to ``--out`` (default ``benchmarks/results``), each atomically.
The pieces are ``kimi_lab.bench.acceptance``. What it does not show: speed (``perf_vs_upstream.py``), and acceptance
on anything but greedy held-out stdlib code.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))  # kimi_lab alone: docs/benchmarks.md

from kimi.drafter.conventions import IDS_FIELD
from kimi.e2e.engine import tokenize
from kimi.errors import KimiError
from kimi.fork.fsutil import write_atomic
from kimi.models import SHIPPED_PAIR
from kimi.models.prompts import code_prompts
from kimi.models.quality import MIN_TAIL, distinct_n, loop_share
from kimi.train.acceptance import served_acceptance
from kimi.train.engine import engine_settings, on_cuda
from kimi.train.export import shifted_ids, with_ids
from kimi_lab.bench.acceptance import chart, device_name, folder_mb, gates, load_pair, markdown
from kimi_lab.bench.results import stamp, utc_now, write_json

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=SHIPPED_PAIR, help="the pair (default: the shipped models/pair)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 3, 5], help="k of each served run")
    parser.add_argument("-k", type=int, default=3, help="k of the wiring guard and of the judged completions")
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
    if args.tokens < 2 * MIN_TAIL:
        parser.error(f"--tokens must be at least {2 * MIN_TAIL}: shorter completions are never judged loops")
    started = time.monotonic()
    try:
        manifest = load_pair(args.models)
    except KimiError as exc:
        print(f"acceptance: {exc}", file=sys.stderr)
        return 1
    import vllm

    target, drafter = args.models / "target", args.models / "drafter"
    sizes = {"target_mb": round(folder_mb(target), 2), "drafter_mb": round(folder_mb(drafter), 2)}
    print(f"acceptance: pair {args.models}: target {sizes['target_mb']:.1f} MB, drafter {sizes['drafter_mb']:.1f} MB",
          flush=True)
    target_manifest = json.loads(made.read_text()) if (made := target / "MANIFEST.json").is_file() else {}
    ids = json.loads((drafter / "config.json").read_text())[IDS_FIELD]
    layers = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    shifted = shifted_ids(ids, layers)
    prompt_ids = tokenize(str(target), code_prompts(args.prompts))
    engine = engine_settings(eager=args.eager or not on_cuda())
    runs = {}
    for k in sorted({*args.ks, args.k}):
        print(f"acceptance: serving {target} with {drafter} (ids {ids}), k = {k}", flush=True)
        runs[k] = served_acceptance(str(target), str(drafter), prompt_ids, k, args.tokens, engine)
        print(f"acceptance: k = {k}: tau {runs[k]['tau']:.3f}, per position {runs[k]['per_position']}", flush=True)
    ours = runs[args.k]
    with tempfile.TemporaryDirectory(prefix="kimi-shifted-") as tmp:
        moved = with_ids(drafter, shifted, Path(tmp) / "drafter")
        theirs = served_acceptance(str(target), str(moved), prompt_ids, args.k, args.tokens, engine)
    print(f"acceptance: ids {shifted}: tau {theirs['tau']:.3f}", flush=True)
    quality = {"loop_share": loop_share(ours["tokens"]), "distinct_2": distinct_n(ours["tokens"], 2),
               "heldout_loss": target_manifest.get("heldout_loss"), "train_loss": target_manifest.get("train_loss"),
               "completions": decode(target, ours["tokens"][:4])}
    result = {"device": device_name(), "vllm_version": vllm.__version__, "k": args.k, "tau": ours["tau"],
              "per_position": ours["per_position"],
              "by_k": [{key: run[key] for key in ("k", "tau", "per_position", "counters")} for run in runs.values()],
              "tau_shifted_ids": theirs["tau"], "per_position_shifted_ids": theirs["per_position"],
              "aux_layer_ids": ids, "shifted_ids": shifted, "prompts": args.prompts, "tokens": args.tokens,
              "counters": ours["counters"], "counters_shifted_ids": theirs["counters"], "quality": quality,
              "engine": dict(engine), "pair_sizes": sizes,
              "pair": {"folder": str(args.models), "recipe": manifest["recipe"], "seconds": manifest["seconds"],
                       "target_made_on": target_manifest.get("made_on")},
              "command": stamp("benchmarks/acceptance.py", sys.argv[1:], python="python")["command"],
              "date": utc_now("%Y-%m-%d %H:%M UTC"),
              "seconds": round(time.monotonic() - started, 1)}
    result["gates"] = gates(result)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "acceptance.json", result)
    render(result, args.out)
    return 0


def decode(target: Path, completions: list[list[int]]) -> list[str]:
    """``completions`` as text, with the target's tokenizer."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(target / "tokenizer.json"))
    return [tokenizer.decode(ids) for ids in completions]


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
