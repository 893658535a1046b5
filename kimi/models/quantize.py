"""Quantized reference targets: a bf16 DeepSeek-V3-architecture target rewritten in the two layouts our
users' checkpoints ship, so that EAGLE-3 can be tried on what is actually served.

``fp8-block``, as DeepSeek-V3/R1 and Kimi-K2 write it: every linear weight of the decoder layers except the MoE
router (``mlp.gate``) in float8 e4m3 with a float32 ``weight_scale_inv`` per block of ``weight_block_size``
(``[ceil(out / block_n), ceil(in / block_k)]``; the weight is ``fp8 * scale_inv`` blockwise, DeepSeek-V3's
``weight_dequant``), and ``quantization_config = {quant_method: fp8, fmt: e4m3, activation_scheme: dynamic,
weight_block_size}``; embeddings, norms, router and ``lm_head`` stay bf16. Names as vLLM's ``Fp8LinearMethod`` /
``Fp8MoEMethod`` load them (``weight_scale_inv`` for block quantization).

``int4-experts``, as Kimi-K2.5 writes it: the routed experts weight-only INT4 (W4A16) in compressed-tensors'
``pack-quantized`` format, symmetric, group-wise scales (vllm#40357 lists Kimi-K2.5's: compressed-tensors,
pack-quantized, num_bits 4, type int, group_size 32); per expert projection ``weight_packed`` (int32, eight
4-bit values each), ``weight_scale`` (bf16, one per group) and ``weight_shape``; every other linear layer in
``ignore``. The packing, the scales and the config are compressed-tensors' own (``pack_to_int32``,
``calculate_qparams``, ``QuantizationConfig``), not ours.

The published block (128) and group (32) are kept where the target's widths allow them; a smaller target gets
the largest power of two below them that its widths are multiples of (:func:`fitted`; the shipped pair's 48-wide
experts and 64-wide ``q_a_proj`` give 16), because vLLM requires merged GEMMs' parts to be whole blocks
(``validate_fp8_block_shape``) and whole groups.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from kimi.errors import KimiError
from kimi.fork.fsutil import check_replaceable, default_mode, sha256_file, staged_folder, write_atomic
from kimi.fork.release import upstream_release
from kimi.log import sayer
from kimi.models import OUTPUT_KEYS
from kimi.models.tokenizer import copy_tokenizer_files

SCHEMES = ("fp8-block", "int4-experts")
#: DeepSeek-V3's and Kimi-K2's ``weight_block_size`` (both sides).
FP8_BLOCK = 128
#: The smallest ``block_k`` a GPU kernel of vLLM (the v0.32 line's release) takes for block-FP8 linear layers: CUTLASS
#: and DeepGEMM take 128 x 128 blocks only, Triton's block GEMM (``w8a8_triton_block_scaled_mm``) steps through K one
#: block at a time and Triton's FP8 ``tl.dot`` needs K >= 32 ("Input shapes should have M >= 1, N >= 1 and K >= 32"),
#: and the Marlin fallback's repacking fails on 16 x 16 blocks (benchmarks/results/logs/quantized-h200*).
GPU_MIN_BLOCK_K = 32
#: Kimi-K2.5's INT4 group size (vllm#40357).
INT4_GROUP = 32
#: Largest finite float8 e4m3fn value.
E4M3_MAX = 448.0

_DECODER_LINEAR = re.compile(
    r"^model\.layers\.\d+\.(self_attn\.(q_a_proj|q_b_proj|q_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)"
    r"|mlp\.(shared_experts\.|experts\.\d+\.)?(gate_proj|up_proj|down_proj))\.weight$")
_ROUTED_EXPERT = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.\d+\.(gate_proj|up_proj|down_proj)\.weight$")
_ROUTER = re.compile(r"^model\.layers\.\d+\.mlp\.gate\.weight$")


def fitted(published: int, widths: Iterable[int]) -> int:
    """The largest power-of-two divisor of ``published`` that divides every one of ``widths``."""
    widths = [w for w in widths if w]
    size = published
    while size > 1 and any(w % size for w in widths):
        size //= 2
    return size


def fp8_block_size(cfg: dict) -> tuple[int, int]:
    """``(block_n, block_k)`` for a DeepSeek-V3 text config: :data:`FP8_BLOCK` fitted to the widths vLLM needs whole
    blocks of (output: ``q_a_proj`` before the merged ``kv_a_proj_with_mqa``, the dense and shared-expert
    ``gate_proj`` before ``up_proj``, the routed experts' ``w13``; input: every quantized layer's, since the
    activations are quantized in groups of ``block_k`` (``per_token_group_quant_fp8``): the hidden size,
    ``q_lora_rank`` (``q_b_proj``), ``kv_lora_rank`` (``kv_b_proj``), the heads' values (``o_proj``), the dense and
    the experts' widths (``down_proj``))."""
    moe = cfg.get("moe_intermediate_size", 0)
    outputs = [cfg.get("q_lora_rank") or 0, cfg["intermediate_size"], moe * cfg.get("n_shared_experts", 0), moe]
    inputs = [cfg["hidden_size"], cfg.get("q_lora_rank") or 0, cfg.get("kv_lora_rank") or 0,
              cfg["num_attention_heads"] * cfg.get("v_head_dim", 0), cfg["intermediate_size"], moe,
              moe * cfg.get("n_shared_experts", 0)]
    return fitted(FP8_BLOCK, outputs), fitted(FP8_BLOCK, inputs)


def fp8_gpu_refusal(block: tuple[int, int]) -> str | None:
    """Why upstream vLLM cannot serve block-FP8 weights of ``block`` (``(block_n, block_k)``) on a GPU, or None.

    ``block_k`` is bounded from both sides: the activations are quantized in groups of ``block_k`` along every
    input width (``per_token_group_quant_fp8`` asserts whole groups), so it must divide the widths
    (:func:`fp8_block_size`), and the GEMMs need at least :data:`GPU_MIN_BLOCK_K`."""
    if block[1] >= GPU_MIN_BLOCK_K:
        return None
    return (f"blocks of {block[1]} along K are below the {GPU_MIN_BLOCK_K} that vLLM {upstream_release()}'s GPU "
            "block-FP8 GEMMs need (Triton's FP8 dot takes K >= 32; CUTLASS and DeepGEMM take 128 x 128; the "
            "Marlin fallback fails to repack them), and no larger block divides this target's input widths (the "
            "activations are quantized in whole groups of the block): the checkpoint loads in transformers, but vLLM "
            "serves it neither on a GPU nor (patch 0016 says why) on a CPU")


def int4_group_size(cfg: dict) -> int:
    """:data:`INT4_GROUP` fitted to the routed experts' input widths (hidden size, ``moe_intermediate_size``)."""
    return fitted(INT4_GROUP, [cfg["hidden_size"], cfg["moe_intermediate_size"]])


def fp8_block_quantize(weight, block: tuple[int, int]):
    """``(fp8 weight, float32 weight_scale_inv)`` of a 2-D weight ``[out, in]``: per block the scale is the block's
    largest magnitude over :data:`E4M3_MAX` (partial blocks at the edges included), the weight divided by it."""
    import torch

    out, inp = weight.shape
    bn, bk = block
    rows, cols = -(-out // bn), -(-inp // bk)
    padded = torch.zeros(rows * bn, cols * bk, dtype=torch.float32)
    padded[:out, :inp] = weight.float()
    blocks = padded.view(rows, bn, cols, bk)
    scale_inv = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-12) / E4M3_MAX
    scaled = (blocks / scale_inv[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).view(rows * bn, cols * bk)
    return scaled[:out, :inp].to(torch.float8_e4m3fn).contiguous(), scale_inv.contiguous()


def fp8_block_dequantize(weight, scale_inv, block: tuple[int, int]):
    """The float32 weight an fp8 ``weight`` and its ``weight_scale_inv`` stand for (DeepSeek-V3's weight_dequant)."""
    out, inp = weight.shape
    scale = scale_inv.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:out, :inp]
    return weight.float() * scale


def int4_args(group: int):
    """compressed-tensors' ``QuantizationArgs`` of the INT4 experts: 4-bit int, symmetric, group-wise."""
    from compressed_tensors.quantization import QuantizationArgs

    return QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=group)


