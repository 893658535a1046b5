"""Hook of patch ``cpu-mla-backend``: MLA on vLLM's CPU platform through the fork's ``CPU_MLA`` backend; the logic
is :mod:`kimi.cpu_mla.selection` (which backend an MLA layer gets) and :mod:`kimi.cpu_mla.backend` (the backend)."""

from __future__ import annotations

from typing import Any


def attention_backend(selected_backend: Any = None) -> str | None:
    """Called by ``CpuPlatform.get_attn_backend_cls`` for an MLA layer:
    :func:`kimi.cpu_mla.selection.attention_backend`."""
    from kimi.cpu_mla.selection import attention_backend as backend

    return backend(selected_backend)


def serves(vllm_config: Any) -> bool:
    """Called by ``CpuPlatform.check_and_update_config`` before its CPU MLA rules (v0.32 line and later):
    :func:`kimi.cpu_mla.selection.serves`."""
    from kimi.cpu_mla.selection import serves as fork_serves

    return fork_serves(vllm_config)


def configure(vllm_config: Any) -> None:
    """Called by ``CpuPlatform.check_and_update_config`` for an MLA model (v0.26 line):
    :func:`kimi.cpu_mla.selection.configure`."""
    from kimi.cpu_mla.selection import configure as select_prefill

    select_prefill(vllm_config)
