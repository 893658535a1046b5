"""The attention backend of the torch-only CPU platform for non-MLA layers (the Llama-style drafter).

vLLM's ``CPU_ATTN`` backend with its compiled ops replaced by ``kimi.cpu_platform.ops``: the cache
layout, metadata and call sites stay upstream's; only head and block sizes widen, since the torch ops take any
(the compiled kernels take head sizes from 32 and blocks of 32; the reference pair's drafter has heads of
48, and vLLM's CPU platform gives MLA models blocks of 16).
"""

from __future__ import annotations

from vllm.v1.attention.backend import MultipleOf
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend


class TorchCpuAttentionBackend(CPUAttentionBackend):
    """``CPU_ATTN`` on torch ops: any head size and block size, KV cache in the model dtype."""

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        # any, so that one block size serves it beside CPU_MLA (16 only)
        return [MultipleOf(1)]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []  # an empty list means every head size

    @classmethod
    def supports_kv_cache_dtype(cls, kv_cache_dtype) -> bool:
        return kv_cache_dtype in (None, "auto")
