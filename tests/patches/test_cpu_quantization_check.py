"""Patch 0016: a quantized target that vLLM's CPU backend cannot run on this host is refused while the config is built.

The folders are the shipped target rewritten by ``kimi models quantize`` (block-FP8 with 16x16 blocks, INT4 experts
with group 16). The decision tests flip vLLM's own AMX probe (``torch.cpu._is_amx_tile_supported``) in this process;
the engine tests build vLLM's engine config in a child process, as ``vllm serve`` does before anything loads, one
child runs upstream's engine with the check switched off to show the kernel errors it stops instead, and on a CPU with
AMX tiles one serves a 128x128 block-FP8 target that the check lets through.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine_script import run_engine_script
from kimi.models import SHIPPED_PAIR

pytestmark = pytest.mark.install

TARGET, DRAFTER = SHIPPED_PAIR / "target", SHIPPED_PAIR / "drafter"
FIXES = "Fix: serve it on a GPU"
BF16 = "serve the unquantized (bf16) checkpoint on this CPU"


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``kimi models quantize`` of the shipped target in both schemes (seconds)."""
    from kimi.models.quantize import quantize_target

    out = tmp_path_factory.mktemp("quantized")
    for scheme in ("fp8-block", "int4-experts"):
        quantize_target(TARGET, out / scheme, scheme)
    return {scheme: out / scheme for scheme in ("fp8-block", "int4-experts")}


@pytest.fixture
def amx(monkeypatch: pytest.MonkeyPatch):
    """Set the answer of the AMX probe that vLLM's CPU kernels and the check share."""
    import torch

    def set_amx(present: bool) -> None:
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: present)

    return set_amx


def _config(folder: Path, **changes) -> dict:
    return {**json.loads((folder / "config.json").read_text()), **changes}


def refusal(config: dict, dtype: str = "bfloat16", moe_backend: str = "auto") -> str | None:
    """The check's message for a target with this config.json (None: let through), quantization config parsed by
    vLLM as it parses the checkpoint's."""
    import torch
    from vllm.model_executor.layers.quantization import get_quantization_config

    from kimi.hooks.cpu_quantization_check import cpu_refusal

    raw = config["quantization_config"]
    quant = get_quantization_config(raw["quant_method"]).from_config(raw)
    text = SimpleNamespace(**config)
    model = SimpleNamespace(model="T", dtype=getattr(torch, dtype), hf_config=text, hf_text_config=text)
    found = cpu_refusal(quant, model, SimpleNamespace(moe_backend=moe_backend))
    return None if found is None else found.message("T")


def _block(config: dict, block: list[int]) -> dict:
    return {**config, "quantization_config": {**config["quantization_config"], "weight_block_size": block}}


def _softmax_router(config: dict) -> dict:
    """The same decoder with DeepSeek-V2's softmax router (no score-correction bias): RoutingMethodType.Default."""
    return {**config, "model_type": "deepseek_v2", "scoring_func": "softmax", "topk_method": "greedy",
            "norm_topk_prob": False}


def _group(config: dict, group: int | None = None, ignore: list[str] | None = None) -> dict:
    quant = json.loads(json.dumps(config["quantization_config"]))
    if group is not None:
        quant["config_groups"]["group_0"]["weights"]["group_size"] = group
    if ignore is not None:
        quant["ignore"] = quant["ignore"] + ignore
    return {**config, "quantization_config": quant}


def test_fp8_block_16_is_refused_with_or_without_amx(quantized: dict[str, Path], amx) -> None:
    """The shipped target's 16x16 blocks: no CPU block-FP8 GEMM of vLLM's takes them, AMX or not."""
    config = _config(quantized["fp8-block"])
    amx(False)
    message = refusal(config)
    assert "it is block-FP8 (quant_method fp8, fmt e4m3, weight_block_size [16, 16], dynamic activations)" in message
    assert "they need AMX tiles (Intel Sapphire Rapids or newer), which this CPU lacks" in message
    assert "weight_block_size [32n, 128] only, not [16, 16]" in message
    assert f"{FIXES}, or {BF16}." in message  # an AMX CPU would not help these blocks
    amx(True)
    message = refusal(config)
    assert "weight_block_size [32n, 128] only, not [16, 16]" in message and "lacks" not in message


def test_fp8_block_128_needs_amx_only(quantized: dict[str, Path], amx) -> None:
    """DeepSeek-V3's and Kimi-K2's 128x128 blocks: refused without AMX (the fix names an AMX CPU), let through with
    it, refused with it in float16 (the kernels compute in bfloat16 or float32)."""
    config = _block(_config(quantized["fp8-block"]), [128, 128])
    amx(False)
    message = refusal(config)
    assert "weight_block_size [128, 128]" in message and "which this CPU lacks" in message
    assert f"{FIXES}, or on a CPU with AMX tiles (Intel Sapphire Rapids or newer), or {BF16}." in message
    amx(True)
    assert refusal(config) is None
    assert "not float16" in refusal(config, dtype="float16") and "--dtype bfloat16" in refusal(config, "float16")


