"""The exploratory run of ``benchmarks/results/logs/fp8-cpu-widened/README.md``:
the shipped pair, its widened copy and the widened target as block-FP8, each
without and with EAGLE-3 (k = 3), greedy on CPU in bf16, and the controls (the widened and the FP8 target without
speculation, every request alone); writes res.json there. Run from the repository root in the
fork's venv after ``python3 -m kimi models widen /tmp/wide``."""

import json
import time
from pathlib import Path

from kimi.e2e.engine import identical, tokenize, vllm_greedy
from kimi.models.prompts import code_prompts
from kimi.models.quantize import quantize_target

#: Where this run's results are kept.
RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "logs" / "fp8-cpu-widened"

ENGINE = {"dtype": "bfloat16", "max_model_len": 1024, "kv_cache_memory_bytes": 512 << 20, "enforce_eager": True,
          "seed": 0}
#: The control of a target's own batch numerics: every request alone (one sequence per step).
ALONE = {"max_num_seqs": 1}
RUNS = [("shipped", "models/pair/target", None, {}),
        ("shipped-eagle3", "models/pair/target", "models/pair/drafter", {}),
        ("wide", "/tmp/wide/target", None, {}), ("wide-alone", "/tmp/wide/target", None, ALONE),
        ("wide-eagle3", "/tmp/wide/target", "/tmp/wide/drafter", {}),
        ("fp8", "/tmp/fp8cpu/fp8", None, {}), ("fp8-alone", "/tmp/fp8cpu/fp8", None, ALONE),
        ("fp8-eagle3", "/tmp/fp8cpu/fp8", "/tmp/wide/drafter", {})]
COMPARED = [("shipped-eagle3", "shipped"), ("wide", "shipped"), ("wide", "wide-alone"), ("wide-eagle3", "wide"),
            ("wide-eagle3", "wide-alone"), ("fp8", "fp8-alone"), ("fp8-eagle3", "fp8"), ("fp8-eagle3", "fp8-alone"),
            ("fp8", "wide")]


def main() -> None:
    quantize_target(Path("/tmp/wide/target"), Path("/tmp/fp8cpu/fp8"), "fp8-block", force=True)
    prompts = tokenize("models/pair/target", code_prompts(8))
    res, out = {}, {}
    for name, target, drafter, extra in RUNS:
        began = time.monotonic()
        spec = {"method": "eagle3", "model": drafter, "num_speculative_tokens": 3} if drafter else None
        run = vllm_greedy(target, prompts, 48, speculative=spec, **ENGINE, **extra)
        out[name], drafts = run, run.counters.get("num_drafts")
        res[name] = {"seconds": round(time.monotonic() - began),
                     "tau": 1 + run.counters["num_accepted_tokens"] / drafts if drafts else None}
        print(name, res[name], flush=True)
    for a, b in COMPARED:
        res[f"{a} vs {b}"] = identical(out[a], out[b])
    (RESULTS / "res.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
