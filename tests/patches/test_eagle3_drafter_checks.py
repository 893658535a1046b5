"""Patches 0004 and 0005: EAGLE-3 drafter checks in vLLM's speculative config, before any weight loads.

Config-level checks build vLLM's engine config (`EngineArgs.create_engine_config`),
which is where `vllm serve` fails or proceeds before loading weights.  The
4-layer case runs the engine on CPU: upstream 0.26.0 picks the colliding
default ids (2, 2, 1), captures two states and crashes in the drafter's fc.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from drafters import tiny_llama_pair

pytestmark = pytest.mark.install

_ENGINE_CONFIG = textwrap.dedent("""
    import json, sys
    from vllm.engine.arg_utils import EngineArgs
    target, drafter, max_len = sys.argv[1], sys.argv[2], int(sys.argv[3])
    args = EngineArgs(model=target, skip_tokenizer_init=True, max_model_len=max_len, gpu_memory_utilization=0.25,
                      dtype="float32",
                      speculative_config={"method": "eagle3", "model": drafter, "num_speculative_tokens": 3})
    try:
        hf = args.create_engine_config().speculative_config.draft_model_config.hf_config
    except Exception as exc:
        print(json.dumps({"error": str(exc)}))
    else:
        print(json.dumps({"ids": hf.eagle_aux_hidden_state_layer_ids, "num": hf.num_aux_hidden_states,
                          "max_positions": hf.max_position_embeddings}))
""")


def engine_config(target: Path, drafter: Path, max_len: int = 1024) -> dict:
    result = subprocess.run([sys.executable, "-c", _ENGINE_CONFIG, str(target), str(drafter), str(max_len)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def pair(tmp_path: Path, layers: int, **drafter_config) -> tuple[Path, Path]:
    return tiny_llama_pair(tmp_path, layers, drafter_config)


def test_output_convention_ids_are_translated(tmp_path: Path) -> None:
    target, drafter = pair(tmp_path, 8, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 5]})
    assert engine_config(target, drafter) == {"ids": [2, 4, 6], "num": 3, "max_positions": 2048}


def test_out_of_range_ids_fail_before_loading_with_the_fix(tmp_path: Path) -> None:
    target, drafter = pair(tmp_path, 8, eagle_aux_hidden_state_layer_ids=[2, 4, 9])
    error = engine_config(target, drafter)["error"]
    assert "does not fit the 8-layer target" in error and "[9] are outside the target's layers 0..8" in error
    assert "kimi drafter inspect" in error


def test_repeated_ids_and_a_count_that_does_not_match_fc_fail(tmp_path: Path) -> None:
    target, drafter = pair(tmp_path / "a", 8, eagle_aux_hidden_state_layer_ids=[2, 4, 4])
    assert "repeat [4]" in engine_config(target, drafter)["error"]
    target, drafter = pair(tmp_path / "b", 8, eagle_aux_hidden_state_layer_ids=[2, 6])
    error = engine_config(target, drafter)["error"]
    assert "2 aux layer ids [2, 6] but the drafter's fc takes 3 hidden states" in error


def test_drafter_for_another_hidden_size_fails(tmp_path: Path) -> None:
    target, drafter = pair(tmp_path, 8, target_hidden_size=512)
    error = engine_config(target, drafter)["error"]
    assert "expects target hidden states of width 512 but the target's hidden size is 256" in error


def test_short_cache_only_rope_is_raised_and_yarn_fails(tmp_path: Path) -> None:
    target, drafter = pair(tmp_path / "a", 8, max_position_embeddings=256)
    assert engine_config(target, drafter, max_len=1024)["max_positions"] == 1024
    target, drafter = pair(tmp_path / "b", 8, max_position_embeddings=256,
                           rope_scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128})
    error = engine_config(target, drafter, max_len=1024)["error"]
    assert "RoPE (yarn) covers 256 positions but the target serves 1024" in error and "--max-model-len 256" in error


def test_kimi_k2_eagle_drafter_is_mla() -> None:
    pytest.importorskip("vllm.config")  # first: it and the convertor module import each other
    from transformers import DeepseekV3Config
    from vllm.transformers_utils.configs.eagle import EAGLEConfig
    from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase

    for model_type in ("kimi_k2", "deepseek_v3"):
        inner = DeepseekV3Config(kv_lora_rank=512, q_lora_rank=1536, num_hidden_layers=1,
                                 architectures=["Eagle3DeepseekV3ForCausalLM"])
        inner.model_type = model_type
        eagle = EAGLEConfig(inner, method="eagle3", model_type="eagle")
        assert ModelArchConfigConvertorBase(eagle, eagle).is_deepseek_mla(), model_type


_RUN = textwrap.dedent("""
    import json, sys
    from vllm import LLM, SamplingParams
    llm = LLM(model=sys.argv[1], skip_tokenizer_init=True, max_model_len=512, gpu_memory_utilization=0.25, seed=0,
              disable_log_stats=False, dtype="float32",
              speculative_config={"method": "eagle3", "model": sys.argv[2], "num_speculative_tokens": 3})
    outs = llm.generate([{"prompt_token_ids": list(range(10, 30))}],
                        SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, detokenize=False))
    drafts = [m.value for m in llm.get_metrics() if m.name.endswith("spec_decode_num_drafts")]
    print(json.dumps({"tokens": len(outs[0].outputs[0].token_ids), "drafts": drafts}))
