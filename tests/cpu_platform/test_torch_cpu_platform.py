"""The torch-only CPU platform on vLLM 0.34.0 (the mainline, patches 0023 and 0024): chosen by vLLM's
platform plugin entry point, refusing what it cannot run before any weights load, and serving EAGLE-3
losslessly on Model Runner V2 with both drafter styles.

Part of the mainline's suite (``python3 -m kimi test``); the ``line("mainline")`` marker skips it elsewhere.
Engines run in child processes (vLLM's platform and distributed state are per process).
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine_script import make_reference_models, run_engine_script

ROOT = Path(__file__).resolve().parents[2]
PAIR = ROOT / "models" / "pair"

pytestmark = pytest.mark.line("mainline")


def _run(code: str, env: dict[str, str | None] | None = None, timeout: int = 1200) -> dict:
    return run_engine_script(textwrap.dedent(code), env=env, timeout=timeout)


def test_the_plugin_chooses_the_platform_and_triton_interprets():
    found = _run("""
        import json, os
        import vllm.platforms as platforms
        from vllm.triton_utils import HAS_TRITON
        print("RESULT", json.dumps({"platform": type(platforms.current_platform).__name__, "has_triton": HAS_TRITON,
                                    "interpret": os.environ.get("TRITON_INTERPRET")}))
    """, env={"TRITON_INTERPRET": None})
    assert found == {"platform": "TorchCpuPlatform", "has_triton": True, "interpret": "1"}


def _engine_config(extra: str = "", env: dict[str, str | None] | None = None) -> tuple[dict, float]:
    """Build the engine config of the pair's target with ``extra`` EngineArgs keywords in a child: its error or
    its custom ops, and the seconds it took (no weights are read: the config alone)."""
    began = time.monotonic()
    found = _run(f"""
        import json
        from vllm.engine.arg_utils import EngineArgs
        try:
            config = EngineArgs(model="{PAIR / 'target'}", {extra or 'dtype="float32"'}).create_engine_config()
        except ValueError as exc:
            print("RESULT", json.dumps({{"refused": str(exc)}}))
        else:
            print("RESULT", json.dumps({{"custom_ops": config.compilation_config.custom_ops,
                                         "eager": config.model_config.enforce_eager,
                                         "mode": int(config.compilation_config.mode)}}))
    """, env=env, timeout=300)
    return found, time.monotonic() - began


def test_a_quantized_kv_cache_is_refused_with_the_fix_before_any_load():
    found, seconds = _engine_config('dtype="float32", kv_cache_dtype="fp8"')
    assert "--kv-cache-dtype fp8" in found["refused"] and "leave it at auto" in found["refused"]
    assert seconds < 120


@pytest.mark.parametrize(("variable", "value", "fix"), [("TRITON_INTERPRET", "0", "TRITON_INTERPRET=1"),
                                                        ("KIMI_CPU_KERNELS", "fast", "torch or interpreter")])
def test_a_bad_environment_is_refused_with_the_fix(variable, value, fix):
    found, _ = _engine_config(env={variable: value})
    assert fix in found["refused"]


@pytest.mark.parametrize(("extra", "fix"), [
    ('dtype="bfloat16"', "use --dtype float32"),
    ('dtype="float32", attention_backend="FLASH_ATTN"', "--attention-backend FLASH_ATTN"),
])
def test_what_the_torch_code_does_not_run_is_refused_before_load(extra, fix):
    found, _ = _engine_config(extra)
    assert fix in found["refused"]


def test_the_plain_pair_config_runs_eager_with_torch_custom_ops():
    """No --enforce-eager given: the platform turns torch.compile off (its torch ops have no fake versions)."""
    found, _ = _engine_config()
    assert found == {"custom_ops": ["none"], "eager": True, "mode": 0}


def test_quantized_models_are_refused_by_role(monkeypatch):
    from kimi.cpu_platform.platform import refusals

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("KIMI_CPU_KERNELS", raising=False)
    config = SimpleNamespace(cache_config=SimpleNamespace(cache_dtype="auto"),
                             parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1),
                             model_config=SimpleNamespace(quantization=None),
                             speculative_config=SimpleNamespace(draft_model_config=SimpleNamespace(quantization="fp8")))
    found = refusals(config)
    assert len(found) == 1 and "the draft model is quantized (fp8)" in found[0]


LOSSLESS = """
    import json
    from kimi.e2e.engine import tokenize, vllm_greedy
    from kimi.e2e.presets import CPU_EAGER
    from kimi.models.prompts import code_prompts
    ids = tokenize("{tokenizer}", code_prompts(3))
    plain = vllm_greedy("{target}", ids, 24, None, **CPU_EAGER)
    spec = {{"method": "eagle3", "model": "{drafter}", "num_speculative_tokens": 3}}
    eagle = vllm_greedy("{target}", ids, 24, spec, **CPU_EAGER)
    print("RESULT", json.dumps({{"same": plain.tokens == eagle.tokens, "lengths": [len(t) for t in eagle.tokens],
                                 "counters": eagle.counters}}))
"""


def test_eagle3_on_the_v2_runner_is_lossless_and_accepts_drafts():
    target = PAIR / "target"
    found = _run(LOSSLESS.format(tokenizer=target, target=target, drafter=PAIR / "drafter"))
    assert found["same"], "EAGLE-3 changed greedy output"
    assert found["lengths"] == [24, 24, 24]
    assert found["counters"]["num_accepted_tokens"] > 0, found["counters"]


def test_the_mla_drafter_runs_lossless(tmp_path_factory):
    """The kimi_k2 MLA drafter (patch 0005) beside the MLA target: drafts made and verified, output unchanged
    (the reference drafter has random weights, so drafts are seldom accepted)."""
    models = make_reference_models(tmp_path_factory.mktemp("next") / "reference")
    target = models / "target"
    found = _run(LOSSLESS.format(tokenizer=target, target=target, drafter=models / "drafter-mla"))
    assert found["same"] and found["lengths"] == [24, 24, 24]
    assert found["counters"]["num_drafts"] > 0


def test_seeded_sampling_with_eagle3_is_reproducible_in_any_batch_order():
    """temperature 0.8 with a seed per request: the Gumbel and rejection-sampler overrides give each request the
    same tokens whatever its place in the batch."""
    found = _run(f"""
        import json
        from vllm import LLM, SamplingParams
        from kimi.e2e.presets import CPU_EAGER
        spec = {{"method": "eagle3", "model": "{PAIR / 'drafter'}", "num_speculative_tokens": 3}}
        llm = LLM(model="{PAIR / 'target'}", speculative_config=spec, **CPU_EAGER)
        params = [SamplingParams(temperature=0.8, seed=seed, max_tokens=24, ignore_eos=True) for seed in (1, 2, 3)]
        prompts = ["def fibonacci(n):\\n", "import os\\n\\ndef walk(path):\\n", "class Stack:\\n"]
        first = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        again = [o.outputs[0].token_ids for o in llm.generate(prompts[::-1], params[::-1], use_tqdm=False)][::-1]
        print("RESULT", json.dumps({{"same": first == again, "distinct": len({{tuple(t) for t in first}})}}))
    """)
    assert found == {"same": True, "distinct": 3}
