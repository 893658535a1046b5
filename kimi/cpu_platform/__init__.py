"""A CPU platform for vLLM made of torch alone (no vLLM CPU extension, no triton-cpu)."""

from __future__ import annotations

import importlib.util
import os

PLATFORM = "kimi.cpu_platform.platform.TorchCpuPlatform"


def activate() -> str | None:
    """The ``vllm.platform_plugins`` entry point: this platform's class path, or None.

    Active where vLLM was installed without compiled kernels (no ``vllm._C``) and torch sees no GPU.
    """
    import torch

    if importlib.util.find_spec("vllm._C") is not None or torch.cuda.is_available():
        return None
    # Kernels off the hot path run in Triton's interpreter; Triton decides at
    # decoration time, so this is set before any vLLM kernel module is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    return PLATFORM
