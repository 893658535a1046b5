"""Patches 0006 and 0008: the reference DeepSeek-V3 target and its MLA EAGLE-3 drafter run on vLLM's CPU backend.

One subprocess (vLLM in-process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) runs every engine and prints JSON:
the attention backend vLLM picked, greedy tokens for code prompts from vLLM and from transformers, the
same prompts with chunked prefill and a prefix-cache hit, with the target as its own draft model
(every draft accepted) and with the MLA-style EAGLE-3 drafter. Upstream 0.26.0 stops at the first
engine with "MLA is not supported on CPU."; without patch 0008 the MLA drafter stops with KeyError 'factor'.
"""

from __future__ import annotations

import textwrap

import pytest

from engine_script import make_reference_models, run_engine_script

pytestmark = pytest.mark.install


_SCRIPT = textwrap.dedent("""
    import json, sys, tempfile
    from kimi.e2e.engine import CPU_ENGINE, hf_greedy, parity, self_draft_model, tokenize, vllm_greedy
    from kimi.models.prompts import code_prompts

    models, tokens = sys.argv[1], 12
    target = models + "/target"
    prompts = code_prompts(4)
    ids = tokenize(target, prompts)
    engine = dict(CPU_ENGINE, enforce_eager=True)
    out = {}

    from vllm import LLM
    llm = LLM(model=target, **engine)
    model = llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
    out["backends"] = sorted({m.attn_backend.get_name() for m in model.modules() if hasattr(m, "attn_backend")})
    llm.llm_engine.engine_core.shutdown()
    del llm

    base = vllm_greedy(target, ids, tokens, top_logits=5, **engine)
    hf_tokens, hf_logits = hf_greedy(target, ids, tokens)
    out["parity"] = parity(base, hf_tokens, hf_logits)
    out["base"] = base.tokens
    # Chunks of 16 tokens (prompts are ~60): chunked prefill with context; the repeated prompt hits the prefix cache.
    chunked = vllm_greedy(target, ids + ids[:1], tokens, max_num_batched_tokens=16, max_num_seqs=2,
                          **dict(engine, max_model_len=512))
    out["chunked"] = chunked.tokens
    spec = {"method": "draft_model", "model": self_draft_model(target, tempfile.mkdtemp()), "num_speculative_tokens": 3}
    run = vllm_greedy(target, ids, tokens, speculative=spec, **engine)
    out["self_draft"] = {"tokens": run.tokens, "counters": run.counters}
    spec = {"method": "eagle3", "model": models + "/drafter-mla", "num_speculative_tokens": 3}
    run = vllm_greedy(target, ids, tokens, speculative=spec, **engine)
    out["eagle3_mla"] = {"tokens": run.tokens, "counters": run.counters}
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    models = make_reference_models(tmp_path_factory.mktemp("models") / "reference")
    return run_engine_script(_SCRIPT, str(models), timeout=1500)


def test_mla_layers_get_the_cpu_mla_backend(runs: dict) -> None:
    assert runs["backends"] == ["CPU_MLA"]


def test_greedy_tokens_match_transformers(runs: dict) -> None:
    parity = runs["parity"]
    assert parity["matching"] == parity["total"] == 4
    assert parity["max_logit_diff"] < 1e-3


def test_chunked_prefill_and_prefix_cache_hit_give_the_same_tokens(runs: dict) -> None:
    assert runs["chunked"] == runs["base"] + runs["base"][:1]


def test_accepted_drafts_keep_the_output(runs: dict) -> None:
    self_draft = runs["self_draft"]
    assert self_draft["tokens"] == runs["base"]
    counters = self_draft["counters"]
    assert counters["num_draft_tokens"] > 0 and counters["num_accepted_tokens"] >= 0.9 * counters["num_draft_tokens"]


def test_mla_drafter_default_rope(runs: dict) -> None:
    eagle = runs["eagle3_mla"]
    assert eagle["tokens"] == runs["base"] and eagle["counters"]["num_drafts"] > 0
