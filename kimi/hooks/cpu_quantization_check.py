"""Quantized targets that vLLM's CPU backend has no kernel for on this host, refused while the config is built.

Reached through one hook call at the top of ``CpuPlatform.check_and_update_config`` (patch
``0016-cpu-quantization-check``): the model config and the parsed quantization config exist there, the engine, the
model and its weights do not. Upstream 0.32.0 starts the engine and fails while the worker builds the model, with a
kernel-selection error deep in its traceback; :func:`check_cpu_quantization` raises one error instead that names the
quantization, what the host lacks and the fix.

The decision is vLLM's own: the check describes the target's layers as vLLM's quantization methods would and asks
vLLM's kernel classes (their AMX / zentorch probes and their block, group and routing rules), so a host or a kernel
that upstream serves is let through. Two cases are checked:

* block-FP8 (``quant_method: fp8`` with ``weight_block_size``; DeepSeek-V3, Kimi-K2): the linear layers' kernel,
  chosen as ``Fp8LinearMethod`` chooses it (``choose_scaled_mm_linear_kernel`` over vLLM's CPU block-FP8 list:
  ``CPUFp8W8A8BlockScaledMMKernel``, ``CPUFp8BlockScaledMMKernel``; both need AMX tiles and ``[32n, 128]`` blocks);
* INT4 W4A16 routed experts (compressed-tensors ``pack-quantized``, 4-bit int; Kimi-K2.5) of a DeepSeek-V3-family
  decoder: vLLM's CPU WNA16 MoE backends (``ZentorchExpertsInt4``: AMD zentorch; ``CPUExpertsInt4``: AMX tiles,
  symmetric, a group size other than 32), checked for device, weight scheme and the decoder's routing, as
  ``select_wna16_moe_backend`` checks them. Neither takes DeepSeek-V3's routing, so such a target never runs there.

Anything else is left to vLLM: other methods, dense INT4 layers (``CPUWNA16LinearKernel`` runs them without AMX),
8-bit experts, FP8 experts, an explicit ``--moe-backend``, other MoE architectures, and any target whose description
raises (a vLLM whose internals moved on is not refused by a stale reading of them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GPU_FIX = "serve it on a GPU"
BF16_FIX = "serve the unquantized (bf16) checkpoint on this CPU"
AMX_CPU = "AMX tiles (Intel Sapphire Rapids or newer)"

#: Routing methods in words (``RoutingMethodType`` names of vLLM 0.32.0).
ROUTING_WORDS = {"DeepSeekV3": "DeepSeek-V3's router (DeepSeekV3 routing: grouped sigmoid top-k with a "
                               "score-correction bias)"}
#: What the device probe of vLLM's CPU WNA16 MoE experts classes asks for, in words.
DEVICE_NEEDS = {"CPUExpertsInt4": f"needs {AMX_CPU}, which this CPU lacks",
                "ZentorchExpertsInt4": "needs AMD's zentorch (vLLM's ZenCpuPlatform), absent here"}


class CpuQuantizationError(ValueError):
    """vLLM's CPU backend has no kernel for the target's quantization on this host; the message names the fix."""


@dataclass(frozen=True)
class Refusal:
    """Why a quantized target cannot run here: the quantization in words, what is missing, the fixes."""

    quantization: str
    missing: str
    fixes: tuple[str, ...]

    def message(self, model: str) -> str:
        from vllm import __version__

        fixes = ", or ".join(self.fixes)
        return (f"vLLM {__version__.split('+')[0]}'s CPU backend cannot serve the target {model} on this host: "
                f"{self.quantization}; {self.missing}. Without this check vLLM would start the engine and fail "
                f"while building the model. Fix: {fixes}.")


def amx_tiles() -> bool:
    """The AMX probe vLLM's CPU kernels use (``torch.cpu._is_amx_tile_supported``)."""
    import torch

    return bool(torch.cpu._is_amx_tile_supported())


def check_cpu_quantization(vllm_config: Any) -> None:
    """Refuse a target whose quantization vLLM's CPU backend cannot run on this host (see the module docstring).

    Args:
        vllm_config: the ``VllmConfig`` being built on the CPU platform, ``quant_config`` parsed.

    Raises:
        CpuQuantizationError: block-FP8 linear layers or INT4 W4A16 routed experts that no CPU kernel of vLLM's
            takes here; the message names the quantization, what is missing and the fix.
    """
    model_config, quant_config = vllm_config.model_config, vllm_config.quant_config
    if model_config is None or quant_config is None:
        return
    refusal = cpu_refusal(quant_config, model_config, vllm_config.kernel_config)
    if refusal is not None:
        raise CpuQuantizationError(refusal.message(str(model_config.model)))


