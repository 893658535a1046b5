"""Hook of patch ``cpu-quantization-check``: ``CpuPlatform.check_and_update_config`` asks, before the engine starts,
whether vLLM's CPU backend has a kernel for the target's quantization on this host (:mod:`kimi.cpu_quantization`)."""

from __future__ import annotations

from typing import Any

from kimi.cpu_quantization.check import CpuQuantizationError, cpu_refusal


def check_cpu_quantization(vllm_config: Any) -> None:
    """Refuse a target whose quantization vLLM's CPU backend cannot run on this host.

    Args:
        vllm_config: the ``VllmConfig`` being built on the CPU platform, ``quant_config`` parsed.

    Raises:
        CpuQuantizationError: block-FP8 linear layers or experts, or WNA16 routed experts, that no CPU kernel of
            vLLM's takes here; the message names the quantization, what is missing and the fix.
    """
    model_config, quant_config = vllm_config.model_config, vllm_config.quant_config
    if model_config is None or quant_config is None:
        return
    refusal = cpu_refusal(quant_config, model_config, vllm_config.kernel_config)
    if refusal is not None:
        raise CpuQuantizationError(refusal.message(str(model_config.model)))
