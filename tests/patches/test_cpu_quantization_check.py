"""Patch 0016: a quantized target that vLLM's CPU backend cannot run on this host is refused while the config is built.

The folders are the shipped target rewritten by ``kimi models quantize`` (block-FP8 with 16x16 blocks, INT4 experts
with group 16), and configs relabelled from them or from a DeepSeek-V3-wide copy of its layout ([64, 128] block-FP8,
compressed-tensors FP8_BLOCK, INT4 experts ignored in one layer, 8-bit experts). The decision tests flip vLLM's own
AMX probe (``torch.cpu._is_amx_tile_supported``) in this process; each new layout also shows upstream's failure
without the check, at construction where it fails there, in an engine for the [64, 128] experts (which fail only after
loading); the engine tests build vLLM's engine config in a child process, as ``vllm serve`` does before anything
loads, one child runs upstream's engine with the check switched off to show the kernel errors it stops instead, and on
a CPU with AMX tiles one serves a 128x128 block-FP8 target that the check lets through.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine_script import run_engine_script
from kimi.models import SHIPPED_PAIR

# vLLM's compiled CPU kernels (the v0.32 line): the mainline's torch-only platform refuses every quantized model
pytestmark = [pytest.mark.install, pytest.mark.line("v0.32")]

TARGET, DRAFTER = SHIPPED_PAIR / "target", SHIPPED_PAIR / "drafter"
FIXES = "Fix: serve it on a GPU"
AMX = "AMX tiles (Intel Sapphire Rapids or newer)"
BF16 = "serve a bf16 (dequantized) copy of the checkpoint on this CPU"
LATE = "vLLM would otherwise start the engine and fail while building the model."


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
    """Set the answer of the AMX probe that vLLM's CPU kernels and the check share. An AMX CPU also has AVX-512, so
    vLLM loads its AVX-512 build there, the one that carries the fp8_scaled_mm_cpu op; on an AVX2-only host (as CI
    runs on) the op is absent, so the fake AMX host gets it too."""
    import torch
    import vllm._custom_ops as ops

    def set_amx(present: bool) -> None:
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: present)
        monkeypatch.setattr(ops, "_supports_cpu_fp8_w8a16", present)

    return set_amx


def _config(folder: Path, **changes) -> dict:
    return {**json.loads((folder / "config.json").read_text()), **changes}


def refusal(config: dict, dtype: str = "bfloat16", moe_backend: str = "auto") -> str | None:
    """The check's message for a target with this config.json (None: let through), quantization config parsed by
    vLLM as it parses the checkpoint's."""
    import torch
    from vllm.model_executor.layers.quantization import get_quantization_config

    from kimi.cpu_quantization.check import cpu_refusal

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
    assert LATE in message
    amx(True)
    message = refusal(config)
    assert "weight_block_size [32n, 128] only, not [16, 16]" in message
    assert f"{AMX}, which this CPU lacks" not in message
    assert "CPUExpertsFp8 takes 128x128 weight blocks only, not [16, 16]" in message  # the experts' kernel too


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
    assert message.endswith(f"{LATE} {FIXES}, or {BF16}.")
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


def _wide(**changes) -> dict:
    """The shipped target's config with DeepSeek-V3-wide enough layers for 128-wide blocks (2 layers, the second
    with routed experts)."""
    return _config(TARGET, hidden_size=256, q_lora_rank=128, intermediate_size=256, moe_intermediate_size=128,
                   num_hidden_layers=2, **changes)


def _fp8(config: dict, block: list[int], **extra) -> dict:
    return {**config, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                              "weight_block_size": block, **extra}}


def _ct_fp8_block(config: dict, block: list[int]) -> dict:
    """llm-compressor's FP8_BLOCK scheme (compressed-tensors' preset: 8-bit float static block weights, dynamic
    group-128 activations) with ``block``, everything but the router and lm_head quantized."""
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    scheme = preset_name_to_scheme("FP8_BLOCK", ["Linear"])
    scheme.weights.block_structure = block
    quant = QuantizationConfig(config_groups={"group_0": scheme}, format="float-quantized",
                               quantization_status="compressed", ignore=["lm_head", "re:.*mlp\\.gate$"])
    return {**config, "quantization_config": quant.model_dump(mode="json")}


