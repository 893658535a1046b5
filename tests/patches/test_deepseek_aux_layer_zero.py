"""Patch 0010: an EAGLE-3 drafter that reads aux layer 0 (the embedding output) runs on a DeepSeek-V3 target.

vLLM's own convention allows ids ``0 .. L-1`` and its Llama backbone handles 0, but upstream 0.26.0's
DeepSeek-V2/V3 forward computes ``hidden_states + residual`` before layer 0, where there is no residual
yet: the engine dies with ``TypeError: unsupported operand type(s) for +: 'Tensor' and 'NoneType'`` in its
first forward, after the target's weights have loaded. One subprocess (CPU, vLLM in-process) serves the
reference target with its Llama-style drafter rewired to ids ``[0, 3, 6]`` and compares with the target
alone.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from engine_script import make_reference_models, run_engine_script

pytestmark = pytest.mark.install


_SCRIPT = textwrap.dedent("""
    import json, sys
    from kimi.e2e.engine import CPU_ENGINE, tokenize, vllm_greedy
    from kimi.models.prompts import code_prompts

    target, drafter = sys.argv[1], sys.argv[2]
    ids = tokenize(target, code_prompts(2))
    engine = dict(CPU_ENGINE, enforce_eager=True)
    base = vllm_greedy(target, ids, 8, **engine)
    spec = {"method": "eagle3", "model": drafter, "num_speculative_tokens": 2}
    run = vllm_greedy(target, ids, 8, speculative=spec, **engine)
    print("RESULT " + json.dumps({"base": base.tokens, "eagle3": run.tokens, "counters": run.counters}))
""")


def test_drafter_reading_layer_zero_runs(tmp_path: Path) -> None:
    models = make_reference_models(tmp_path / "reference")
    drafter = tmp_path / "drafter-layer0"
    shutil.copytree(models / "drafter-llama", drafter)
    config = json.loads((drafter / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [0, 3, 6]
    (drafter / "config.json").write_text(json.dumps(config))
    out = run_engine_script(_SCRIPT, str(models / "target"), str(drafter))
    assert out["counters"]["num_drafts"] > 0
    assert out["eagle3"] == out["base"]
