"""Quantized targets that vLLM's CPU backend has no kernel for on this host, refused while the config is built.

Reached through one hook call at the top of ``CpuPlatform.check_and_update_config`` (patch
``0016-cpu-quantization-check``, its hook ``kimi/hooks/cpu_quantization_check.py``): the model config and the parsed
quantization config exist there, the engine, the model and its weights do not. Upstream (the v0.32 line's vLLM) starts
the engine and fails while the worker builds the model (or, for FP8 experts, after it has loaded every weight), with a
kernel-selection error deep in its traceback; the hook raises one error instead (:class:`CpuQuantizationError`, the
message of :func:`cpu_refusal`'s :class:`Refusal`) that names the quantization, what the host lacks and the fix.

The decision is vLLM's own: the check describes the target's layers as vLLM's quantization methods would and asks
vLLM's kernel choice (its AMX / zentorch probes and its block, group and routing rules), so a host or a kernel that
upstream serves is let through. Three cases are checked:

* block-FP8 linear layers (``quant_method: fp8`` with ``weight_block_size``, DeepSeek-V3, Kimi-K2; or
  compressed-tensors float 8-bit ``strategy: block`` weights, llm-compressor's FP8_BLOCK, read for the decoder's
  dense projections as ``CompressedTensorsConfig`` reads them): the kernel chosen as ``Fp8LinearMethod`` /
  ``CompressedTensorsW8A8Fp8`` choose it (``choose_scaled_mm_linear_kernel`` over vLLM's CPU block-FP8 list:
  ``CPUFp8W8A8BlockScaledMMKernel``, ``CPUFp8BlockScaledMMKernel``; both need AMX tiles and ``[32n, 128]`` blocks);
* block-FP8 routed experts of a DeepSeek-V3-family decoder: ``select_fp8_moe_backend`` with the weight key
  ``Fp8MoEMethod`` / ``CompressedTensorsW8A8Fp8MoEMethod`` build and the layer's ``FusedMoEConfig`` (vLLM's CPU FP8
  experts, ``CPUExpertsFp8W8A8``: AMX-FP8, ``CPUExpertsFp8``: AMX tiles, take 128x128 blocks only; with none upstream
  picks backend NONE and fails in ``process_weights_after_loading``);
* WNA16 routed experts (compressed-tensors ``pack-quantized``, 4- or 8-bit int; Kimi-K2.5's INT4) of a
  DeepSeek-V3-family decoder: ``select_wna16_moe_backend`` with the weight key ``CompressedTensorsWNA16MoEMethod``
  builds, for each distinct scheme the MoE layers' experts have (``ZentorchExpertsInt4``: AMD zentorch;
  ``CPUExpertsInt4``: AMX tiles, symmetric 4-bit, a group size other than 32, softmax top-k routing). Neither takes
  DeepSeek-V3's routing or 8-bit weights, so such a target never runs there.

Anything else is left to vLLM: other methods, dense INT4 layers (``CPUWNA16LinearKernel`` runs them without AMX),
per-tensor and per-channel FP8, an explicit ``--moe-backend`` (for the experts), other MoE architectures, and any
target whose description raises (a vLLM whose internals moved on is not refused by a stale reading of them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GPU_FIX = "serve it on a GPU"
BF16_FIX = "serve a bf16 (dequantized) copy of the checkpoint on this CPU"
AMX_CPU = "AMX tiles (Intel Sapphire Rapids or newer)"
BUILD_FAILS = "fail while building the model"
LOAD_FAILS = "fail after loading every weight, with no FP8 MoE backend to prepare the experts for"

#: Routing methods in words (vLLM's ``RoutingMethodType`` names).
ROUTING_WORDS = {"DeepSeekV3": "DeepSeek-V3's router (DeepSeekV3 routing: grouped sigmoid top-k with a "
                               "score-correction bias)"}
#: What the device probe of vLLM's CPU MoE experts classes asks for, in words.
DEVICE_NEEDS = {"CPUExpertsInt4": f"needs {AMX_CPU}, which this CPU lacks",
                "CPUExpertsFp8": f"needs {AMX_CPU}, which this CPU lacks",
                "CPUExpertsFp8W8A8": "needs native AMX-FP8, which this CPU lacks",
                "ZentorchExpertsInt4": "needs AMD's zentorch (vLLM's ZenCpuPlatform), absent here"}
#: Layer-0/MoE-layer projections whose compressed-tensors scheme is read as vLLM's dense linear layers' (unfused
#: checkpoint names: the model's fused-name mapping does not exist before the model does).
DENSE_PROJECTIONS = ("self_attn.q_a_proj", "self_attn.q_proj", "self_attn.kv_a_proj_with_mqa", "self_attn.kv_b_proj",
                     "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj", "mlp.shared_experts.down_proj")
#: Where a decoder's layers sit: a text model's own, and a multimodal wrapper's (Kimi-K2.5: ``language_model.``).
ROOTS = ("", "language_model.")


class CpuQuantizationError(ValueError):
    """vLLM's CPU backend has no kernel for the target's quantization on this host; the message names the fix."""


@dataclass(frozen=True)
class Refusal:
    """Why a quantized target cannot run here: the quantization in words, what is missing, the fixes, and how
    upstream would otherwise fail."""

    quantization: str
    missing: str
    fixes: tuple[str, ...]
    fails: str = BUILD_FAILS

    def message(self, model: str) -> str:
        from vllm import __version__

        fixes = ", or ".join(self.fixes)
        return (f"vLLM {__version__.split('+')[0]}'s CPU backend cannot serve the target {model} on this host: "
                f"{self.quantization}; {self.missing}. vLLM would otherwise start the engine and {self.fails}. "
                f"Fix: {fixes}.")


def amx_tiles() -> bool:
    """The AMX probe vLLM's CPU kernels use (``torch.cpu._is_amx_tile_supported``)."""
    import torch

    return bool(torch.cpu._is_amx_tile_supported())


