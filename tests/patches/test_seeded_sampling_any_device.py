"""Patch 0011: a seeded request (temperature > 0) whose prompt is prefilled in chunks runs on vLLM's CPU backend,
and its output does not depend on the chunking (the discarded sample's draw is undone)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from engine_script import make_reference_models, run_engine_script

_SCRIPT = textwrap.dedent("""
    import json, sys
    from vllm import LLM, SamplingParams
    from kimi.e2e.engine import CPU_ENGINE, tokenize
    from kimi.models.prompts import code_prompts

    target = sys.argv[1]
    long = sum(tokenize(target, code_prompts(4)), [])[:300]  # one prompt of 300 tokens
    params = [SamplingParams(temperature=1.0, seed=7 + i, max_tokens=12, ignore_eos=True) for i in range(2)]
    prompts = [{"prompt_token_ids": long}, {"prompt_token_ids": long[:40]}]
    out = {}
    for name, budget in (("chunked", 64), ("whole", 1024)):  # 64: the 300-token prefill takes 5 steps
        llm = LLM(model=target, enable_prefix_caching=False, max_num_batched_tokens=budget,
                  **dict(CPU_ENGINE, enforce_eager=True))
        try:
            out[name] = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm
    print("RESULT " + json.dumps(out))
""")


def test_kept_state_undoes_a_cpu_generators_discarded_draw() -> None:
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    from kimi.hooks.seeded_sampling_any_device import keep_discarded_states, rewind_discarded

    gens = {0: torch.Generator().manual_seed(1), 2: torch.Generator().manual_seed(2)}
    want = torch.empty(50).exponential_(generator=torch.Generator().manual_seed(2))
    kept = keep_discarded_states(gens, np.array([False, True, True]))
    assert sorted(kept) == [2]  # request 1 has no generator (unseeded), request 0 is not discarded
    torch.empty(50).exponential_(generator=gens[2])  # the discarded sample's draw
    torch.empty(50).exponential_(generator=gens[0])
    rewind_discarded(gens, [1, 2], kept)
    assert torch.equal(torch.empty(50).exponential_(generator=gens[2]), want)
    with pytest.raises(RuntimeError, match="keep_discarded_states must run before sampling"):
        rewind_discarded(gens, [0], kept)


@pytest.mark.install
def test_seeded_sampling_with_chunked_prefill_on_cpu(tmp_path: Path) -> None:
    """Without the patch the chunked run dies with "CPU Generator does not use offset"."""
    models = make_reference_models(tmp_path / "reference")
    out = run_engine_script(_SCRIPT, str(models / "target"), timeout=900)
    assert all(len(tokens) == 12 for tokens in out["chunked"] + out["whole"])
    assert out["chunked"] == out["whole"]
