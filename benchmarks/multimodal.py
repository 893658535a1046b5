"""Kimi-K2.5 image requests with EAGLE-3 (issue 18): what the drafter reads at image positions, and lossless.

Run in the fork's venv (``python3 -m kimi setup``; ``python3 -m kimi models make`` for the reference models)::

    .venv/bin/python benchmarks/multimodal.py [--models DIR] [--styles llama mla] [--device cpu|gpu] [--out DIR]

``--device`` (default: gpu when torch sees one): on CPU the engines are float32 and eager (vLLM's V1 model runner
there); on a GPU bfloat16 with vLLM's defaults (V2 model runner, CUDA graphs), the drafter-input checks eager. The
same for ``--tau``.

For each drafter style beside the reference Kimi-K2.5 wrapper: the rows the drafter read at every image position
against the target's (a whole prefill, prefix-cache hits ending inside and after the image, a chunked prefill
splitting it, a chunk ending right before it), then greedy output with EAGLE-3 (k = 3) against the same engine
without speculation (one image, two images in one request, a batch mixing text-only and image requests, an image
crossing a chunk boundary). Writes ``multimodal.json`` and ``multimodal.md`` to ``--out`` (default
``benchmarks/results``). The checks are ``kimi_lab.bench.multimodal``.

``--tau`` measures instead the acceptance on image prompts with the target's image rows passed to the drafter
against the placeholder's (``kimi_lab.bench.image_acceptance``): the shipped pair's target wrapped with the trained
vision tower (``models/pair-vision``, assembled as ``kimi models pair-k25`` does) and ``models/pair/drafter``, k = 3,
each mode in its own process; it adds the section ``image_acceptance`` to the existing results and keeps the rest
(and a run of the checks keeps an existing ``image_acceptance``). Those models are fixed: ``--models`` and
``--styles`` (the random-weight reference models and their drafters, on which acceptance means nothing) are refused
with ``--tau``, and ``--snippets`` without it::

    .venv/bin/python benchmarks/multimodal.py --tau [--device cpu|gpu] [--snippets N] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))  # kimi_lab alone: docs/benchmarks.md

from kimi.cli.options import positive_int
from kimi.errors import KimiError
from kimi.fork.fsutil import read_json_object
from kimi_lab.bench.hardware import describe, device
from kimi_lab.bench.multimodal import drafter_inputs, lossless, sees_target_embeddings, settings, write_results
from kimi_lab.bench.results import stamp

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=None,
                        help="the reference models of the checks (default: .kimi/models/reference)")
    parser.add_argument("--styles", nargs="+", choices=("llama", "mla"), default=None,
                        help="the checks' drafter styles (default: both)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default=None,
                        help="cpu (float32, eager) or gpu (bfloat16); default: gpu when torch sees one")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    parser.add_argument("--tau", action="store_true",
                        help="measure tau on image prompts, fork against upstream (the trained pair-k25 wrapper)")
    parser.add_argument("--snippets", type=positive_int, default=None,
                        help="--tau: the first N of the tower's training snippets (default: all)")
    args = parser.parse_args()
    if args.tau and (args.models or args.styles):
        parser.error("--tau measures the trained pair-k25 (models/pair/target with the tower of models/pair-vision) "
                     "with models/pair/drafter, not the reference models: leave out --models and --styles")
    if args.snippets and not args.tau:
        parser.error("--snippets applies to --tau only")
    args.models, args.styles = args.models or ROOT / ".kimi/models/reference", args.styles or ["llama", "mla"]
    hardware = device()
    args.device = args.device or ("gpu" if hardware["cuda"] else "cpu")
    if args.device == "gpu" and not hardware["cuda"]:
        parser.error("--device gpu: torch sees no GPU here; leave --device out or pass --device cpu")
    try:
        args.earlier = earlier(args.out)  # before minutes of engines: a bad --out fails now
    except KimiError as exc:
        parser.error(str(exc))
    if args.tau:
        try:
            return tau(args, hardware)
        except KimiError as exc:
            parser.exit(2, f"error: {exc}\n")
    if not (args.models / "kimi-k25" / "config.json").is_file():
        parser.error(f"no reference models in {args.models} (no kimi-k25/config.json): run "
                     "`python3 -m kimi models make` first")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: its drafter is read
    begin = time.monotonic()
    import vllm

    target = str(args.models / "kimi-k25")
    drafters = {style: str(args.models / f"drafter-{style}") for style in args.styles}
    where = args.device
    result = {**stamp(sys.argv[0], sys.argv[1:], python="python"), "device": describe(hardware, versions=True),
              "vllm": vllm.__version__, "target": "reference kimi-k25 (random weights, 64 tokens per image)",
              "num_speculative_tokens": 3, "engine": settings(where)}
    inputs = {style: [drafter_inputs(target, folder, chunked=c, device=where) for c in (False, True)]
              for style, folder in drafters.items()}
    result["drafter_sees_target_embeddings"] = all(sees_target_embeddings(runs) for runs in inputs.values())
    result["drafter_inputs"] = inputs
    result["lossless"] = lossless(target, drafters, device=where)
    result["seconds"] = round(time.monotonic() - begin)
    kept = args.earlier.get("image_acceptance")
    write_results(args.out, {**result, **({"image_acceptance": kept} if kept else {})})
    print((args.out / "multimodal.md").read_text())
    return 0


def earlier(out: Path) -> dict:
    """``out``'s multimodal.json as an earlier run left it ({} when there is none), after making ``out``.

    Raises:
        KimiError: ``out`` cannot be made or written in, or its multimodal.json is not a JSON object.
    """
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KimiError(f"--out {out}: cannot make it ({exc.strerror})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise KimiError(f"--out {out}: this user cannot write in it")
    try:
        return read_json_object(out / "multimodal.json") or {}
    except ValueError as exc:
        raise KimiError(f"{exc}: move it away or pass another --out") from None


def tau(args: argparse.Namespace, hardware: dict) -> int:
    """``--tau``: the image-acceptance section, merged into ``--out``'s existing multimodal.json."""
    from kimi.models import SHIPPED_PAIR
    from kimi.models.pair_k25 import SHIPPED_VISION, assemble, load_vision
    from kimi_lab.bench.image_acceptance import measure_modes, summary

    begin = time.monotonic()
    work = ROOT / ".kimi/image-acceptance"
    assemble(work / "pair-k25", SHIPPED_PAIR, SHIPPED_VISION, force=True)
    texts = load_vision(SHIPPED_VISION)[1]["snippets"][:args.snippets]
    runs = measure_modes(work / "pair-k25/model", SHIPPED_PAIR / "drafter", SHIPPED_VISION, texts, work,
                         device=args.device)
    import vllm

    section = {**stamp(sys.argv[0], sys.argv[1:], python="python"), "device": describe(hardware, versions=True),
               "vllm": vllm.__version__, "target": "pair-k25: models/pair/target + the trained tower of "
               "models/pair-vision", "drafter": "models/pair/drafter", "num_speculative_tokens": 3,
               "snippets": len(texts), **summary(runs), "seconds": round(time.monotonic() - begin)}
    write_results(args.out, {**args.earlier, "image_acceptance": section})
    print((args.out / "multimodal.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