def cpu_refusal(quant_config: Any, model_config: Any, kernel_config: Any = None) -> Refusal | None:
    """The :class:`Refusal` for ``quant_config`` (a vLLM ``QuantizationConfig``) on the target of ``model_config``
    (``dtype``, ``hf_config``, ``hf_text_config``) on this host, or None where vLLM's CPU kernels take it or the
    check does not know the case."""
    name = quant_config.get_name()
    auto_moe = getattr(kernel_config, "moe_backend", "auto") == "auto"
    try:
        if name == "fp8" and getattr(quant_config, "weight_block_size", None):
            return _fp8_config(quant_config, model_config, auto_moe)
        if name == "compressed-tensors":
            return _compressed_tensors(quant_config, model_config, auto_moe)
    except Exception as exc:  # a description vLLM's internals no longer take: leave the target to vLLM
        from vllm.logger import init_logger

        init_logger("vllm.kimi.cpu_quantization").debug("CPU quantization check skipped: %r", exc)
    return None


def _or_none(part: Any, *args: Any) -> Any:
    """``part(*args)``, or None where it raises: a part of the check whose reading of vLLM fails is skipped alone
    (the experts of a target whose linear layers are refused anyway)."""
    try:
        return part(*args)
    except Exception as exc:
        from vllm.logger import init_logger

        init_logger("vllm.kimi.cpu_quantization").debug("CPU quantization check part skipped: %r", exc)
        return None


def _raw_quantization(model_config: Any) -> dict:
    for config in (model_config.hf_config, model_config.hf_text_config):
        raw = getattr(config, "quantization_config", None)
        if isinstance(raw, dict):
            return raw
        if hasattr(raw, "to_dict"):
            return raw.to_dict()
    return {}


def _deepseek_text(model_config: Any) -> Any | None:
    """The text config of a DeepSeek-V2/V3-family decoder (``DeepseekV2Model``), else None."""
    from kimi.drafter.serve_checks import DEEPSEEK_DECODERS

    text = model_config.hf_text_config
    return text if str(getattr(text, "model_type", "")) in DEEPSEEK_DECODERS else None


def _moe_layers(text: Any) -> list[int]:
    """Indices of the layers with routed experts in vLLM's DeepSeek-V2/V3 decoder (``DeepseekV2DecoderLayer``)."""
    if text is None or getattr(text, "n_routed_experts", None) is None:
        return []
    first, freq = int(getattr(text, "first_k_dense_replace", 0) or 0), int(getattr(text, "moe_layer_freq", 1) or 1)
    return [i for i in range(int(text.num_hidden_layers)) if i >= first and i % freq == 0]