def test_int4_experts_behind_deepseek_routing_are_refused_with_or_without_amx(quantized: dict[str, Path],
                                                                                amx) -> None:
    """The shipped target's INT4 experts: CPUExpertsInt4 takes no DeepSeekV3 routing and ZentorchExpertsInt4 needs
    zentorch; the message names the quantization, both kernels and the fix."""
    config = _config(quantized["int4-experts"])
    amx(True)
    message = refusal(config)
    assert ("its routed experts are INT4 W4A16 (quant_method compressed-tensors, format pack-quantized, 4-bit int "
            "symmetric weights, group_size 16) behind DeepSeek-V3's router") in message
    assert "CPUExpertsInt4 does not take DeepSeekV3 routing" in message
    assert "ZentorchExpertsInt4 needs AMD's zentorch" in message
    assert message.endswith(f"{FIXES}, or {BF16}.")
    amx(False)
    assert ("CPUExpertsInt4 needs AMX tiles (Intel Sapphire Rapids or newer), which this CPU lacks, and does not take "
            "DeepSeekV3 routing") in refusal(config)


def test_int4_experts_behind_softmax_routing_need_amx(quantized: dict[str, Path], amx) -> None:
    """A softmax router: CPUExpertsInt4 takes the experts on an AMX CPU (let through), not without AMX, and not with
    group size 32 (vLLM 0.32.0 gives group 32 a weight key only zentorch lists)."""
    config = _softmax_router(_config(quantized["int4-experts"]))
    amx(True)
    assert refusal(config) is None
    assert "CPUExpertsInt4 does not take group size 32" in refusal(_group(config, group=32))
    amx(False)
    message = refusal(config)
    assert "CPUExpertsInt4 needs AMX tiles" in message and "routing" not in message.split("; no CPU")[1]