def _bits(config: dict, bits: int) -> dict:
    quant = json.loads(json.dumps(config["quantization_config"]))
    quant["config_groups"]["group_0"]["weights"]["num_bits"] = bits
    return {**config, "quantization_config": quant}


def _parsed(config: dict):
    from vllm.model_executor.layers.quantization import get_quantization_config

    raw = config["quantization_config"]
    return get_quantization_config(raw["quant_method"]).from_config(raw)


def _upstream_moe_method(config: dict, layer: int):
    """What vLLM's CompressedTensorsMoEMethod builds for the experts of decoder layer ``layer`` (its backend choice
    runs in the constructor, as the model is built)."""
    import torch
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
        CompressedTensorsMoEMethod,
    )

    from kimi.cpu_quantization.check import _moe_config

    experts = type("RoutedExperts", (), {"moe_config": _moe_config(SimpleNamespace(**config), torch.bfloat16),
                                         "ckpt_gate_proj_name": "gate_proj", "ckpt_up_proj_name": "up_proj",
                                         "ckpt_down_proj_name": "down_proj"})()
    return CompressedTensorsMoEMethod.get_moe_method(_parsed(config), experts, f"model.layers.{layer}.mlp.experts")


def test_fp8_block_experts_need_128x128_blocks(amx) -> None:
    """[64, 128] blocks: vLLM's CPU block-FP8 GEMMs take them on an AMX CPU, its CPU FP8 experts do not
    (CPUExpertsFp8 takes 128x128 only, CPUExpertsFp8W8A8 needs AMX-FP8): refused naming the experts, AMX or not,
    and an AMX CPU is not offered as the fix; 128x128 is let through on AMX; ignored experts or an explicit
    --moe-backend are left to vLLM."""
    config = _fp8(_wide(), [64, 128])
    amx(True)
    message = refusal(config)
    assert ("none of vLLM's CPU FP8 MoE kernels can run its routed experts (mlp.experts of 1 MoE layer): "
            "CPUExpertsFp8W8A8 needs native AMX-FP8") in message
    assert "CPUExpertsFp8 takes 128x128 weight blocks only, not [64, 128]" in message
    assert "linear layers" not in message
    assert message.endswith("vLLM would otherwise start the engine and fail after loading every weight, with no "
                            f"FP8 MoE backend to prepare the experts for. {FIXES}, or {BF16}.")
    amx(False)
    message = refusal(config)
    assert f"its linear layers: they need {AMX}, which this CPU lacks; and none of vLLM's CPU FP8 MoE" in message
    assert f"CPUExpertsFp8 needs {AMX}, which this CPU lacks, and takes 128x128 weight blocks only" in message
    assert message.endswith(f"{LATE} {FIXES}, or {BF16}.")  # an AMX CPU would mend the linears only
    amx(True)
    assert refusal(_fp8(_wide(), [128, 128])) is None
    assert refusal(_fp8(_wide(), [64, 128], ignored_layers=["model.layers.1.mlp.experts"])) is None
    assert refusal(config, moe_backend="triton") is None


