"""Patch 0013 (v0.26 line; absorbed in 0.32.0): a DeepSeek-V3-architecture target served with a Llama-style EAGLE-3
drafter takes vLLM's V2 model runner; with an MLA drafter (not yet measured on V2) or without speculation it keeps
upstream's choice (V1). vLLM 0.32.0 takes V2 for every model where triton is present
(``VllmConfig.use_v2_model_runner``), so on the mainline the same test, without the patch, shows V2 for all three -
the patch's Absorbed-check.

Upstream 0.26.0 picks V2 by default only for the architectures in ``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES``
(``DeepseekV2ForCausalLM`` among them) or for dense models: ``DeepseekV3ForCausalLM`` (DeepSeek-V3/R1,
Kimi-K2), a MoE model of the same code, stays on V1, whose drafter steps run as PIECEWISE CUDA graphs plus
Python. One subprocess builds the engine configs of the reference target (CPU, no weights loaded) with each
reference drafter and without speculation, and reads the runner choice; triton is then declared present, as
on a GPU host, to see the final choice (the CPU build has no triton, so V1 stays there).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from conftest import installed_line
from engine_script import make_reference_models, run_engine_script

# V1 against V2 model runner choice (VllmConfig.use_v2_model_runner): vLLM 0.34.0 removed the V1 runner and the choice
pytestmark = [pytest.mark.install, pytest.mark.line("v0.32", "v0.26")]


_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import vllm.config.vllm as config_module
    from vllm.engine.arg_utils import EngineArgs
    models, out = sys.argv[1], {}
    def config(drafter=None, method="eagle3"):
        spec = drafter and {"method": method, "model": f"{models}/{drafter}", "num_speculative_tokens": 2}
        return EngineArgs(model=models + "/target", dtype="float32", max_model_len=256,
                          speculative_config=spec).create_engine_config()
    configs = {"eagle3-llama": config("drafter-llama"), "eagle3-mla": config("drafter-mla"), "none": config()}
    out["cpu"] = {name: c.use_v2_model_runner for name, c in configs.items()}
    config_module.HAS_TRITON = True
    out["triton"] = {name: c.use_v2_model_runner for name, c in configs.items()}
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"  # the user's choice still wins
    out["env_v1"] = configs["eagle3-llama"].use_v2_model_runner
    print("RESULT " + json.dumps(out))
""")


def test_deepseek_v3_eagle3_takes_v2_runner(tmp_path: Path) -> None:
    models = make_reference_models(tmp_path / "reference")
    out = run_engine_script(_SCRIPT, str(models))
    if installed_line() == "v0.26":
        assert out["triton"] == {"eagle3-llama": True, "eagle3-mla": False, "none": False}
        # no triton (this CPU build): V1 for all, as upstream decides
        assert out["cpu"] == {"eagle3-llama": False, "eagle3-mla": False, "none": False}
    else:  # 0.32.0 without the patch: upstream's own choice is V2 for every model
        assert out["triton"] == {"eagle3-llama": True, "eagle3-mla": True, "none": True}
    assert out["env_v1"] is False
