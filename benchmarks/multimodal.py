"""Kimi-K2.5 image requests with EAGLE-3 on CPU (issue 18): what the drafter reads at image positions, and lossless.

Run in the fork's venv (``python3 -m kimi setup``; ``python3 -m kimi models make`` for the reference models)::

    .venv/bin/python benchmarks/multimodal.py [--models DIR] [--styles llama mla] [--out DIR]

For each drafter style beside the reference Kimi-K2.5 wrapper: the rows the drafter read at every image position
against the target's (a whole prefill, prefix-cache hits ending inside and after the image, a chunked prefill
splitting it, a chunk ending right before it), then greedy output with EAGLE-3 (k = 3) against the same engine
without speculation (one image, two images in one request, a batch mixing text-only and image requests, an image
crossing a chunk boundary). Writes ``multimodal.json`` and ``multimodal.md`` to ``--out`` (default
``benchmarks/results``). The checks are ``kimi.bench.multimodal``.

``--tau`` measures instead the acceptance on image prompts with the target's image rows passed to the drafter
against the placeholder's (``kimi.bench.image_acceptance``): the shipped pair's target wrapped with the trained
vision tower (``models/pair-vision``, assembled as ``kimi models pair-k25`` does) and ``models/pair/drafter``, k = 3,
each mode in its own process; it adds the section ``image_acceptance`` to the existing results and keeps the rest::

    .venv/bin/python benchmarks/multimodal.py --tau [--device cpu] [--snippets N] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from kimi.bench.hardware import describe, device
from kimi.bench.multimodal import drafter_inputs, lossless, sees_target_embeddings, write_results
from kimi.bench.results import stamp
from kimi.cli.options import positive_int

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=ROOT / ".kimi/models/reference")
    parser.add_argument("--styles", nargs="+", choices=("llama", "mla"), default=["llama", "mla"])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    parser.add_argument("--tau", action="store_true",
                        help="measure tau on image prompts, fork against upstream (the trained pair-k25 wrapper)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="engine settings of --tau: cpu (float32, eager) or cuda (bf16); default: %(default)s")
    parser.add_argument("--snippets", type=positive_int, default=None,
                        help="--tau: the first N of the tower's training snippets (default: all)")
    args = parser.parse_args()
    if args.tau:
        return tau(args)
    if not (args.models / "MANIFEST.json").is_file():
        parser.error(f"no reference models in {args.models}: run `python3 -m kimi models make` first")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: its drafter is read
    begin = time.monotonic()
    import vllm

    target = str(args.models / "kimi-k25")
    drafters = {style: str(args.models / f"drafter-{style}") for style in args.styles}
    result = {**stamp(sys.argv[0], sys.argv[1:], python="python"), "device": describe(device(), versions=True),
              "vllm": vllm.__version__, "target": "reference kimi-k25 (random weights, 64 tokens per image)",
              "num_speculative_tokens": 3}
    inputs = {style: [drafter_inputs(target, folder, chunked=c) for c in (False, True)]
              for style, folder in drafters.items()}
    result["drafter_sees_target_embeddings"] = all(sees_target_embeddings(runs) for runs in inputs.values())
    result["drafter_inputs"] = inputs
    result["lossless"] = lossless(target, drafters)
    result["seconds"] = round(time.monotonic() - begin)
    write_results(args.out, result)
    print((args.out / "multimodal.md").read_text())
    return 0


def tau(args: argparse.Namespace) -> int:
    """``--tau``: the image-acceptance section, merged into ``--out``'s existing multimodal.json."""
    import json

    from kimi.bench.image_acceptance import measure_modes, summary
    from kimi.models import SHIPPED_PAIR
    from kimi.models.pair_k25 import SHIPPED_VISION, assemble, load_vision

    begin = time.monotonic()
    work = ROOT / ".kimi/work/image-acceptance"
    assemble(work / "pair-k25", SHIPPED_PAIR, SHIPPED_VISION, force=True)
    texts = load_vision(SHIPPED_VISION)[1]["snippets"][:args.snippets]
    runs = measure_modes(work / "pair-k25/model", SHIPPED_PAIR / "drafter", SHIPPED_VISION, texts, work,
                         device=args.device)
    import vllm

    section = {**stamp(sys.argv[0], sys.argv[1:], python="python"), "device": describe(device(), versions=True),
               "vllm": vllm.__version__, "target": "pair-k25: models/pair/target + the trained tower of "
               "models/pair-vision", "drafter": "models/pair/drafter", "num_speculative_tokens": 3,
               "snippets": len(texts), **summary(runs), "seconds": round(time.monotonic() - begin)}
    path = args.out / "multimodal.json"
    result = json.loads(path.read_text()) if path.is_file() else {}
    result["image_acceptance"] = section
    write_results(args.out, result)
    print((args.out / "multimodal.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