def _routing(text: Any) -> Any:
    """The ``RoutingMethodType`` of ``DeepseekV2MoE``'s router arguments."""
    from vllm.model_executor.layers.fused_moe.config import get_routing_method_type

    return get_routing_method_type(
        scoring_func=getattr(text, "scoring_func", "softmax"), top_k=int(text.num_experts_per_tok),
        renormalize=bool(getattr(text, "norm_topk_prob", False)), num_expert_group=getattr(text, "n_group", 1),
        has_e_score_bias=getattr(text, "topk_method", None) == "noaux_tc")


def _moe_config(text: Any, dtype: Any) -> Any:
    """The ``FusedMoEConfig`` of ``DeepseekV2MoE``'s experts on one CPU process (no tensor or expert parallelism)."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig, FusedMoEParallelConfig

    experts = int(text.n_routed_experts)
    return FusedMoEConfig(
        num_experts=experts, experts_per_token=int(text.num_experts_per_tok), hidden_dim=int(text.hidden_size),
        intermediate_size=int(text.moe_intermediate_size), num_local_experts=experts, num_logical_experts=experts,
        activation=MoEActivation(str(getattr(text, "hidden_act", "silu"))), device="cpu",
        routing_method=_routing(text), moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(), in_dtype=dtype)


def _kernel_lacks(kernel: Any, moe_config: Any, weight_key: Any, activation_key: Any,
                  scheme_words: str) -> list[tuple[str, str]]:
    """What a MoE experts class of vLLM's lacks for these experts, as ``(part, words)`` (part: device, scheme,
    routing or other): its device probe, weight scheme and routing rules, then the rest of ``is_supported_config``;
    empty when it takes them."""
    from vllm.model_executor.layers.fused_moe.modular_kernel import FusedMoEActivationFormat

    lacks = []
    if not kernel._supports_current_device():
        lacks.append(("device", DEVICE_NEEDS.get(kernel.__name__, "does not run on this CPU (vLLM's device probe)")))
    if not kernel._supports_quant_scheme(weight_key, activation_key):
        lacks.append(("scheme", scheme_words))
    routing = moe_config.routing_method
    if not kernel._supports_routing_method(routing, weight_key, activation_key):
        lacks.append(("routing", f"does not take {routing.name} routing"))
    if not lacks:
        supported, reason = kernel.is_supported_config(kernel, moe_config, weight_key, activation_key,
                                                        FusedMoEActivationFormat.Standard)
        if not supported:
            lacks.append(("other", str(reason)))
    return lacks


def _in_words(kernel: Any, lacks: list[tuple[str, str]]) -> str:
    return f"{kernel.__name__} " + ", and ".join(words for _, words in lacks)


# -- block-FP8 -----------------------------------------------------------------------------------------------------

def _fp8_config(quant_config: Any, model_config: Any, auto_moe: bool) -> Refusal | None:
    """``quant_method: fp8`` with ``weight_block_size``: the linear layers and the routed experts that
    ``Fp8Config.get_quant_method`` gives ``Fp8LinearMethod`` / ``Fp8MoEMethod``."""
    from vllm.model_executor.layers.quantization.utils.quant_utils import is_layer_skipped

    block = [int(b) for b in quant_config.weight_block_size]
    raw = _raw_quantization(model_config)
    quantization = (f"it is block-FP8 (quant_method fp8, fmt {raw.get('fmt', 'e4m3')}, weight_block_size {block}, "
                    f"{quant_config.activation_scheme} activations)")
    text = _deepseek_text(model_config) if auto_moe else None
    ignored, mapping = quant_config.ignored_layers, quant_config.packed_modules_mapping
    mode = getattr(quant_config, "ignored_layers_match_mode", "exact")
    experts = [i for i in _moe_layers(text)  # quantized under every root the decoder may sit at
               if not any(is_layer_skipped(f"{root}model.layers.{i}.mlp.experts", ignored, mapping, match_mode=mode)
                          for root in ROOTS)]
    moe_weight_key = _or_none(_fp8_moe_weight_key, block, text, model_config)
    return _fp8_block(quantization, block, model_config, text, experts if moe_weight_key else [], moe_weight_key)


def _fp8_moe_weight_key(block: list[int], text: Any, model_config: Any) -> Any:
    """``Fp8MoEMethod``'s expert weight key: the checkpoint block as ``resolve_fp8_moe_weight_block_shape`` adapts
    it to the layer (one process: refined only where the experts' width is not whole blocks)."""
    if text is None or getattr(text, "n_routed_experts", None) is None:
        return None
    from vllm.model_executor.layers.fused_moe.oracle.fp8 import resolve_fp8_moe_weight_block_shape
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        GroupShape,
        create_fp8_quant_key,
        kFp8Dynamic128Sym,
    )

    shape, _ = resolve_fp8_moe_weight_block_shape(_moe_config(text, model_config.dtype), list(block),
                                                  kFp8Dynamic128Sym, True)
    return create_fp8_quant_key(static=True, group_shape=GroupShape(*shape))


