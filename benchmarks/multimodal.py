"""Kimi-K2.5 image requests with EAGLE-3 (issue 18): what the drafter reads at image positions, and lossless.

Run in the fork's venv (``python3 -m kimi setup``; ``python3 -m kimi models make`` for the reference models)::

    .venv/bin/python benchmarks/multimodal.py [--models DIR] [--styles llama mla] [--device cpu|gpu] [--out DIR]

``--device`` (default: gpu when torch sees one): on CPU the engines are float32 and eager (vLLM's V1 model runner
there); on a GPU bfloat16 with vLLM's defaults (V2 model runner, CUDA graphs), the drafter-input checks eager.

For each drafter style beside the reference Kimi-K2.5 wrapper: the rows the drafter read at every image position
against the target's (a whole prefill, prefix-cache hits ending inside and after the image, a chunked prefill
splitting it, a chunk ending right before it), then greedy output with EAGLE-3 (k = 3) against the same engine
without speculation (one image, two images in one request, a batch mixing text-only and image requests, an image
crossing a chunk boundary). Writes ``multimodal.json`` and ``multimodal.md`` to ``--out`` (default
``benchmarks/results``). The checks are ``kimi.bench.multimodal``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from kimi.bench.hardware import describe, device
from kimi.bench.multimodal import drafter_inputs, lossless, sees_target_embeddings, settings, write_results
from kimi.bench.results import stamp

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=ROOT / ".kimi/models/reference")
    parser.add_argument("--styles", nargs="+", choices=("llama", "mla"), default=["llama", "mla"])
    parser.add_argument("--device", choices=("cpu", "gpu"), default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    args = parser.parse_args()
    if not (args.models / "MANIFEST.json").is_file():
        parser.error(f"no reference models in {args.models}: run `python3 -m kimi models make` first")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: its drafter is read
    begin = time.monotonic()
    import vllm

    target = str(args.models / "kimi-k25")
    drafters = {style: str(args.models / f"drafter-{style}") for style in args.styles}
    hardware = device()
    where = args.device or ("gpu" if hardware["cuda"] else "cpu")
    result = {**stamp(sys.argv[0], sys.argv[1:], python="python"), "device": describe(hardware, versions=True),
              "vllm": vllm.__version__, "target": "reference kimi-k25 (random weights, 64 tokens per image)",
              "num_speculative_tokens": 3, "engine": settings(where)}
    inputs = {style: [drafter_inputs(target, folder, chunked=c, device=where) for c in (False, True)]
              for style, folder in drafters.items()}
    result["drafter_sees_target_embeddings"] = all(sees_target_embeddings(runs) for runs in inputs.values())
    result["drafter_inputs"] = inputs
    result["lossless"] = lossless(target, drafters, device=where)
    result["seconds"] = round(time.monotonic() - begin)
    write_results(args.out, result)
    print((args.out / "multimodal.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