def int4_group_quantize(weight, group: int) -> dict:
    """``{"weight_packed", "weight_scale", "weight_shape"}`` of a 2-D bf16 weight ``[out, in]`` (``in`` a multiple
    of ``group`` and of 8) as compressed-tensors' pack-quantized compressor writes them: int32 ``[out, in / 8]``,
    bf16 ``[out, in / group]``, int64 ``[2]``."""
    import torch
    from compressed_tensors.compressors import pack_to_int32
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    out, inp = weight.shape
    if inp % group or inp % 8:
        raise KimiError(f"an expert weight of width {inp} is not a whole number of groups of {group} (and of 8)")
    args = int4_args(group)
    grouped = weight.float().view(out, inp // group, group)
    scale, zero = calculate_qparams(grouped.amin(-1), grouped.amax(-1), args)
    scale = scale.to(torch.bfloat16)
    values = quantize(weight.float(), scale.float(), zero, args, dtype=torch.int8)
    return {"weight_packed": pack_to_int32(values, 4), "weight_scale": scale.contiguous(),
            "weight_shape": torch.tensor([out, inp], dtype=torch.int64)}


def int4_group_dequantize(packed, scale, shape, group: int):
    """The float32 weight of ``int4_group_quantize``'s ``weight_packed``, ``weight_scale`` and ``weight_shape``,
    unpacked and scaled by compressed-tensors itself."""
    import torch
    from compressed_tensors.compressors import unpack_from_int32
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    values = unpack_from_int32(packed, 4, torch.Size(shape.tolist()))
    return dequantize(values, scale.float(), None, int4_args(group), dtype=torch.float32)


def _fp8_tensors(tensors: dict, cfg: dict) -> tuple[dict, dict]:
    block = fp8_block_size(cfg)
    written = {}
    for name, tensor in tensors.items():
        if _DECODER_LINEAR.match(name):
            written[name], written[name + "_scale_inv"] = fp8_block_quantize(tensor, block)
        else:
            written[name] = tensor
    return written, {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                     "weight_block_size": list(block)}


def _int4_tensors(tensors: dict, cfg: dict) -> tuple[dict, dict]:
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme

    group = int4_group_size(cfg)
    written, ignore = {}, ["lm_head"]
    for name, tensor in tensors.items():
        if _ROUTED_EXPERT.match(name):
            for suffix, value in int4_group_quantize(tensor, group).items():
                written[name.removesuffix("weight") + suffix] = value
            continue
        if _DECODER_LINEAR.match(name) or _ROUTER.match(name):
            ignore.append(name.removesuffix(".weight"))
        written[name] = tensor
    config = QuantizationConfig(config_groups={"group_0": QuantizationScheme(targets=["Linear"],
                                                                             weights=int4_args(group))},
                                format="pack-quantized", quantization_status="compressed", ignore=ignore)
    return written, config.model_dump(mode="json")


def quantize_target(source: Path, out: Path, scheme: str, force: bool = False) -> dict:
    """Write ``source`` (a bf16 DeepSeek-V3-architecture target folder with one ``model.safetensors``) to ``out``
    quantized by ``scheme`` (one of :data:`SCHEMES`; see the module docstring), tokenizer files copied, with a
    MANIFEST.json (scheme, quantization config, source digest, file digests). The folder appears whole or not at
    all. Returns the manifest.

    Raises:
        KimiError: an unknown scheme, a source that is not such a target (already quantized, sharded, another
            architecture), or an ``out`` that may not be replaced (``source`` itself, a folder holding it or inside
            it, or one that is not an earlier quantized copy: ``check_replaceable``, ``OUTPUT_KEYS["quantize"]``).
    """
    import torch
    from safetensors.torch import load_file, save_file

    if scheme not in SCHEMES:
        raise KimiError(f"unknown quantization scheme {scheme!r}: choose one of {', '.join(SCHEMES)}")
    cfg = json.loads((source / "config.json").read_text()) if (source / "config.json").is_file() else None
    weights = source / "model.safetensors"
    if cfg is None or not weights.is_file():
        raise KimiError(f"{source} is not a target folder with config.json and one model.safetensors")
    if cfg.get("model_type") not in ("deepseek_v3", "kimi_k2") or "quantization_config" in cfg:
        raise KimiError(f"{source}: a bf16 DeepSeek-V3-architecture target is needed (model_type "
                        f"{cfg.get('model_type')!r}{', already quantized' if 'quantization_config' in cfg else ''})")
    check_replaceable(out, "MANIFEST.json", force, keep=(Path.cwd(),), inputs=(source,),
                      marker_keys=OUTPUT_KEYS["quantize"])
    say = sayer("models")
    tensors = {name: t.to(torch.bfloat16) if t.is_floating_point() else t for name, t in load_file(weights).items()}
    say(f"quantizing {source} ({len(tensors)} tensors) as {scheme}")
    written, quant = (_fp8_tensors if scheme == "fp8-block" else _int4_tensors)(tensors, cfg)
    refusal = fp8_gpu_refusal(tuple(quant["weight_block_size"])) if scheme == "fp8-block" else None
    if refusal:
        say(f"warning: {out}: {refusal}")
    with staged_folder(out) as staging:
        save_file(written, staging / "model.safetensors", metadata={"format": "pt"})
        (staging / "model.safetensors").chmod(default_mode())
        write_atomic(staging / "config.json", json.dumps({**cfg, "quantization_config": quant}, indent=2) + "\n")
        copy_tokenizer_files(source, staging)
        manifest = {"scheme": scheme, "quantization_config": quant, "source": str(source),
                    "source_weights_sha256": sha256_file(weights),
                    "files": {p.name: sha256_file(p) for p in sorted(staging.iterdir()) if p.is_file()}}
        write_atomic(staging / "MANIFEST.json", json.dumps(manifest, indent=2) + "\n")
    say(f"wrote {out}")
    return manifest