def _fp8_block(quantization: str, block: list[int] | None, model_config: Any, text: Any, experts: list[int],
               moe_weight_key: Any) -> Refusal | None:
    """Block-FP8 linear layers (``block``; None: none quantized so) and routed experts (``experts``: the MoE layers
    whose experts are block-FP8 with ``moe_weight_key``) put to vLLM's CPU kernels; one refusal for both."""
    import torch

    dtype, amx = model_config.dtype, amx_tiles()
    dtype_fits = dtype in (torch.bfloat16, torch.float32)
    parts, fails = [], BUILD_FAILS
    amx_fixes, dtype_fixes, linears_refused = not amx, amx and not dtype_fits, False  # what a fix would mend
    if block is not None and (linear := _fp8_linear_lacks(block, dtype)) is not None:
        lacks, block_fits = linear
        parts.append("none of vLLM's CPU block-FP8 GEMMs can run its linear layers: " + "; ".join(lacks))
        amx_fixes, dtype_fixes, linears_refused = amx_fixes and block_fits, dtype_fixes and block_fits, True
    if experts and (found := _or_none(_fp8_experts_lacks, text, dtype, moe_weight_key)) is not None:
        words, amx_only = found
        layers = f"{len(experts)} MoE layer" + ("s" if len(experts) != 1 else "")
        parts.append(f"none of vLLM's CPU FP8 MoE kernels can run its routed experts (mlp.experts of {layers}): "
                     + "; ".join(words))
        amx_fixes, dtype_fixes = amx_fixes and amx_only, False
        fails = BUILD_FAILS if linears_refused else LOAD_FAILS
    if not parts:
        return None
    fixes = [GPU_FIX]
    if amx_fixes:
        bf16 = "" if dtype_fits or not linears_refused else " with --dtype bfloat16"
        fixes.append(f"on a CPU with {AMX_CPU}{bf16}")
    elif dtype_fixes:
        fixes.append("serve it with --dtype bfloat16")
    return Refusal(quantization, "; and ".join(parts), (*fixes, BF16_FIX), fails)


def _fp8_linear_lacks(block: list[int], dtype: Any) -> tuple[list[str], bool] | None:
    """Block-FP8 linear layers: ``Fp8LinearMethod``'s layer description put to vLLM's CPU kernel list. None where a
    kernel takes them, else what they lack in words and whether the block is one the kernels take."""
    import torch
    from vllm.model_executor.kernels.linear import _POSSIBLE_FP8_BLOCK_KERNELS, choose_scaled_mm_linear_kernel
    from vllm.model_executor.kernels.linear.scaled_mm import FP8ScaledMMLinearLayerConfig
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape, create_fp8_quant_key

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
    block_fits, dtype_fits = block[1] == 128 and block[0] % 32 == 0, dtype in (torch.bfloat16, torch.float32)
    lacks = ([f"they need {AMX_CPU}, which this CPU lacks"] if not amx_tiles() else []) + (
        [f"they take weight_block_size [32n, 128] only, not {block}"] if not block_fits else []) + (
        [f"they compute in bfloat16 or float32 only, not {str(dtype).removeprefix('torch.')}"] if not dtype_fits
        else [])
    return lacks or vllm_reasons, block_fits


