"""Seeded sampling, each request alone, at a step budget: ``.venv/bin/python run.py spec|nospec BUDGET`` from the
repository root writes ``MODE-BUDGET.json`` into
``benchmarks/results/logs/seeded-chunking-cpu/`` (see the README there)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "lab"))  # kimi_lab alone: docs/benchmarks.md

from vllm import LLM, SamplingParams

from kimi.models import SHIPPED_PAIR
from kimi.models.prompts import code_prompt_ids
from kimi_lab.bench.torture import PromptPool

#: Where this run's results are kept.
RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "logs" / "seeded-chunking-cpu"


def main() -> None:
    pool = PromptPool([t for ids in code_prompt_ids(SHIPPED_PAIR / "target/tokenizer.json", 48, 400) for t in ids])
    spec = {"method": "eagle3", "model": str(SHIPPED_PAIR / "drafter"), "num_speculative_tokens": 3}
    mode, budget = sys.argv[1], int(sys.argv[2])
    llm = LLM(str(SHIPPED_PAIR / "target"), dtype="float32", max_model_len=512, kv_cache_memory_bytes=64 << 20,
              enforce_eager=True, seed=0, max_num_batched_tokens=budget,
              speculative_config=spec if mode == "spec" else None)
    out = []
    for prompt in (pool.ids(300, 3), pool.ids(80, 5)):  # one at a time: no batch effects
        for params in (SamplingParams(temperature=0.8, seed=11, max_tokens=48, ignore_eos=True),
                       SamplingParams(temperature=1.0, top_k=20, seed=13, max_tokens=48, ignore_eos=True)):
            done = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
            out.append(list(done[0].outputs[0].token_ids))
    (RESULTS / f"{mode}-{budget}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