""")


def test_four_layer_target_runs_with_distinct_default_ids(tmp_path: Path) -> None:
    """Upstream: default ids (2, 2, 1) -> two states -> fc shape error after loading. Fork: (1, 2, 3)."""
    target, drafter = pair(tmp_path, 4)
    assert engine_config(target, drafter)["ids"] == [1, 2, 3]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    result = subprocess.run([sys.executable, "-c", _RUN, str(target), str(drafter)], capture_output=True, text=True,
                            timeout=900, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    logs = result.stdout + result.stderr  # vLLM logs to stdout by default
    assert "names no aux layer ids: using the defaults [1, 2, 3] for the 4-layer target" in logs
    run = json.loads(result.stdout.strip().splitlines()[-1])
    assert run["tokens"] == 16 and run["drafts"] and run["drafts"][0] > 0


def test_malformed_ids_and_a_bad_fc_fail_before_loading(tmp_path: Path) -> None:
    target, drafter = pair(tmp_path / "a", 8, eagle_aux_hidden_state_layer_ids=["2", "4", "6"])
    assert "must be a non-empty list of integer layer ids" in engine_config(target, drafter)["error"]
    target, drafter = pair(tmp_path / "b", 8)
    from safetensors.torch import load_file, save_file

    weights = load_file(str(drafter / "model.safetensors"))
    weights["fc.weight"] = weights["fc.weight"][:, :700].contiguous()
    save_file(weights, str(drafter / "model.safetensors"))
    assert "does not take a whole number of 256-wide states" in engine_config(target, drafter)["error"]
    (drafter / "model.safetensors").write_bytes(b"\x00" * 16)
    assert "not a readable safetensors file" in engine_config(target, drafter)["error"]


_PARALLEL = textwrap.dedent("""
    import json, sys, time
    from vllm.engine.arg_utils import EngineArgs
    target, drafter, extra = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    spec = {"method": "eagle3", "model": drafter, "num_speculative_tokens": 3, **extra.pop("draft", {})}
    args = EngineArgs(model=target, skip_tokenizer_init=True, max_model_len=512, dtype="float32", **extra,
                      speculative_config=spec)
    t0 = time.monotonic()
    try:
        config = args.create_engine_config()
    except Exception as exc:
        print(json.dumps({"error": str(exc), "seconds": time.monotonic() - t0}))
    else:
        print(json.dumps({"pp": config.parallel_config.pipeline_parallel_size,
                          "tp": config.parallel_config.tensor_parallel_size}))
""")


def parallel_config(target: Path, drafter: Path, **extra) -> dict:
    result = subprocess.run([sys.executable, "-c", _PARALLEL, str(target), str(drafter), json.dumps(extra)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _deepseek_pp_spec(target: Path) -> SimpleNamespace:
    return SimpleNamespace(
        target_parallel_config=SimpleNamespace(pipeline_parallel_size=2, tensor_parallel_size=2),
        target_model_config=SimpleNamespace(model=str(target),
                                            hf_text_config=SimpleNamespace(model_type="deepseek_v3")))


# vLLM 0.32.0's DeepseekV2Model relays no aux states over PP: the refusal off CPU is that release's (on 0.34.0 patch
# 0022 makes it relay them and the check passes everywhere: the test below)
@pytest.mark.line("v0.32")
def test_pipeline_parallel_on_a_deepseek_target_passes_on_cpu_and_is_refused_elsewhere(trained_pair: Path,
                                                                                        monkeypatch) -> None:
    """EAGLE-3 with PP 2 on the DeepSeek-V3 target: vLLM's CPU backend builds the config (patch 0022 serves it; the
    engines are in tests/test_parallel.py); on any other platform the check refuses it while the config is built,
    naming vLLM's two failures and the fix."""
    from vllm.platforms import current_platform

    import kimi.drafter.serve_checks as checks

    target, drafter = trained_pair / "target", trained_pair / "drafter"
    assert parallel_config(target, drafter, pipeline_parallel_size=2, tensor_parallel_size=2) == {"pp": 2, "tp": 2}
    spec = _deepseek_pp_spec(target)
    checks.check_pipeline_parallel(spec)  # this CPU
    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: False)
    with pytest.raises(checks.DrafterConfigError) as refused:
        checks.check_pipeline_parallel(spec)
    message = str(refused.value)
    assert "EAGLE-3 with pipeline_parallel_size=2 on the deepseek_v3 target" in message
    assert "vllm#45985" in message and "vllm#30436" in message and "CPU only" in message
    assert "--pipeline-parallel-size 1" in message and "--tensor-parallel-size 4" in message
    spec.target_parallel_config.pipeline_parallel_size = 1
    checks.check_pipeline_parallel(spec)  # one stage passes everywhere


