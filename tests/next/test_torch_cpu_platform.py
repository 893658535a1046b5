"""The torch-only CPU platform on vLLM 0.34.0 (the next line, patches 0023 and 0024): chosen by vLLM's
platform plugin entry point, refusing what it cannot run before any weights load, and serving the shipped
pair with EAGLE-3 losslessly on Model Runner V2.

Run with ``python3 -m kimi test --line next``; elsewhere the ``line("next")`` marker skips it. Engines run in
child processes (vLLM's platform and distributed state are per process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAIR = ROOT / "models" / "pair"

pytestmark = pytest.mark.line("next")


def _child(code: str, env: dict[str, str | None] | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run ``code`` in a child python; ``env`` entries override this process's (None: removed)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_ENABLE_V1_MULTIPROCESSING": "0", **(env or {})}
    full_env = {key: value for key, value in full_env.items() if value is not None}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=ROOT)


def _last_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])


def test_the_plugin_chooses_the_platform_and_triton_interprets():
    found = _last_json(_child("""
        import json, os
        import vllm.platforms as platforms
        from vllm.triton_utils import HAS_TRITON
        import vllm._custom_ops  # noqa: F401  (imports kernels modules; must not need vllm._C)
        print(json.dumps({"platform": type(platforms.current_platform).__name__, "has_triton": HAS_TRITON,
                          "interpret": os.environ.get("TRITON_INTERPRET")}))
    """, env={"TRITON_INTERPRET": None}))
    assert found == {"platform": "TorchCpuPlatform", "has_triton": True, "interpret": "1"}


def _engine_config_error(extra: str, env: dict[str, str] | None = None) -> tuple[str, float]:
    """Build the engine config of the pair's target with ``extra`` EngineArgs keywords in a child; returns the
    error message and the seconds it took (nothing is loaded: the config alone)."""
    began = time.monotonic()
    proc = _child(f"""
        from vllm.engine.arg_utils import EngineArgs
        try:
            EngineArgs(model="{PAIR / 'target'}", dtype="float32", enforce_eager=True, {extra}).create_engine_config()
        except ValueError as exc:
            print("REFUSED", exc)
        else:
            print("ACCEPTED")
    """, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout, time.monotonic() - began


def test_a_quantized_kv_cache_is_refused_with_the_fix_before_any_load():
    out, seconds = _engine_config_error('kv_cache_dtype="fp8"')
    assert "REFUSED" in out and "--kv-cache-dtype fp8" in out and "leave it at auto" in out
    assert seconds < 120


def test_triton_interpret_off_is_refused_with_the_fix():
    out, _ = _engine_config_error("", env={"TRITON_INTERPRET": "0"})
    assert "REFUSED" in out and "TRITON_INTERPRET=1" in out


def test_the_plain_pair_config_is_accepted_with_torch_custom_ops():
    proc = _child(f"""
        from vllm.engine.arg_utils import EngineArgs
        config = EngineArgs(model="{PAIR / 'target'}", dtype="float32", enforce_eager=True).create_engine_config()
        print(config.compilation_config.custom_ops)
    """, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1] == "['none']"


def test_quantized_models_are_refused_by_role():
    from kimi.cpu_platform.platform import refusals

    config = SimpleNamespace(cache_config=SimpleNamespace(cache_dtype="auto"),
                             model_config=SimpleNamespace(quantization="fp8"),
                             speculative_config=SimpleNamespace(draft_model_config=SimpleNamespace(quantization=None)))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "1")
        found = refusals(config)
    assert len(found) == 1 and "the target is quantized (fp8)" in found[0] and "unquantized checkpoint" in found[0]


def test_eagle3_on_the_v2_runner_is_lossless_and_accepts_drafts():
    found = _last_json(_child(f"""
        import json
        from kimi.e2e.engine import tokenize, vllm_greedy
        from kimi.e2e.presets import CPU_EAGER
        from kimi.e2e.prompts import code_prompts
        target = "{PAIR / 'target'}"
        ids = tokenize(target, code_prompts(3))
        plain = vllm_greedy(target, ids, 24, None, **CPU_EAGER)
        spec = {{"method": "eagle3", "model": "{PAIR / 'drafter'}", "num_speculative_tokens": 3}}
        eagle = vllm_greedy(target, ids, 24, spec, **CPU_EAGER)
        print(json.dumps({{"same": plain.tokens == eagle.tokens, "lengths": [len(t) for t in eagle.tokens],
                           "counters": eagle.counters}}))
    """))
    assert found["same"], "EAGLE-3 changed greedy output"
    assert found["lengths"] == [24, 24, 24]
    assert found["counters"]["num_accepted_tokens"] > 0, found["counters"]