def test_compressed_tensors_block_fp8_is_put_to_the_fp8_kernels(quantized: dict[str, Path], amx) -> None:
    """llm-compressor's FP8_BLOCK (compressed-tensors, e.g. Kimi-K2-Thinking-FP8-Block): the dense layers' block
    read as CompressedTensorsConfig reads it and put to the same CPU block-FP8 GEMMs. The 16x16 folder relabelled
    so is refused, AMX or not; DeepSeek-V3-wide layers with 128x128 blocks are let through on AMX (the experts,
    keyed 128x128 by vLLM, take CPUExpertsFp8) and refused without, naming an AMX CPU."""
    config = _ct_fp8_block(_config(quantized["fp8-block"]), [16, 16])
    amx(True)
    message = refusal(config)
    assert ("it is block-FP8 (quant_method compressed-tensors, format float-quantized, 8-bit float weights, "
            "block_structure [16, 16], dynamic activations); none of vLLM's CPU block-FP8 GEMMs can run its linear "
            "layers: they take weight_block_size [32n, 128] only, not [16, 16].") in message
    amx(False)
    assert f"{AMX}, which this CPU lacks" in refusal(config)
    wide = _ct_fp8_block(_wide(), [128, 128])
    assert f"{FIXES}, or on a CPU with {AMX}, or {BF16}." in refusal(wide)
    amx(True)
    assert refusal(wide) is None


def test_without_the_check_upstream_fails_on_compressed_tensors_block_fp8(quantized: dict[str, Path]) -> None:
    """The other side, at construction: CompressedTensorsConfig gives the 16x16 folder's dense layers
    CompressedTensorsW8A8Fp8, whose create_weights asks init_fp8_linear_kernel for a kernel: none."""
    import torch
    from vllm.config.vllm import set_current_vllm_config
    from vllm.model_executor.kernels.linear import init_fp8_linear_kernel

    quant = _parsed(_ct_fp8_block(_config(quantized["fp8-block"]), [16, 16]))
    with set_current_vllm_config(SimpleNamespace(model_config=SimpleNamespace(dtype=torch.bfloat16))):
        scheme = quant.get_scheme(type("RowParallelLinear", (), {})(), "model.layers.0.self_attn.o_proj")
    assert type(scheme).__name__ == "CompressedTensorsW8A8Fp8" and scheme.weight_block_size == [16, 16]
    with pytest.raises(ValueError, match="Failed to find a kernel that can implement the ScaledMM linear layer"):
        init_fp8_linear_kernel(activation_quant_key=scheme.activation_quant_key,
                               weight_quant_key=scheme.weight_quant_key, input_dtype=torch.bfloat16,
                               out_dtype=torch.bfloat16, weight_shape=(192, 192))


def test_int4_experts_ignored_in_some_layers_are_checked_in_the_others(quantized: dict[str, Path], amx) -> None:
    """Layer 1's experts ignored: upstream leaves them bf16 (no scheme) and fails on layer 2's (no WNA16 MoE
    backend); the check puts each distinct scheme to vLLM and refuses."""
    config = _group(_config(quantized["int4-experts"]), ignore=["re:model\\.layers\\.1\\.mlp\\.experts\\..*"])
    amx(True)
    quant = _parsed(config)
    quant._add_fused_moe_to_target_scheme_map()
    assert quant.get_scheme_dict(type("RoutedExperts", (), {})(), "model.layers.1.mlp.experts.0.up_proj") is None
    with pytest.raises(NotImplementedError, match="No WNA16 MoE backend supports the deployment configuration"):
        _upstream_moe_method(config, 2)
    message = refusal(config)
    assert "its routed experts are INT4 W4A16" in message
    assert "CPUExpertsInt4 does not take DeepSeekV3 routing" in message


def test_int8_experts_are_refused(quantized: dict[str, Path], amx) -> None:
    """8-bit (W8A16) experts: CPUExpertsInt4 takes 4-bit weights only, so upstream finds no WNA16 MoE backend on any
    CPU, behind either router; the check refuses them so."""
    config = _bits(_config(quantized["int4-experts"]), 8)
    for present in (True, False):
        amx(present)
        for routed in (config, _softmax_router(config)):
            with pytest.raises(NotImplementedError, match="No WNA16 MoE backend supports the deployment"):
                _upstream_moe_method(routed, 1)
            message = refusal(routed)
            assert ("its routed experts are INT8 W8A16 (quant_method compressed-tensors, format pack-quantized, "
                    "8-bit int symmetric weights, group_size 16)") in message
            assert "CPUExpertsInt4" in message and "takes 4-bit weights only, not 8-bit" in message
            assert message.endswith(f"{LATE} {FIXES}, or {BF16}.")


