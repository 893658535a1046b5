"""Where vLLM's CPU platform picks the fork's ``CPU_MLA`` backend for MLA layers (patch ``0006-cpu-mla-backend``,
through the hook :mod:`kimi.hooks.cpu_mla_backend`).

Every scheduled token - prefill, chunked prefill, prefix-cache hits, decode, the ``1 + k`` tokens of EAGLE
verification - takes the backend's one paged latent-attention path (:mod:`kimi.cpu_mla.backend`).

``CpuPlatform`` calls :func:`attention_backend` for MLA layers and asks :func:`serves` before it applies the
rules of the v0.32 line's own reference CPU MLA backend (``vllm/v1/attention/backends/mla/cpu_mla.py``: decode
through ``mla_decode_kvcache``, SDPA prefill; block size 16, chunked prefill and prefix caching off). Upstream's
AMX MLA backend stays reachable with ``--attention-backend AMX_MLA``. The v0.26 line (upstream raises "MLA is
not supported on CPU") also calls :func:`configure`.
"""

from __future__ import annotations

from typing import Any

#: The fork's MLA backend, as the dotted path vLLM loads it by.
BACKEND = "kimi.cpu_mla.backend.CpuMLABackend"
#: The placeholder the fork registers as vLLM's CUSTOM MLA prefill backend (never used for a token).
NO_PREFILL = "kimi.cpu_mla.backend.CpuMLANoPrefill"

#: Attention backends of upstream's that the user may pick by name instead of the fork's (the v0.32 line's vLLM).
UPSTREAM_CHOICES = ("AMX_MLA",)


def _upstream_chosen(selected_backend: Any) -> bool:
    return getattr(selected_backend, "name", None) in UPSTREAM_CHOICES


def attention_backend(selected_backend: Any = None) -> str | None:
    """The fork's backend path for an MLA layer, or None where the user chose one of :data:`UPSTREAM_CHOICES`
    (``--attention-backend``; ``selected_backend`` is vLLM's ``AttentionBackendEnum`` member or None).

    Registers the fork's placeholder as vLLM's CUSTOM MLA prefill backend: the MLA layer builds a prefill
    backend that the fork's builder never uses (every token is a decode token for it), and before the v0.32 line's
    release no other one imports on CPU (:func:`configure` selects it there).
    """
    if _upstream_chosen(selected_backend):
        return None
    from vllm.v1.attention.backends.mla.prefill.registry import (
        MLAPrefillBackendEnum,
        register_mla_prefill_backend,
    )

    register_mla_prefill_backend(MLAPrefillBackendEnum.CUSTOM, NO_PREFILL)
    return BACKEND


def serves(vllm_config: Any) -> bool:
    """True when the fork's backend serves ``vllm_config``'s model (MLA, and the user did not choose one of
    :data:`UPSTREAM_CHOICES`): the v0.32 line's rules for its own reference CPU MLA - block size 16, chunked prefill
    and prefix caching off - do not apply; the block size stays the platform's default (the fork's backend takes
    any, a Llama-style drafter beside it needs a multiple of 32)."""
    return bool(getattr(vllm_config.model_config, "use_mla", False)) and not _upstream_chosen(
        vllm_config.attention_config.backend)


def configure(vllm_config: Any) -> None:
    """v0.26 line: for an MLA model on CPU, the MLA prefill slot is vLLM's CUSTOM one (filled by
    :func:`attention_backend`) unless the user chose a prefill backend."""
    from vllm.v1.attention.backends.mla.prefill.registry import MLAPrefillBackendEnum

    attention_config = vllm_config.attention_config
    if attention_config.mla_prefill_backend is None:
        attention_config.mla_prefill_backend = MLAPrefillBackendEnum.CUSTOM
