"""MLA on vLLM's CPU platform through the fork's ``CPU_MLA`` backend (patch ``0006-cpu-mla-backend``).

``CpuPlatform`` calls :func:`attention_backend` where upstream raises "MLA is not supported on CPU", and
:func:`configure` from ``check_and_update_config`` for MLA models.  The backend itself is
``kimi.cpu_mla`` (torch arithmetic in ``ops``, vLLM classes in ``backend``).
"""

from __future__ import annotations

from typing import Any

BACKEND = "kimi.cpu_mla.backend.CpuMLABackend"
NO_PREFILL = "kimi.cpu_mla.backend.CpuMLANoPrefill"


def attention_backend() -> str:
    """Register the CPU MLA prefill placeholder as vLLM's CUSTOM MLA prefill backend; return the backend path.

    Called from ``CpuPlatform.get_attn_backend_cls`` in every process that builds MLA layers, before the
    layer picks its prefill backend (``vllm/model_executor/layers/attention/mla_attention.py``).
    """
    from vllm.v1.attention.backends.mla.prefill.registry import (
        MLAPrefillBackendEnum,
        register_mla_prefill_backend,
    )

    register_mla_prefill_backend(MLAPrefillBackendEnum.CUSTOM, NO_PREFILL)
    return BACKEND


def configure(vllm_config: Any) -> None:
    """For an MLA model on CPU: every token goes through ``CPU_MLA``'s decode path, so the MLA prefill slot
    is vLLM's CUSTOM one (filled by :func:`attention_backend`) unless the user chose a prefill backend.
    Chunked prefill and prefix caching stay on (the backend handles both)."""
    from vllm.v1.attention.backends.mla.prefill.registry import MLAPrefillBackendEnum

    attention_config = vllm_config.attention_config
    if attention_config.mla_prefill_backend is None:
        attention_config.mla_prefill_backend = MLAPrefillBackendEnum.CUSTOM