def cpu_refusal(quant_config: Any, model_config: Any, kernel_config: Any = None) -> Refusal | None:
    """The :class:`Refusal` for ``quant_config`` (a vLLM ``QuantizationConfig``) on the target of ``model_config``
    (``dtype``, ``hf_config``, ``hf_text_config``) on this host, or None where vLLM's CPU kernels take it or the
    check does not know the case."""
    name = quant_config.get_name()
    try:
        if name == "fp8" and getattr(quant_config, "weight_block_size", None):
            return _fp8_block(quant_config, model_config)
        if name == "compressed-tensors" and getattr(kernel_config, "moe_backend", "auto") == "auto":
            return _int4_experts(quant_config, model_config)
    except Exception as exc:  # a description vLLM's internals no longer take: leave the target to vLLM
        from vllm.logger import init_logger

        init_logger("vllm.kimi.cpu_quantization").debug("CPU quantization check skipped: %r", exc)
    return None


def _raw_quantization(model_config: Any) -> dict:
    for config in (model_config.hf_config, model_config.hf_text_config):
        raw = getattr(config, "quantization_config", None)
        if isinstance(raw, dict):
            return raw
        if hasattr(raw, "to_dict"):
            return raw.to_dict()
    return {}


def _fp8_block(quant_config: Any, model_config: Any) -> Refusal | None:
    """Block-FP8 linear layers: ``Fp8LinearMethod``'s layer description put to vLLM's CPU kernel list."""
    import torch
    from vllm.model_executor.kernels.linear import _POSSIBLE_FP8_BLOCK_KERNELS, choose_scaled_mm_linear_kernel
    from vllm.model_executor.kernels.linear.scaled_mm import FP8ScaledMMLinearLayerConfig
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape, create_fp8_quant_key

    block = [int(b) for b in quant_config.weight_block_size]
    dtype = model_config.dtype
    layer = FP8ScaledMMLinearLayerConfig(
        weight_quant_key=create_fp8_quant_key(static=True, group_shape=GroupShape(*block)),
        activation_quant_key=create_fp8_quant_key(static=False, group_shape=GroupShape(1, block[0])),
        weight_shape=(32 * block[0], block[1]),  # any output width the kernels tile: only the block is the model's
        input_dtype=dtype, out_dtype=dtype)
    try:
        choose_scaled_mm_linear_kernel(layer, _POSSIBLE_FP8_BLOCK_KERNELS, quantization="fp8_block_w8a8")
    except ValueError as exc:
        vllm_reasons = [r.strip().rstrip(".") for r in str(exc).split("Reasons:", 1)[-1].splitlines() if r.strip()]
    else:
        return None
    raw = _raw_quantization(model_config)
    quantization = (f"it is block-FP8 (quant_method fp8, fmt {raw.get('fmt', 'e4m3')}, weight_block_size {block}, "
                    f"{quant_config.activation_scheme} activations)")
    amx, block_fits, dtype_fits = amx_tiles(), block[1] == 128 and block[0] % 32 == 0, dtype in (
        torch.bfloat16, torch.float32)
    lacks = ([f"they need {AMX_CPU}, which this CPU lacks"] if not amx else []) + (
        [f"they take weight_block_size [32n, 128] only, not {block}"] if not block_fits else []) + (
        [f"they compute in bfloat16 or float32 only, not {str(dtype).removeprefix('torch.')}"] if not dtype_fits
        else [])
    missing = "none of vLLM's CPU block-FP8 GEMMs can run its linear layers: " + "; ".join(lacks or vllm_reasons)
    fixes = [GPU_FIX]
    if block_fits and not amx:
        fixes.append(f"on a CPU with {AMX_CPU}" + ("" if dtype_fits else " with --dtype bfloat16"))
    elif block_fits and amx and not dtype_fits:
        fixes.append("serve it with --dtype bfloat16")
    return Refusal(quantization, missing, (*fixes, BF16_FIX))


def _moe_layers(text: Any) -> list[int]:
    """Indices of the layers with routed experts in vLLM's DeepSeek-V2/V3 decoder (``DeepseekV2DecoderLayer``)."""
    if getattr(text, "n_routed_experts", None) is None:
        return []
    first, freq = int(getattr(text, "first_k_dense_replace", 0) or 0), int(getattr(text, "moe_layer_freq", 1) or 1)
    return [i for i in range(int(text.num_hidden_layers)) if i >= first and i % freq == 0]