@pytest.mark.line("mainline")
def test_pipeline_parallel_on_a_deepseek_target_passes_everywhere_once_deepseek_relays_aux_states(
        trained_pair: Path, monkeypatch) -> None:
    """vLLM 0.34.0 with patch 0022: DeepseekV2Model joins the V2 runner's relay of aux states between stages, so the
    check refuses EAGLE-3 with PP 2 on the DeepSeek-V3 target on no platform: the config builds on this CPU (the
    engines are in tests/test_parallel.py) and the check passes off CPU."""
    from vllm.platforms import current_platform

    import kimi.drafter.serve_checks as checks

    assert checks.deepseek_relays_aux_states()
    target, drafter = trained_pair / "target", trained_pair / "drafter"
    assert parallel_config(target, drafter, pipeline_parallel_size=2, tensor_parallel_size=2) == {"pp": 2, "tp": 2}
    spec = _deepseek_pp_spec(target)
    checks.check_pipeline_parallel(spec)  # this CPU
    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: False)
    checks.check_pipeline_parallel(spec)  # a GPU host


def test_a_draft_tensor_parallel_size_the_target_does_not_allow_is_refused_by_vllm_at_config_time(
        trained_pair: Path) -> None:
    """Issue 19: a drafter TP other than 1 or the target's stops start-up while the config is built (vLLM's own
    check, naming the sizes it allows); 1 and the target's own pass."""
    target, drafter = trained_pair / "target", trained_pair / "drafter"
    got = parallel_config(target, drafter, tensor_parallel_size=2, draft={"draft_tensor_parallel_size": 3})
    assert "draft_tensor_parallel_size=3 cannot be other value than 1 or target model tensor_parallel_size" in got[
        "error"] and got["seconds"] < 60
    for allowed in (1, 2):
        assert parallel_config(target, drafter, tensor_parallel_size=2,
                               draft={"draft_tensor_parallel_size": allowed}) == {"pp": 1, "tp": 2}


def test_pipeline_parallel_on_a_llama_target_is_left_to_vllm(tmp_path: Path) -> None:
    """The V2 runner relays a Llama target's aux states across stages (vLLM PR 50514): not refused."""
    target, drafter = pair(tmp_path, 8)
    assert parallel_config(target, drafter, pipeline_parallel_size=2) == {"pp": 2, "tp": 1}




def test_a_drafter_without_architectures_is_refused_with_the_fix(trained_pair: Path, tmp_path: Path) -> None:
    """Issue 44: upstream's update_arch_ lists ~300 class names; the fork names the missing field and the fix."""
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "model.safetensors").symlink_to(trained_pair / "drafter" / "model.safetensors")
    config = json.loads((trained_pair / "drafter" / "config.json").read_text())
    del config["architectures"]
    (drafter / "config.json").write_text(json.dumps(config))
    error = engine_config(trained_pair / "target", drafter)["error"]
    assert "no architectures in config.json" in error and "Supported architectures" not in error
    assert 'Fix: write architectures: ["LlamaForCausalLMEagle3"]' in error


def test_lm_head_quantization_is_refused_before_load_for_a_drafter_with_its_own_vocabulary(trained_pair: Path) -> None:
    """vLLM 0.34.0's draft_lm_head_quantization quantizes the target's lm_head for a drafter that shares it, and
    finds out that the drafter does not only after both models load; the pair's drafter has its own head over 1536
    draft ids (target: 4096), so the check refuses the option while the config is built."""
    import kimi.drafter.serve_checks as checks
    from kimi_lab.drafter.corpus import spec_config

    config = spec_config(trained_pair / "drafter", trained_pair / "target")
    config.draft_lm_head_quantization = None
    checks.prepare_eagle3_drafter(config)  # without the option: served
    config.draft_lm_head_quantization = "fp8"
    with pytest.raises(checks.DrafterConfigError) as refused:
        checks.prepare_eagle3_drafter(config)
    message = str(refused.value)
    assert "draft_lm_head_quantization='fp8'" in message and "draft vocabulary of 1536 ids (target: 4096)" in message
    assert "Fix: leave draft_lm_head_quantization out of --speculative-config" in message