def test_a_description_vllm_no_longer_takes_is_left_to_vllm(quantized: dict[str, Path], amx,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.model_executor.kernels.linear as linear

    def moved(*args, **kwargs):
        raise TypeError("choose_scaled_mm_linear_kernel() got an unexpected keyword argument")

    amx(False)
    monkeypatch.setattr(linear, "choose_scaled_mm_linear_kernel", moved)
    assert refusal(_config(quantized["fp8-block"])) is None
    monkeypatch.undo()
    import vllm.model_executor.layers.fused_moe.oracle.fp8 as fp8_moe

    amx(True)  # the experts' part raising is skipped alone: [64, 128] experts let through, [16, 16] linears not
    monkeypatch.setattr(fp8_moe, "select_fp8_moe_backend", moved)
    assert refusal(_fp8(_wide(), [64, 128])) is None
    assert "weight_block_size [32n, 128] only, not [16, 16]" in refusal(_config(quantized["fp8-block"]))


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


@pytest.fixture(scope="module")
def wide_bf16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped target's layout with DeepSeek-V3-wide enough layers for 128x128 blocks (:func:`_wide`), random
    bf16 weights (seconds)."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    out = tmp_path_factory.mktemp("wide") / "bf16"
    torch.manual_seed(0)
    fields = {k: v for k, v in _wide().items() if k != "architectures"}
    DeepseekV3ForCausalLM(DeepseekV3Config(**fields)).to(torch.bfloat16).save_pretrained(out)
    return out


def test_without_the_check_upstream_loads_64x128_fp8_experts_then_fails(wide_bf16: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The other side of the FP8 experts: the wide target quantized with [64, 128] blocks. With the check switched
    off, on a CPU with AMX tiles upstream builds the model (its linears take the blocks), loads every weight and
    fails preparing the experts (FP8 MoE backend NONE); without AMX it fails on the linears. The check refuses it
    on both."""
    import torch

    import kimi.models.quantize as quantize

    monkeypatch.setattr(quantize, "fp8_block_size", lambda cfg: (64, 128))
    quantize.quantize_target(wide_bf16, tmp_path / "fp8", "fp8-block")
    got = run_engine_script(_UPSTREAM, str(tmp_path / "fp8"))[str(tmp_path / "fp8")]
    if torch.cpu._is_amx_tile_supported():
        assert got == "ValueError: Unsupported FP8 MoE backend: NONE"
        assert "CPUExpertsFp8 takes 128x128 weight blocks only, not [64, 128]" in refusal(_config(tmp_path / "fp8"))
    else:
        assert got.startswith("ValueError: Failed to find a kernel that can implement the ScaledMM linear layer")
        assert "CPUExpertsFp8 needs AMX tiles" in refusal(_config(tmp_path / "fp8"))


def test_on_an_amx_host_a_128_block_fp8_target_runs(wide_bf16: Path, tmp_path: Path) -> None:
    """What the check lets through, upstream serves: on a CPU with AMX tiles a DeepSeek-V3 target with
    DeepSeek-V3's 128x128 blocks (the shipped target's layout, widths made multiples of 128, random weights) builds
    with CPUFp8BlockScaledMMKernel and the CPU FP8 MoE backend and generates."""
    import torch

    if not torch.cpu._is_amx_tile_supported():
        pytest.skip("needs a CPU with AMX tiles: vLLM's CPU block-FP8 kernels need them (the check refuses here)")
    from kimi.models.quantize import fp8_block_size, quantize_target

    assert fp8_block_size(_wide()) == (128, 128)
    quantize_target(wide_bf16, tmp_path / "fp8", "fp8-block")
    got = run_engine_script(_GENERATE, str(tmp_path / "fp8"))
    assert len(got["tokens"]) == 8
    assert got["kernels"] == ["CPUFp8BlockScaledMMKernel"] and got["moe"] == ["CPU"]
