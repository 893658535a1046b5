"""The fork's MLA attention backend for vLLM's CPU platform (``CPU_MLA``).

Upstream vLLM (the v0.26 line's release) raises "MLA is not supported on CPU." (``vllm/platforms/cpu.py``), so no
DeepSeek-V3 / Kimi model runs without a GPU. Patch 0006 makes the CPU platform return this backend for
MLA models. It plugs into vLLM's common MLA layer (``vllm/model_executor/layers/attention/mla_attention.py``):
the layer projects queries into the latent space (``W_UK``), calls :meth:`CpuMLAImpl.forward_mqa`, and
projects the result back (``W_UV``).

Every scheduled token is treated as an MQA ("decode") token: the metadata builder reports all requests
as decodes with variable query lengths, so prefill, chunked prefill, prefix-cache hits, decode and the
``1 + k`` query tokens of EAGLE verification all take one path, :func:`kimi.cpu_mla.ops.paged_latent_attention`.
The latent cache uses vLLM's MLA layout ``[num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.config.cache import CacheDType
from vllm.model_executor.layers.attention.mla_attention import (
    MLACommonBackend,
    MLACommonDecodeMetadata,
    MLACommonImpl,
    MLACommonMetadata,
    get_mla_dims,
)
from vllm.v1.attention.backend import (
    AttentionCGSupport,
    AttentionLayer,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.attention.backends.mla.prefill.base import MLAPrefillBackend

from kimi.cpu_mla.ops import paged_latent_attention, write_latent_cache


@dataclass
class CpuMLADecodeMetadata(MLACommonDecodeMetadata):
    """vLLM's MLA decode metadata plus where each request's queries start.

    Attributes:
        query_start_loc: ``[R + 1]`` int32, request r's query tokens are ``[query_start_loc[r], query_start_loc[r+1])``.
    """

    query_start_loc: torch.Tensor


class CpuMLAMetadataBuilder(AttentionMetadataBuilder[MLACommonMetadata]):
    """Builds :class:`MLACommonMetadata` in which every request is a variable-length decode."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER
    reorder_batch_threshold: int | None = None

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.head_dim = vllm_config.model_config.get_head_size()
        get_mla_dims(vllm_config.model_config)  # fails early on a config without MLA dims

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> MLACommonMetadata:
        m = common_attn_metadata
        num_reqs = m.num_reqs
        decode = CpuMLADecodeMetadata(
            block_table=m.block_table_tensor[:num_reqs],
            seq_lens=m.seq_lens[:num_reqs],
            dcp_tot_seq_lens=None,
            query_start_loc=m.query_start_loc[: num_reqs + 1],
        )
        return MLACommonMetadata(
            num_reqs=num_reqs,
            max_query_len=m.max_query_len,
            max_seq_len=m.max_seq_len,
            num_actual_tokens=m.num_actual_tokens,
            query_start_loc=m.query_start_loc,
            slot_mapping=m.slot_mapping,
            head_dim=self.head_dim,
            num_decodes=num_reqs,
            num_decode_tokens=m.num_actual_tokens,
            num_prefills=0,
            prefill=None,
            decode=decode,
        )


