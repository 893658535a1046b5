"""Patch 0009: greedy EAGLE-3 drafts from the draft vocabulary give upstream's ids, for both drafter styles.

One subprocess loads the reference target with each reference drafter on CPU (vLLM in-process) and compares
the proposer's greedy hook with upstream's ``compute_logits(...).argmax(-1)`` (the full-vocabulary scatter)
on random hidden states (``KIMI_DRAFT_GREEDY=auto``), then loads once more with the default, where the hook
is on. Without the patch the proposer has no ``draft_greedy`` attribute. A third drafter has no ``lm_head`` in
its checkpoint: the proposer then puts the target's head on it after loading (``_maybe_share_lm_head``), and a
hook that kept the drafter's first head gave other ids than upstream's on every row (seen on the H200 with
the Kimi slice's dummy weights: 58368 of 58368 draft rows).
"""

from __future__ import annotations

import shutil
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
    for style in ("llama", "mla", "llama-nohead"):
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


def _without_lm_head(drafter: Path, dest: Path) -> None:
    from safetensors.torch import load_file, save_file

    shutil.copytree(drafter, dest)
    weights = load_file(dest / "model.safetensors")
    del weights["lm_head.weight"]
    save_file(weights, dest / "model.safetensors")


def test_greedy_drafts_equal_upstream_ids(tmp_path: Path) -> None:
    models = make_reference_models(tmp_path / "reference")
    _without_lm_head(models / "drafter-llama", models / "drafter-llama-nohead")
    out = run_engine_script(_SCRIPT, str(models), env={"KIMI_DRAFT_GREEDY": "auto"})
    assert out["llama"] == out["mla"] == out["llama-nohead"] == {"hook": True, "same_ids": True}
    assert out["default_hook"] is True  # on by default: see kimi/drafter/greedy.py


def test_unknown_mode_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from kimi.drafter.greedy import draft_greedy

    monkeypatch.setenv("KIMI_DRAFT_GREEDY", "fast")
    with pytest.raises(ValueError, match="expected one of auto, torch, upstream"):
        draft_greedy(object())
