"""MLA attention on vLLM's CPU platform: the fork's ``CPU_MLA`` backend (patch 0006).

``ops`` holds the torch arithmetic (latent-cache writes, paged absorbed attention), ``backend`` the
vLLM classes. :func:`select_backend` is what the patched ``CpuPlatform`` calls.
"""

BACKEND = "kimi.cpu_mla.backend.CpuMLABackend"
NO_PREFILL = "kimi.cpu_mla.backend.CpuMLANoPrefill"


def select_backend() -> str:
    """Register the CPU MLA prefill placeholder as vLLM's CUSTOM MLA prefill backend; return the backend path.

    Called from ``CpuPlatform.get_attn_backend_cls`` in every process that builds MLA layers, before the
    layer picks its prefill backend (``vllm/model_executor/layers/attention/mla_attention.py``); the platform's
    ``check_and_update_config`` sets ``attention_config.mla_prefill_backend`` to CUSTOM for MLA models.
    """
    from vllm.v1.attention.backends.mla.prefill.registry import (
        MLAPrefillBackendEnum,
        register_mla_prefill_backend,
    )

    register_mla_prefill_backend(MLAPrefillBackendEnum.CUSTOM, NO_PREFILL)
    return BACKEND