class CpuMLAImpl(MLACommonImpl[MLACommonMetadata]):
    """MLA on CPU: latent-cache writes and absorbed attention in torch (:mod:`kimi.cpu_mla.ops`).

    Raises:
        NotImplementedError: at construction, for features this backend does not implement
            (ALiBi, sliding window, logit soft-cap, non-decoder attention, a quantized KV cache).
    """

    def __init__(self, num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window,
                 kv_cache_dtype, logits_soft_cap, attn_type, kv_sharing_target_layer_name, **mla_args) -> None:
        super().__init__(num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window,
                         kv_cache_dtype, logits_soft_cap, attn_type, kv_sharing_target_layer_name, **mla_args)
        unsupported = {"alibi_slopes": alibi_slopes, "sliding_window": sliding_window,
                       "logits_soft_cap": logits_soft_cap}
        named = [name for name, value in unsupported.items() if value]
        if named:
            raise NotImplementedError(f"the CPU MLA backend does not support {', '.join(named)}")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"the CPU MLA backend supports decoder self-attention only, not {attn_type}")
        if kv_cache_dtype not in CpuMLABackend.supported_kv_cache_dtypes:
            raise NotImplementedError(
                f"the CPU MLA backend keeps the latent cache in the model dtype; --kv-cache-dtype {kv_cache_dtype} "
                "is not supported on CPU (use --kv-cache-dtype auto)"
            )
        self.supports_quant_query_input = False
        # MLAAttention.process_weights_after_loading reads kv_b_proj's weight after the CPU linear
        # method has packed it; patch 0006 makes the linear method keep it for layers marked so.
        self.kv_b_proj.keep_weight_after_loading = True
        self.dcp_world_size = 1

    def do_kv_cache_update(self, kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype, k_scale,
                           skip_scale: bool = False) -> None:
        """Write ``kv_c_normed`` [T, kv_lora_rank] and ``k_pe`` [T, 1, rope] to their slots of ``kv_cache``
        (``skip_scale``, the mainline's vLLM's, is moot: the cache is never quantized here)."""
        write_latent_cache(kv_c_normed, k_pe, kv_cache, slot_mapping)

    def forward_mqa(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: MLACommonMetadata,
        layer: AttentionLayer,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention of the absorbed queries ``[T, H, kv_lora_rank + rope]`` (or its two parts) over the cache.

        Returns ``([T, H, kv_lora_rank], lse [T, H])``.
        """
        if isinstance(q, tuple):
            q = torch.cat(q, dim=-1)
        decode = attn_metadata.decode
        assert isinstance(decode, CpuMLADecodeMetadata), "CPU MLA needs metadata from CpuMLAMetadataBuilder"
        return paged_latent_attention(
            q,
            kv_c_and_k_pe_cache,
            decode.block_table,
            decode.seq_lens,
            decode.query_start_loc,
            self.scale,
            self.kv_lora_rank,
        )


class CpuMLABackend(MLACommonBackend):
    """Attention backend entry for MLA models on vLLM's CPU platform (selected by patch 0006)."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float32, torch.bfloat16, torch.float16]
    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = ["auto", "bfloat16", "float16"]

    @staticmethod
    def get_name() -> str:
        return "CPU_MLA"

    @staticmethod
    def get_impl_cls() -> type[CpuMLAImpl]:
        return CpuMLAImpl

    @staticmethod
    def get_builder_cls() -> type[CpuMLAMetadataBuilder]:
        return CpuMLAMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        """Any block size (the v0.32 line's vLLM passes the KV cache spec, the v0.26 line's nothing)."""
        return [MultipleOf(1)]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []


class CpuMLANoPrefill(MLAPrefillBackend):
    """The prefill slot of vLLM's MLA layer, which the CPU backend leaves empty.

    ``MLAAttention`` always selects a dense prefill backend (FlashAttention by default, which does not
    import on CPU). :class:`CpuMLAMetadataBuilder` reports no prefill tokens, so prefill runs through
    :meth:`CpuMLAImpl.forward_mqa` and the methods below are never reached.

    Raises:
        RuntimeError: from either run method, which would mean the builder's contract was broken.
    """

    supported_dtypes: ClassVar[list[torch.dtype]] = CpuMLABackend.supported_dtypes

    @staticmethod
    def get_name() -> str:
        return "CPU_MLA_NO_PREFILL"

    def run_prefill_new_tokens(self, q, k, v, return_softmax_lse, out=None, output_scale=None):
        raise RuntimeError("CPU MLA sends every token through forward_mqa; the dense prefill path is unused")

    def run_prefill_context_chunk(self, chunk_idx, q, k, v):
        raise RuntimeError("CPU MLA sends every token through forward_mqa; the dense prefill path is unused")