def _experts_scheme(quant_config: Any, layers: list[int]) -> dict | None:
    """The compressed-tensors scheme of the routed experts, looked up as ``CompressedTensorsMoEMethod`` does (the
    three projections of expert 0 of each MoE layer; ``Linear`` targets the fused experts too), under both the
    text model's names and a multimodal wrapper's (``language_model.``); None where some layer's experts are
    ignored or the layers disagree (the check then leaves the target to vLLM)."""
    routed_experts = type("RoutedExperts", (), {})()  # matched by class name, as vLLM's layer is
    quant_config._add_fused_moe_to_target_scheme_map()
    schemes = [quant_config.get_scheme_dict(routed_experts, f"{root}model.layers.{i}.mlp.experts.0.{proj}")
               for i in layers for root in ("", "language_model.") for proj in ("gate_proj", "up_proj", "down_proj")]
    first = schemes[0] if schemes else None
    return first if first is not None and all(s == first for s in schemes) else None


def _int4_experts(quant_config: Any, model_config: Any) -> Refusal | None:
    """INT4 W4A16 routed experts of a DeepSeek-V3-family decoder: the weight key ``CompressedTensorsWNA16MoEMethod``
    builds and the routing the decoder's router reports, put to vLLM's CPU WNA16 MoE backends in order."""
    from vllm.model_executor.layers.fused_moe.config import get_routing_method_type
    from vllm.model_executor.layers.fused_moe.oracle import int_wna16
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_wNa16 import (
        WNA16_SUPPORTED_TYPES_MAP,
        WNA16_ZP_SUPPORTED_TYPES_MAP,
    )
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        QuantKey,
        kInt4Static32GroupScale,
        kInt4StaticGroupScale,
    )

    from kimi.hooks.eagle3_drafter_checks import DEEPSEEK_DECODERS  # the DeepseekV2Model decoders

    text = model_config.hf_text_config
    if str(getattr(text, "model_type", "")) not in DEEPSEEK_DECODERS:
        return None
    scheme = _experts_scheme(quant_config, _moe_layers(text))
    if scheme is None:
        return None
    weights, acts = scheme.get("weights"), scheme.get("input_activations")
    if (weights is None or str(getattr(weights.type, "value", weights.type)) != "int" or weights.num_bits != 4
            or scheme.get("format") != "pack-quantized" or not quant_config._is_wNa16_group_channel(weights, acts)):
        return None
    group = -1 if weights.group_size is None else int(weights.group_size)
    weight_key = QuantKey((WNA16_SUPPORTED_TYPES_MAP if weights.symmetric else WNA16_ZP_SUPPORTED_TYPES_MAP)[4],
                          kInt4Static32GroupScale if group == 32 else kInt4StaticGroupScale,
                          symmetric=weights.symmetric)
    routing = get_routing_method_type(  # DeepseekV2MoE's router arguments
        scoring_func=getattr(text, "scoring_func", "softmax"), top_k=int(text.num_experts_per_tok),
        renormalize=bool(getattr(text, "norm_topk_prob", False)), num_expert_group=getattr(text, "n_group", 1),
        has_e_score_bias=getattr(text, "topk_method", None) == "noaux_tc")
    why_not = []
    for backend in int_wna16._get_priority_backends():
        reason = int_wna16._backend_incompatibility_reason(
            backend, None, weights, may_have_zp=not weights.symmetric, may_have_bias=False, allow_tile_padding=True)
        if reason is not None:
            why_not.append(f"{backend.value}: {reason}")
            continue
        for kernel in int_wna16.backend_to_kernel_cls(backend):
            lacks = _kernel_lacks(kernel, weights, weight_key, routing)
            if not lacks:
                return None
            why_not.append(f"{kernel.__name__} " + ", and ".join(lacks))
    quantization = (f"its routed experts are INT4 W4A16 (quant_method compressed-tensors, format pack-quantized, "
                    f"4-bit int {'symmetric' if weights.symmetric else 'asymmetric'} weights, "
                    + (f"group_size {group}" if group > 0 else "per channel") + ") behind "
                    + ROUTING_WORDS.get(routing.name, f"a router with {routing.name} routing"))
    missing = "no CPU MoE kernel of vLLM's takes them: " + "; ".join(why_not)
    return Refusal(quantization, missing, (GPU_FIX, BF16_FIX))


def _kernel_lacks(kernel: Any, weights: Any, weight_key: Any, routing: Any) -> list[str]:
    """What a WNA16 MoE experts class of vLLM's lacks for these experts (its device probe, weight scheme and routing
    rules: the parts of ``is_supported_config`` known before the layer exists); empty when it may take them."""
    lacks = []
    if not kernel._supports_current_device():
        lacks.append(DEVICE_NEEDS.get(kernel.__name__, "does not run on this CPU (vLLM's device probe)"))
    if not kernel._supports_quant_scheme(weight_key, None):
        lacks.append("takes symmetric weights only" if not weights.symmetric
                     else "does not take group size 32" if weights.group_size == 32
                     else f"does not take this weight scheme ({weight_key})")
    if not kernel._supports_routing_method(routing, weight_key, None):
        lacks.append(f"does not take {routing.name} routing")
    return lacks