def test_what_the_check_does_not_know_is_left_to_vllm(quantized: dict[str, Path], amx) -> None:
    """Ignored experts, an explicit --moe-backend, another MoE architecture, per-tensor FP8: not refused."""
    amx(False)
    int4 = _config(quantized["int4-experts"])
    assert refusal(_group(int4, ignore=["re:.*mlp\\.experts\\..*"])) is None
    assert refusal(int4, moe_backend="triton") is None
    assert refusal({**int4, "model_type": "qwen3_moe"}) is None
    per_tensor = _config(quantized["fp8-block"])
    per_tensor["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    assert refusal(per_tensor) is None


def test_a_description_vllm_no_longer_takes_is_left_to_vllm(quantized: dict[str, Path], amx,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.model_executor.kernels.linear as linear

    def moved(*args, **kwargs):
        raise TypeError("choose_scaled_mm_linear_kernel() got an unexpected keyword argument")

    amx(False)
    monkeypatch.setattr(linear, "choose_scaled_mm_linear_kernel", moved)
    assert refusal(_config(quantized["fp8-block"])) is None


_ENGINE_CONFIGS = textwrap.dedent("""
    import json, sys, time
    import torch
    from vllm.engine.arg_utils import EngineArgs
    drafter, out = sys.argv[1], {"amx": torch.cpu._is_amx_tile_supported()}
    for target in sys.argv[2:]:
        for spec in (None, {"method": "eagle3", "model": drafter, "num_speculative_tokens": 3}):
            t0 = time.monotonic()
            try:
                EngineArgs(model=target, skip_tokenizer_init=True, max_model_len=512, gpu_memory_utilization=0.25,
                           speculative_config=spec).create_engine_config()
                error = None
            except Exception as exc:
                error = str(exc)
            out[f"{target} {'eagle3' if spec else 'plain'}"] = {"error": error, "seconds": time.monotonic() - t0}
    print("RESULT " + json.dumps(out))
""")


def test_engine_config_refuses_both_targets_before_anything_loads(quantized: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    """``EngineArgs.create_engine_config`` (where ``vllm serve`` stops or goes on before loading) refuses both folders
    within seconds, with and without EAGLE-3; the bf16 target passes. A copy of the FP8 folder that says 128x128
    blocks passes on an AMX host and is refused, naming an AMX CPU, on one without."""
    fp8, int4 = quantized["fp8-block"], quantized["int4-experts"]
    fp8_128 = tmp_path / "fp8-128"
    fp8_128.mkdir()
    (fp8_128 / "config.json").write_text(json.dumps(_block(_config(fp8), [128, 128])))
    (fp8_128 / "model.safetensors").symlink_to(fp8 / "model.safetensors")
    got = run_engine_script(_ENGINE_CONFIGS, str(DRAFTER), str(fp8), str(int4), str(TARGET), str(fp8_128))
    for mode in ("plain", "eagle3"):
        fp8_error, int4_error = got[f"{fp8} {mode}"]["error"], got[f"{int4} {mode}"]["error"]
        assert "CPU backend cannot serve the target" in fp8_error and "weight_block_size [16, 16]" in fp8_error
        assert "INT4 W4A16" in int4_error and "DeepSeekV3 routing" in int4_error
        assert FIXES in fp8_error and FIXES in int4_error
        assert got[f"{fp8} {mode}"]["seconds"] < 60 and got[f"{int4} {mode}"]["seconds"] < 60
        assert got[f"{TARGET} {mode}"]["error"] is None
        wide = got[f"{fp8_128} {mode}"]["error"]
        assert wide is None if got["amx"] else "on a CPU with AMX tiles" in wide


_UPSTREAM = textwrap.dedent("""
    import json, sys
    import kimi.hooks.cpu_quantization_check as check
    check.check_cpu_quantization = lambda vllm_config: None  # the engine as upstream builds it
    from vllm import LLM
    out = {}
    for target in sys.argv[1:]:
        try:
            LLM(model=target, max_model_len=512, enforce_eager=True, kv_cache_memory_bytes=256 << 20,
                skip_tokenizer_init=True)
            out[target] = None
        except Exception as exc:
            out[target] = f"{type(exc).__name__}: {exc}"
    print("RESULT " + json.dumps(out))
""")


def test_without_the_check_upstream_fails_building_the_model(quantized: dict[str, Path]) -> None:
    """The other side: with the check switched off, vLLM takes both configs, starts the engine and fails while the
    model is built, with the kernel-selection errors the check stops before (so it refuses nothing upstream runs)."""
    fp8, int4 = quantized["fp8-block"], quantized["int4-experts"]
    got = run_engine_script(_UPSTREAM, str(int4), str(fp8))
    assert got[str(int4)] == "NotImplementedError: No WNA16 MoE backend supports the deployment configuration."
    assert got[str(fp8)].startswith("ValueError: Failed to find a kernel that can implement the ScaledMM linear layer")
    assert "CPUFp8BlockScaledMMKernel" in got[str(fp8)]


_GENERATE = textwrap.dedent("""
    import json, sys
    from vllm import LLM, SamplingParams
    llm = LLM(model=sys.argv[1], max_model_len=512, enforce_eager=True, kv_cache_memory_bytes=256 << 20,
              skip_tokenizer_init=True)
    model = llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
    kernels = sorted({type(m.quant_method.fp8_linear).__name__ for m in model.modules()
                      if hasattr(getattr(m, "quant_method", None), "fp8_linear")})
    moe = sorted({m.quant_method.fp8_backend.value for m in model.modules()
                  if hasattr(getattr(m, "quant_method", None), "fp8_backend")})
    outs = llm.generate([{"prompt_token_ids": list(range(10, 30))}],
                        SamplingParams(temperature=0, max_tokens=8, detokenize=False))
    print("RESULT " + json.dumps({"tokens": list(outs[0].outputs[0].token_ids), "kernels": kernels, "moe": moe}))
""")


def test_on_an_amx_host_a_128_block_fp8_target_runs(tmp_path: Path) -> None:
    """What the check lets through, upstream serves: on a CPU with AMX tiles a DeepSeek-V3 target with
    DeepSeek-V3's 128x128 blocks (the shipped target's layout, widths made multiples of 128, random weights) builds
    with CPUFp8BlockScaledMMKernel and the CPU FP8 MoE backend and generates."""
    import torch

    if not torch.cpu._is_amx_tile_supported():
        pytest.skip("needs a CPU with AMX tiles: vLLM's CPU block-FP8 kernels need them (the check refuses here)")
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from kimi.models.quantize import fp8_block_size, quantize_target

    config = _config(TARGET, hidden_size=256, q_lora_rank=128, intermediate_size=256, moe_intermediate_size=128,
                     num_hidden_layers=2)
    assert fp8_block_size(config) == (128, 128)
    torch.manual_seed(0)
    fields = {k: v for k, v in config.items() if k != "architectures"}
    DeepseekV3ForCausalLM(DeepseekV3Config(**fields)).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    quantize_target(tmp_path / "bf16", tmp_path / "fp8", "fp8-block")
    got = run_engine_script(_GENERATE, str(tmp_path / "fp8"))
    assert len(got["tokens"]) == 8
    assert got["kernels"] == ["CPUFp8BlockScaledMMKernel"] and got["moe"] == ["CPU"]