def _fp8_experts_lacks(text: Any, dtype: Any, weight_key: Any) -> tuple[list[str], bool] | None:
    """Block-FP8 routed experts: ``select_fp8_moe_backend`` with the layer's ``FusedMoEConfig`` and the method's
    keys. None where it picks a backend, else why each CPU FP8 experts class refuses, in words, and whether an AMX
    CPU would do (a class lacks only this CPU's AMX tiles)."""
    from vllm.model_executor.layers.fused_moe.oracle import fp8 as fp8_moe
    from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8Dynamic128Sym, kFp8Static128BlockSym

    moe_config, activation_key = _moe_config(text, dtype), kFp8Dynamic128Sym
    backend, _ = fp8_moe.select_fp8_moe_backend(moe_config, weight_key, activation_key)
    if backend != fp8_moe.Fp8MoeBackend.NONE:
        return None
    shape = list(weight_key.scale.group_shape)
    words, amx_only = [], False
    for backend in fp8_moe._get_priority_backends(moe_config, weight_key, activation_key):
        if not backend.value.startswith("CPU"):
            continue
        for kernel in fp8_moe.backend_to_kernel_cls(backend):
            takes_128 = kernel._supports_quant_scheme(kFp8Static128BlockSym, activation_key)
            lacks = _kernel_lacks(kernel, moe_config, weight_key, activation_key,
                                  f"takes 128x128 weight blocks only, not {shape}" if takes_128
                                  else f"does not take this weight scheme ({weight_key})")
            words.append(_in_words(kernel, lacks))
            amx_only = amx_only or lacks == [("device", DEVICE_NEEDS["CPUExpertsFp8"])]
    return words, amx_only


# -- compressed-tensors --------------------------------------------------------------------------------------------

def _compressed_tensors(quant_config: Any, model_config: Any, auto_moe: bool) -> Refusal | None:
    """compressed-tensors: block-FP8 dense layers and experts (llm-compressor's FP8_BLOCK), then WNA16 experts."""
    text = _deepseek_text(model_config) if auto_moe else None
    schemes = _experts_schemes(quant_config, _moe_layers(text))
    fp8_dense = _ct_fp8_blocks(quant_config, model_config)
    fp8_experts = [i for i, scheme in schemes if _ct_is_fp8_block(quant_config, scheme)]
    if fp8_dense or fp8_experts:
        from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8Static128BlockSym

        for block in fp8_dense or [None]:
            shown = block or next(list(s["weights"].block_structure) for _, s in schemes
                                  if _ct_is_fp8_block(quant_config, s))
            quantization = (f"it is block-FP8 (quant_method compressed-tensors, format "
                            f"{_raw_quantization(model_config).get('format', 'float-quantized')}, 8-bit float "
                            f"weights, block_structure {shown}, dynamic activations)")
            # CompressedTensorsW8A8Fp8MoEMethod keys every block strategy as 128x128 blocks
            refusal = _fp8_block(quantization, block, model_config, text, fp8_experts, kFp8Static128BlockSym)
            if refusal is not None:
                return refusal
    seen = []
    for _, scheme in schemes:
        if scheme not in seen:
            seen.append(scheme)
            refusal = _wna16_experts(quant_config, model_config, text, scheme)
            if refusal is not None:
                return refusal
    return None


def _ct_is_fp8_block(quant_config: Any, scheme: dict) -> bool:
    """A scheme ``CompressedTensorsConfig`` gives ``CompressedTensorsW8A8Fp8`` (MoE method) with block weights."""
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes import CompressedTensorsW8A8Fp8
    from vllm.model_executor.layers.quantization.compressed_tensors.utils import is_activation_quantization_format

    weights, acts = scheme.get("weights"), scheme.get("input_activations")
    return (weights is not None and str(getattr(weights.strategy, "value", weights.strategy)) == "block"
            and is_activation_quantization_format(scheme.get("format") or quant_config.quant_format)
            and quant_config._is_fp8_w8a8(weights, acts)
            and quant_config._check_scheme_supported(CompressedTensorsW8A8Fp8.get_min_capability(), error=False))


def _ct_fp8_blocks(quant_config: Any, model_config: Any) -> list[list[int]]:
    """The distinct ``block_structure`` of the decoder's dense projections that ``CompressedTensorsConfig`` gives
    ``CompressedTensorsW8A8Fp8`` with block weights (layer 0, the first MoE layer and the last, both roots)."""
    text = model_config.hf_text_config
    count = int(getattr(text, "num_hidden_layers", 1) or 1)
    layers = sorted({0, count - 1, *_moe_layers(_deepseek_text(model_config))[:1]})
    linear = type("RowParallelLinear", (), {})()  # matched by class name ("Linear"), as vLLM's layers are
    blocks = []
    for i in layers:
        for root in ROOTS:
            for proj in DENSE_PROJECTIONS:
                scheme = quant_config.get_scheme_dict(linear, f"{root}model.layers.{i}.{proj}")
                if scheme and _ct_is_fp8_block(quant_config, scheme):
                    block = [int(b) for b in scheme["weights"].block_structure]
                    if block not in blocks:
                        blocks.append(block)
    return blocks


