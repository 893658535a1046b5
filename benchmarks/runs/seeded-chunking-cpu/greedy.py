"""Greedy EAGLE-3, each request alone, at a step budget: accepted draft tokens and drafts per prompt;
``.venv/bin/python greedy.py BUDGET`` from the repository root writes ``greedy-BUDGET.json`` into
``benchmarks/results/logs/seeded-chunking-cpu/``."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "lab"))  # kimi_lab alone: docs/benchmarks.md

from vllm import LLM, SamplingParams

from kimi.e2e.engine import spec_metrics
from kimi.models import SHIPPED_PAIR
from kimi.models.prompts import code_prompt_ids
from kimi_lab.bench.torture import PromptPool

#: Where this run's results are kept.
RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "logs" / "seeded-chunking-cpu"


def main() -> None:
    pool = PromptPool([t for ids in code_prompt_ids(SHIPPED_PAIR / "target/tokenizer.json", 48, 400) for t in ids])
    spec = {"method": "eagle3", "model": str(SHIPPED_PAIR / "drafter"), "num_speculative_tokens": 3}
    budget = int(sys.argv[1])
    llm = LLM(str(SHIPPED_PAIR / "target"), dtype="float32", max_model_len=512, kv_cache_memory_bytes=64 << 20,
              enforce_eager=True, seed=0, max_num_batched_tokens=budget, speculative_config=spec,
              disable_log_stats=False)
    rows = []
    for n, i in ((80, 5), (100, 7), (130, 9), (70, 11)):
        before = spec_metrics(llm.get_metrics())
        done = llm.generate([{"prompt_token_ids": pool.ids(n, i)}],
                            SamplingParams(temperature=0, max_tokens=48, ignore_eos=True), use_tqdm=False)
        after = spec_metrics(llm.get_metrics())
        rows.append({"n": n, "accepted": after["num_accepted_tokens"] - before["num_accepted_tokens"],
                     "drafts": after["num_drafts"] - before["num_drafts"],
                     "tokens": list(done[0].outputs[0].token_ids)})
    (RESULTS / f"greedy-{budget}.json").write_text(json.dumps(rows))


if __name__ == "__main__":
    main()
