"""Patch 0009: greedy EAGLE-3 drafts from the draft vocabulary give upstream's ids, for both drafter styles.

One subprocess loads the reference target with each reference drafter on CPU (vLLM in-process) and compares
the proposer's greedy hook with upstream's ``compute_logits(...).argmax(-1)`` (the full-vocabulary scatter)
on random hidden states (``KIMI_DRAFT_GREEDY=auto``), then loads once more with the default, where the hook
is on. Without the patch the proposer has no ``draft_greedy`` attribute.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from engine_script import make_reference_models, run_engine_script

pytestmark = pytest.mark.install


_SCRIPT = textwrap.dedent("""
    import json, os, sys, torch
    from vllm import LLM
    models, out = sys.argv[1], {}
    def proposer(style):
        llm = LLM(model=models + "/target", dtype="float32", max_model_len=256, enforce_eager=True,
                  kv_cache_memory_bytes=128 << 20, speculative_config={
                      "method": "eagle3", "model": f"{models}/drafter-{style}", "num_speculative_tokens": 2})
        return llm, llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter
    for style in ("llama", "mla"):
        llm, prop = proposer(style)
        hidden = torch.randn(97, 256, generator=torch.Generator().manual_seed(0))
        hook = prop.draft_greedy is not None
        same = hook and torch.equal(prop.draft_greedy(hidden), prop.model.compute_logits(hidden).argmax(-1))
        out[style] = {"hook": hook, "same_ids": bool(same)}
        llm.llm_engine.engine_core.shutdown()
        del llm, prop
    del os.environ["KIMI_DRAFT_GREEDY"]
    llm, prop = proposer("llama")
    out["default_hook"] = prop.draft_greedy is not None
    print("RESULT " + json.dumps(out))
""")


def test_greedy_drafts_equal_upstream_ids(tmp_path: Path) -> None:
    models = make_reference_models(tmp_path / "reference")
    out = run_engine_script(_SCRIPT, str(models), env={"KIMI_DRAFT_GREEDY": "auto"})
    assert out["llama"] == out["mla"] == {"hook": True, "same_ids": True}
    assert out["default_hook"] is True  # on by default: see kimi/drafter/greedy.py


def test_unknown_mode_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from kimi.drafter.greedy import draft_greedy

    monkeypatch.setenv("KIMI_DRAFT_GREEDY", "fast")
    with pytest.raises(ValueError, match="expected one of auto, torch, upstream"):
        draft_greedy(object())