def _experts_schemes(quant_config: Any, layers: list[int]) -> list[tuple[int, dict]]:
    """``(layer, scheme)`` of the MoE layers whose routed experts compressed-tensors quantizes, looked up as
    ``CompressedTensorsMoEMethod`` does (the three projections of expert 0; ``Linear`` targets the fused experts
    too), under both the text model's names and a multimodal wrapper's; a layer whose lookups disagree (ignored
    under one name and not the other, projections apart) is left out (vLLM decides it)."""
    if not layers:
        return []
    routed_experts = type("RoutedExperts", (), {})()  # matched by class name, as vLLM's layer is
    quant_config._add_fused_moe_to_target_scheme_map()
    found = []
    for i in layers:
        schemes = [quant_config.get_scheme_dict(routed_experts, f"{root}model.layers.{i}.mlp.experts.0.{proj}")
                   for root in ROOTS for proj in ("gate_proj", "up_proj", "down_proj")]
        if schemes[0] is not None and all(s == schemes[0] for s in schemes):
            found.append((i, schemes[0]))
    return found


def _wna16_experts(quant_config: Any, model_config: Any, text: Any, scheme: dict) -> Refusal | None:
    """WNA16 routed experts (4- or 8-bit int, pack-quantized) of a DeepSeek-V3-family decoder: the weight key
    ``CompressedTensorsWNA16MoEMethod`` builds and the layer's ``FusedMoEConfig`` put to ``select_wna16_moe_backend``;
    where it finds none, why each CPU WNA16 MoE backend and kernel refuses, in words."""
    from vllm.model_executor.layers.fused_moe.oracle import int_wna16
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_wNa16 import (
        WNA16_SUPPORTED_TYPES_MAP,
        WNA16_ZP_SUPPORTED_TYPES_MAP,
    )
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        QuantKey,
        kInt4Static32GroupScale,
        kInt4StaticGroupScale,
        kInt8StaticGroupScale,
    )

    weights, acts = scheme.get("weights"), scheme.get("input_activations")
    if (weights is None or str(getattr(weights.type, "value", weights.type)) != "int" or weights.num_bits not in (4, 8)
            or scheme.get("format") != "pack-quantized" or not quant_config._is_wNa16_group_channel(weights, acts)):
        return None
    bits, group = int(weights.num_bits), -1 if weights.group_size is None else int(weights.group_size)
    scale = kInt8StaticGroupScale if bits == 8 else kInt4Static32GroupScale if group == 32 else kInt4StaticGroupScale
    weight_key = QuantKey((WNA16_SUPPORTED_TYPES_MAP if weights.symmetric else WNA16_ZP_SUPPORTED_TYPES_MAP)[bits],
                          scale, symmetric=weights.symmetric)
    moe_config = _moe_config(text, model_config.dtype)
    try:
        int_wna16.select_wna16_moe_backend(moe_config, weight_key, weights, may_have_zp=not weights.symmetric,
                                           may_have_bias=False, allow_tile_padding=True)
    except NotImplementedError as exc:
        if "No WNA16 MoE backend" not in str(exc):
            raise
    else:
        return None
    why_not = []
    for backend in int_wna16._get_priority_backends():
        reason = int_wna16._backend_incompatibility_reason(
            backend, moe_config, weights, may_have_zp=not weights.symmetric, may_have_bias=False,
            allow_tile_padding=True)
        if reason is not None:
            why_not.append(f"{backend.value}: {reason}")
            continue
        for kernel in int_wna16.backend_to_kernel_cls(backend):
            words = ("takes symmetric weights only" if not weights.symmetric
                     else f"takes 4-bit weights only, not {bits}-bit" if bits != 4
                     else "does not take group size 32" if group == 32
                     else f"does not take this weight scheme ({weight_key})")
            why_not.append(_in_words(kernel, _kernel_lacks(kernel, moe_config, weight_key, None, words)))
    routing = moe_config.routing_method
    quantization = (f"its routed experts are INT{bits} W{bits}A16 (quant_method compressed-tensors, format "
                    f"pack-quantized, {bits}-bit int {'symmetric' if weights.symmetric else 'asymmetric'} weights, "
                    + (f"group_size {group}" if group > 0 else "per channel") + ") behind "
                    + ROUTING_WORDS.get(routing.name, f"a router with {routing.name} routing"))
    missing = "no CPU MoE kernel of vLLM's takes them: " + "; ".join(why_not)
    return Refusal(quantization, missing, (GPU_FIX, BF16_FIX))
