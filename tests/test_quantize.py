"""``kimi models quantize`` (kimi/models/quantize.py, issue 22): the shipped target in block-FP8 (DeepSeek-V3 /
Kimi-K2) and INT4-experts (Kimi-K2.5) layouts, read back by transformers and by vLLM's quantization configs as
they read the real checkpoints; the block and group sizes the published models get; refusals before writing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("compressed_tensors")
pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")

from compressed_tensors.compressors import unpack_from_int32  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from kimi.errors import KimiError  # noqa: E402
from kimi.models import SHIPPED_PAIR  # noqa: E402
from kimi.models.quantize import (  # noqa: E402
    fp8_block_dequantize,
    fp8_block_size,
    fp8_gpu_refusal,
    int4_group_dequantize,
    int4_group_size,
    quantize_target,
)

TARGET = SHIPPED_PAIR / "target"
# DeepSeek-V3's config.json widths (hidden 7168, q_lora_rank 1536, intermediate 18432, moe_intermediate 2048, one
# shared expert); Kimi-K2 and K2.5 share them.
DEEPSEEK_V3 = {"hidden_size": 7168, "q_lora_rank": 1536, "intermediate_size": 18432,
               "moe_intermediate_size": 2048, "n_shared_experts": 1, "kv_lora_rank": 512, "num_attention_heads": 128,
               "v_head_dim": 128}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("quantized")
    return {scheme: (quantize_target(TARGET, out / scheme, scheme), out / scheme)[1]
            for scheme in ("fp8-block", "int4-experts")}


def _bf16() -> dict:
    return load_file(TARGET / "model.safetensors")


def test_published_models_keep_the_published_block_and_group() -> None:
    assert fp8_block_size(DEEPSEEK_V3) == (128, 128)
    assert int4_group_size(DEEPSEEK_V3) == 32
    pair = json.loads((TARGET / "config.json").read_text())
    assert fp8_block_size(pair) == (16, 16) and int4_group_size(pair) == 16
    # every quantized layer's input width bounds block_k: a q_lora_rank of 192 (q_b_proj's input) allows 64
    assert fp8_block_size({**DEEPSEEK_V3, "q_lora_rank": 192}) == (64, 64)


def test_a_block_no_gpu_kernel_takes_is_named() -> None:
    assert fp8_gpu_refusal((128, 128)) is None and fp8_gpu_refusal((16, 32)) is None
    why = fp8_gpu_refusal((16, 16))
    assert "blocks of 16 along K are below the 32" in why and "K >= 32" in why and "transformers" in why


def test_quantizing_the_pair_to_fp8_warns_that_vllm_cannot_serve_it(tmp_path, capsys) -> None:
    quantize_target(TARGET, tmp_path / "fp8", "fp8-block")
    assert f"warning: {tmp_path / 'fp8'}: blocks of 16 along K" in capsys.readouterr().err
    quantize_target(TARGET, tmp_path / "int4", "int4-experts")
    assert "warning" not in capsys.readouterr().err


def test_fp8_block_layout(written: dict[str, Path]) -> None:
    folder = written["fp8-block"]
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["quantization_config"] == {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                          "weight_block_size": [16, 16]}
    tensors, original = load_file(folder / "model.safetensors"), _bf16()
    for name in ("model.layers.0.self_attn.q_a_proj.weight", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
                 "model.layers.1.mlp.experts.3.down_proj.weight", "model.layers.1.mlp.shared_experts.up_proj.weight",
                 "model.layers.0.mlp.gate_proj.weight"):
        weight, scale = tensors[name], tensors[name + "_scale_inv"]
        out, inp = original[name].shape
        assert weight.dtype == torch.float8_e4m3fn and weight.shape == (out, inp)
        assert scale.dtype == torch.float32 and scale.shape == (-(-out // 16), -(-inp // 16)), name
        back, ref = fp8_block_dequantize(weight, scale, (16, 16)), original[name].float()
        assert ((back - ref).norm() / ref.norm()) < 0.05, name
    for name in ("model.layers.1.mlp.gate.weight", "model.embed_tokens.weight", "lm_head.weight",
                 "model.layers.0.self_attn.kv_a_layernorm.weight"):
        assert tensors[name].dtype == torch.bfloat16 and name + "_scale_inv" not in tensors, name


def test_int4_experts_layout(written: dict[str, Path]) -> None:
    folder = written["int4-experts"]
    quant = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert (quant["quant_method"], quant["format"], quant["quantization_status"]) == (
        "compressed-tensors", "pack-quantized", "compressed")
    weights = quant["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["type"], weights["symmetric"], weights["strategy"], weights["group_size"]) \
        == (4, "int", True, "group", 16)
    assert {"lm_head", "model.layers.0.self_attn.q_a_proj", "model.layers.1.mlp.shared_experts.down_proj",
            "model.layers.1.mlp.gate"} <= set(quant["ignore"])
    assert not any(".experts." in name for name in quant["ignore"])
    tensors, original = load_file(folder / "model.safetensors"), _bf16()
    base = "model.layers.1.mlp.experts.0.gate_proj."
    assert base + "weight" not in tensors
    packed, scale, shape = (tensors[base + suffix] for suffix in ("weight_packed", "weight_scale", "weight_shape"))
    assert (packed.dtype, tuple(packed.shape)) == (torch.int32, (48, 24))
    assert (scale.dtype, tuple(scale.shape)) == (torch.bfloat16, (48, 12))
    assert shape.tolist() == [48, 192]
    values = unpack_from_int32(packed, 4, torch.Size(shape.tolist()))
    assert values.min() >= -8 and values.max() <= 7
    back = int4_group_dequantize(packed, scale, shape, 16)
    assert torch.equal(back, values.float() * scale.float().repeat_interleave(16, 1))
    ref = original[base + "weight"].float()
    assert ((back - ref).norm() / ref.norm()) < 0.15
    assert tensors["model.layers.0.self_attn.q_a_proj.weight"].dtype == torch.bfloat16


@pytest.mark.parametrize("scheme", ["fp8-block", "int4-experts"])
def test_transformers_reads_them_as_the_published_checkpoints(written: dict[str, Path], scheme: str) -> None:
    """transformers dequantizes on CPU (FP8) or decompresses (compressed-tensors) to the weights our layout means."""
    model = transformers.AutoModelForCausalLM.from_pretrained(written[scheme], dtype=torch.bfloat16)
    state = model.state_dict()
    tensors = load_file(written[scheme] / "model.safetensors")
    if scheme == "fp8-block":
        name = "model.layers.0.self_attn.q_b_proj.weight"
        ours = fp8_block_dequantize(tensors[name], tensors[name + "_scale_inv"], (16, 16))
        assert torch.allclose(state[name].float(), ours, rtol=1e-2, atol=1e-3)
    base = "model.layers.1.mlp.experts.0.gate_proj."
    fused = state["model.layers.1.mlp.experts.gate_up_proj"][0, :48].float()  # transformers fuses gate and up
    if scheme == "int4-experts":
        ours = int4_group_dequantize(*(tensors[base + s] for s in ("weight_packed", "weight_scale", "weight_shape")),
                                     16)
    else:
        ours = fp8_block_dequantize(tensors[base + "weight"], tensors[base + "weight_scale_inv"], (16, 16))
    assert torch.allclose(fused, ours, rtol=1e-2, atol=1e-3)
    ids = torch.tensor([list(range(10, 40))])
    with torch.no_grad():
        logits = model(ids).logits
    assert torch.isfinite(logits).all()


def test_vllm_reads_the_quantization_configs(written: dict[str, Path]) -> None:
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    fp8 = Fp8Config.from_config(json.loads((written["fp8-block"] / "config.json").read_text())["quantization_config"])
    assert fp8.is_checkpoint_fp8_serialized and fp8.weight_block_size == [16, 16]
    quant = json.loads((written["int4-experts"] / "config.json").read_text())["quantization_config"]
    ct = CompressedTensorsConfig.from_config(quant)
    assert "model.layers.0.self_attn.kv_b_proj" in ct.ignore
    (scheme,) = ct.target_scheme_map.values()
    assert (scheme["weights"].num_bits, scheme["weights"].group_size) == (4, 16)


def test_refusals_write_nothing(written: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(KimiError, match="already quantized"):
        quantize_target(written["fp8-block"], tmp_path / "twice", "int4-experts")
    with pytest.raises(KimiError, match="unknown quantization scheme"):
        quantize_target(TARGET, tmp_path / "x", "nf4")
    with pytest.raises(KimiError):
        quantize_target(TARGET, written["fp8-block"], "fp8-block")  # exists: --force needed
    assert not (tmp_path / "twice").exists() and not (tmp_path / "x").exists()
    quantize_target(TARGET, written["fp8-block"], "fp8-block", force=True)  # an earlier quantized copy: replaced


def test_force_never_replaces_the_source_or_another_commands_folder(tmp_path: Path) -> None:
    """`kimi models quantize fp8-block models/pair-vision --force` used to replace the trained tower (any folder
    with a MANIFEST.json), and `... models/pair --force` the pair holding the source."""
    tower = tmp_path / "tower"
    shutil.copytree(SHIPPED_PAIR.parent / "pair-vision", tower)
    with pytest.raises(KimiError, match="another command's output .* choose another folder"):
        quantize_target(TARGET, tower, "fp8-block", force=True)
    source = tmp_path / "pair" / "target"
    shutil.copytree(TARGET, source)
    for out, why in ((source, "is an input"), (source.parent, "holds"), (source / "fp8", "lies inside")):
        with pytest.raises(KimiError, match=why):
            quantize_target(source, out, "fp8-block", force=True)
    assert sorted(p.name for p in tower.iterdir()) == ["MANIFEST.json", "vision.safetensors"]
    assert not (source / "fp8").exists() and (source / "model.safetensors").is_file()


def test_inspect_names_the_target_quantization(written: dict[str, Path]) -> None:
    from kimi.drafter.inspect import inspect

    drafter = SHIPPED_PAIR / "drafter"
    plain = inspect(drafter, TARGET)
    assert plain.target["quantization"] is None and "quantization none" in plain.render()
    fp8 = inspect(drafter, written["fp8-block"])
    assert fp8.target["quantization"] == "fp8 e4m3 weights, blocks 16x16, dynamic activations"
    assert fp8.problems == [] and "quantization fp8 e4m3" in fp8.render()
    int4 = inspect(drafter, written["int4-experts"]).target["quantization"]
    assert int4.startswith("compressed-tensors pack-quantized: 4-bit int weights, group 16 (") and "unquantized" in int4
