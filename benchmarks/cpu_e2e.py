"""The fork's main job on a machine without a GPU: parity, lossless EAGLE-3 and `vllm serve` (issue B).

Run in the fork's venv (``python3 -m kimi setup`` makes it)::

    .venv/bin/python benchmarks/cpu_e2e.py [--models DIR] [--prompts 16] [--tokens 32]

1. Parity: greedy tokens of vLLM on CPU (CPU_MLA backend) for the reference DeepSeek-V3 target against
   transformers' DeepSeek-V3 on the same checkpoint, float32, and the largest raw-logit difference.
2. Lossless: greedy output with EAGLE-3 (Llama-style and MLA-style drafters, k = 1 and 3) against the
   output without speculation. The reference drafters have random weights and are rarely accepted, so
   a run with the target as its own draft model (k = 3) is added to exercise accepted tokens. Then the
   Kimi-K2.5 wrapper with text and image requests, both drafter styles at k = 3 (``kimi_lab.bench.multimodal``).
3. Serve: ``vllm serve`` with the MLA drafter, 8 concurrent completion requests, then bad input (a prompt
   longer than max_model_len, a malformed JSON body) and one more request; a drafter whose hidden size
   does not match must stop the start-up with the fix named.

Writes ``cpu_e2e.json`` and ``cpu_e2e.md`` to ``--out`` (default ``benchmarks/results``) and prints a table.
The checks are ``kimi_lab.bench.cpu_e2e``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))  # kimi_lab alone: docs/benchmarks.md

from kimi.e2e.engine import CPU_ENGINE, tokenize
from kimi.models.prompts import code_prompts
from kimi_lab.bench.cpu_e2e import (
    run_k25_lossless,
    run_lossless,
    run_parity,
    run_serve,
    run_wrong_drafter,
    write_results,
)
from kimi_lab.bench.hardware import cpu_name
from kimi_lab.bench.results import stamp

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=ROOT / ".kimi/models/reference")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    args = parser.parse_args()
    if not (args.models / "MANIFEST.json").is_file():
        parser.error(f"no reference models in {args.models}: run `python3 -m kimi models make` first")
    begin = time.monotonic()
    prompts = code_prompts(args.prompts)
    target = str(args.models / "target")
    prompt_ids = tokenize(target, prompts)
    logs = args.out / "logs"
    import torch
    import vllm

    result = {**stamp(sys.argv[0], sys.argv[1:], python="python"), "cpu": cpu_name(), "dtype": CPU_ENGINE["dtype"],
              "versions": {"vllm": vllm.__version__, "torch": torch.__version__, "python": sys.version.split()[0]}}
    result["hf_parity"] = run_parity(target, prompt_ids, args.tokens)
    result["lossless"], result["spec_counters"] = run_lossless(args.models, prompt_ids, args.tokens)
    result["k25_lossless"] = run_k25_lossless(args.models)
    result["serve"] = run_serve(args.models, prompts, logs)
    result["wrong_drafter"] = run_wrong_drafter(args.models, logs)
    result["seconds"] = round(time.monotonic() - begin)
    write_results(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
