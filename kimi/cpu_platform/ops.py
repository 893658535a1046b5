"""Torch versions of the ``torch.ops._C`` ops that vLLM's CPU path calls.

vLLM's CPU backend calls compiled ops from ``vllm._C`` (``csrc/cpu/torch_bindings.cpp``). A vLLM
installed without kernels has no ``vllm._C``; :func:`register` defines the ops the EAGLE-3 path needs
under the same names and schemas, written in torch, so upstream's CPU attention and CPU MoE code runs
unchanged (MLA layers use the fork's own torch backend, ``kimi.cpu_mla``). Schemas are copied from the
binding file's ``ops.def`` strings (facts of the API).

Layouts (vLLM's, as its CPU kernels read them):

- CPU attention cache: ``[num_blocks, num_kv_heads, 2 * block_size, head_size]`` viewed by the caller
  as ``key_cache`` / ``value_cache`` ``[num_blocks, num_kv_heads, block_size, head_size]``; a token's
  slot is ``block_id * block_size + offset``, slot ``-1`` is padding.
- MoE weights: ``w13`` ``[E, 2 * I, H]`` (gate rows then up rows), ``w2`` ``[E, H, I]``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F

#: Set by :func:`attention_output_unused`: :func:`cpu_attention_with_kv_cache` writes zeros instead of attending.
_OUTPUT_UNUSED: ContextVar[bool] = ContextVar("kimi_attention_output_unused", default=False)

# name -> schema, for every op this module implements (schemas of vLLM's csrc/cpu/torch_bindings.cpp).
SCHEMAS = {
    "init_cpu_memory_env": "init_cpu_memory_env(SymInt[] node_ids) -> ()",
    "cpu_attn_has_isa": "cpu_attn_has_isa(str isa) -> bool",
    "get_scheduler_metadata": (
        "get_scheduler_metadata(int num_req, int num_heads_q, int num_heads_kv, int head_dim, "
        "Tensor seq_lens, ScalarType dtype, Tensor query_start_loc, bool casual, int window_size, "
        "str isa_hint, bool enable_kv_split, Tensor? dynamic_causal, str kv_cache_dtype) -> Tensor"
    ),
    "cpu_attn_reshape_and_cache": (
        "cpu_attn_reshape_and_cache(Tensor key, Tensor value, Tensor(a2!) key_cache, "
        "Tensor(a3!) value_cache, Tensor slot_mapping, str isa, float k_scale=1.0, float v_scale=1.0, "
        'str kv_cache_dtype="auto") -> ()'
    ),
    "cpu_attention_with_kv_cache": (
        "cpu_attention_with_kv_cache(Tensor query, Tensor key_cache, Tensor value_cache, "
        "Tensor(a3!) output, Tensor query_start_loc, Tensor seq_lens, float scale, bool causal, "
        "Tensor? alibi_slopes, SymInt sliding_window_size, Tensor block_table, float softcap, "
        "Tensor scheduler_metadata, Tensor? s_aux, Tensor? dynamic_causal, float k_scale=1.0, "
        'float v_scale=1.0, str kv_cache_dtype="auto") -> ()'
    ),
    "prepack_moe_weight": "prepack_moe_weight(Tensor weight, Tensor(a1!) packed_weight, str isa) -> ()",
    "cpu_fused_moe": (
        "cpu_fused_moe(Tensor(a0!) output, Tensor input, Tensor w13, Tensor w2, Tensor? w13_bias, "
        "Tensor? w2_bias, Tensor topk_weights, Tensor topk_id, bool skip_weighted, str act, str isa) -> ()"
    ),
}


class UnsupportedOnTorchCpu(NotImplementedError):
    """A feature the torch-only CPU path does not implement; the message names the alternative."""


def init_cpu_memory_env(node_ids: list[int]) -> None:
    """NUMA memory binding of vLLM's CPU extension: nothing to bind without it (a no-op)."""


def cpu_attn_has_isa(isa: str) -> bool:
    """Whether the compiled attention kernels were built for ``isa``: none were, so always False."""
    return False


def get_scheduler_metadata(num_req: int, num_heads_q: int, num_heads_kv: int, head_dim: int,
                           seq_lens: torch.Tensor, dtype: torch.dtype, query_start_loc: torch.Tensor,
                           casual: bool, window_size: int, isa_hint: str, enable_kv_split: bool,
                           dynamic_causal: torch.Tensor | None, kv_cache_dtype: str) -> torch.Tensor:
    """Work partition of the compiled attention kernel; :func:`cpu_attention_with_kv_cache` needs
    none, so an empty ``int32`` tensor."""
    return torch.empty(0, dtype=torch.int32)


def _refuse_quantized_cache(kv_cache_dtype: str) -> None:
    if kv_cache_dtype != "auto":
        raise UnsupportedOnTorchCpu(
            f"kv_cache_dtype={kv_cache_dtype!r} needs vLLM's compiled CPU kernels; the torch-only CPU "
            "platform stores the KV cache in the model dtype: leave --kv-cache-dtype at 'auto'"
        )


def cpu_attn_reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                               value_cache: torch.Tensor, slot_mapping: torch.Tensor, isa: str,
                               k_scale: float = 1.0, v_scale: float = 1.0,
                               kv_cache_dtype: str = "auto") -> None:
    """Write each token's key and value into its cache slot, in place.

    Args:
        key, value: ``[T, num_kv_heads, head_size]``.
        key_cache, value_cache: ``[num_blocks, num_kv_heads, block_size, head_size]`` (views).
        slot_mapping: ``[>= T]`` int; negative slots are padding and not written.

    Raises:
        UnsupportedOnTorchCpu: for a quantized KV cache.
    """
    _refuse_quantized_cache(kv_cache_dtype)
    num_tokens = key.shape[0]
    slots = slot_mapping[:num_tokens].to(torch.long)
    keep = slots >= 0
    block_size = key_cache.shape[2]
    blocks, offsets = slots[keep] // block_size, slots[keep] % block_size
    key_cache[blocks, :, offsets] = key[:num_tokens][keep].to(key_cache.dtype)
    value_cache[blocks, :, offsets] = value[:num_tokens][keep].to(value_cache.dtype)


@contextmanager
def attention_output_unused() -> Iterator[None]:
    """Within the block, :func:`cpu_attention_with_kv_cache` fills its ``output`` with zeros and reads no cache.

    For a forward pass run only to write the keys and values of its tokens (vLLM writes them in a separate op,
    :func:`cpu_attn_reshape_and_cache`, which is unaffected), whose outputs nobody reads: the EAGLE-3 drafter's
    pass that keeps its KV cache current while adaptive verification pauses drafting (:mod:`kimi.spec.depth`).
    """
    token = _OUTPUT_UNUSED.set(True)
    try:
        yield
    finally:
        _OUTPUT_UNUSED.reset(token)


def cpu_attention_with_kv_cache(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                                output: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                                scale: float, causal: bool, alibi_slopes: torch.Tensor | None,
                                sliding_window_size: int, block_table: torch.Tensor, softcap: float,
                                scheduler_metadata: torch.Tensor, s_aux: torch.Tensor | None,
                                dynamic_causal: torch.Tensor | None, k_scale: float = 1.0,
                                v_scale: float = 1.0, kv_cache_dtype: str = "auto") -> None:
    """Paged attention of variable-length queries over the KV cache, written into ``output``.

    Request r's queries ``query[query_start_loc[r]:query_start_loc[r + 1]]`` are the last tokens of its
    ``seq_lens[r]`` cached tokens; with ``causal`` query i sees keys up to its own position, and with
    ``sliding_window_size > 0`` only the last ``sliding_window_size`` of those. Grouped-query heads
    share their key/value head. Scores and softmax in float32; ``softcap > 0`` applies
    ``softcap * tanh(score / softcap)`` (Gemma-2's soft cap) before the mask.

    Args:
        query, output: ``[T, num_heads, head_size]``.
        key_cache, value_cache: ``[num_blocks, num_kv_heads, block_size, head_size]``.
        block_table: ``[R, max_blocks]``; query_start_loc ``[R + 1]``; seq_lens ``[R]``.

    Within :func:`attention_output_unused`, ``output`` is filled with zeros instead.

    Raises:
        UnsupportedOnTorchCpu: ALiBi slopes, attention sinks, per-token causality or a quantized cache.
    """
    _refuse_quantized_cache(kv_cache_dtype)
    for name, value in (("ALiBi slopes", alibi_slopes), ("attention sinks", s_aux),
                        ("per-token causality", dynamic_causal)):
        if value is not None:
            raise UnsupportedOnTorchCpu(
                f"{name} need vLLM's compiled CPU attention; the torch-only CPU platform does not run them "
                "(install a vLLM CPU build to serve this model)"
            )
    if _OUTPUT_UNUSED.get():
        output[: int(query_start_loc[-1])].zero_()
        return
    num_heads, num_kv_heads = query.shape[1], key_cache.shape[1]
    block_size = key_cache.shape[2]
    starts = query_start_loc.tolist()
    for r, seq_len in enumerate(seq_lens.tolist()):
        begin, end = starts[r], starts[r + 1]
        q_len = end - begin
        if q_len == 0:
            continue
        blocks = block_table[r, : -(-seq_len // block_size)].to(torch.long)
        keys = key_cache[blocks].transpose(0, 1).reshape(num_kv_heads, -1, key_cache.shape[-1])[:, :seq_len]
        values = value_cache[blocks].transpose(0, 1).reshape(num_kv_heads, -1, value_cache.shape[-1])[:, :seq_len]
        if num_heads != num_kv_heads:
            keys = keys.repeat_interleave(num_heads // num_kv_heads, dim=0)
            values = values.repeat_interleave(num_heads // num_kv_heads, dim=0)
        queries = query[begin:end].transpose(0, 1).float()  # [H, q_len, D]
        scores = torch.matmul(queries, keys.float().transpose(1, 2)) * scale  # [H, q_len, S]
        if softcap > 0:
            scores = softcap * torch.tanh(scores / softcap)
        positions = torch.arange(seq_len - q_len, seq_len)[:, None]
        key_positions = torch.arange(seq_len)[None, :]
        hidden = torch.zeros(q_len, seq_len, dtype=torch.bool)
        if causal:
            hidden |= key_positions > positions
        if sliding_window_size > 0:
            hidden |= key_positions <= positions - sliding_window_size
        scores.masked_fill_(hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        output[begin:end] = torch.matmul(probs, values.float()).transpose(0, 1).to(output.dtype)


def prepack_moe_weight(weight: torch.Tensor, packed_weight: torch.Tensor, isa: str) -> None:
    """The compiled MoE kernel's weight packing; :func:`cpu_fused_moe` reads vLLM's layout, so a copy."""
    packed_weight.copy_(weight)


def _gated_activation(gate_up: torch.Tensor, act: str) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    if act == "silu":
        return F.silu(gate) * up
    if act == "gelu":
        return F.gelu(gate) * up
    raise UnsupportedOnTorchCpu(
        f"MoE activation {act!r} is not implemented by the torch-only CPU platform (silu and gelu are)"
    )


def cpu_fused_moe(output: torch.Tensor, input: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                  w13_bias: torch.Tensor | None, w2_bias: torch.Tensor | None, topk_weights: torch.Tensor,
                  topk_id: torch.Tensor, skip_weighted: bool, act: str, isa: str) -> None:
    """Routed experts: ``output[t] = sum_j w_tj * expert_{id_tj}(input[t])``, written into ``output``.

    Each expert is ``w2 @ act(w13 @ x)`` with the gated activation over ``w13``'s two halves.
    ``skip_weighted`` leaves the router weights out (they were applied to the input).

    Args:
        output, input: ``[T, H]``; w13 ``[E, 2I, H]``; w2 ``[E, H, I]``; topk_weights / topk_id ``[T, k]``.
    """
    result = torch.zeros(input.shape[0], w2.shape[1], dtype=torch.float32)
    flat_ids = topk_id.flatten()
    token_of = torch.arange(input.shape[0]).repeat_interleave(topk_id.shape[1])
    weights = torch.ones_like(topk_weights, dtype=torch.float32) if skip_weighted else topk_weights.float()
    flat_weights = weights.flatten()
    for expert in flat_ids.unique().tolist():
        rows = (flat_ids == expert).nonzero().flatten()
        tokens = token_of[rows]
        hidden = input[tokens] @ w13[expert].t()
        if w13_bias is not None:
            hidden = hidden + w13_bias[expert]
        expert_out = _gated_activation(hidden, act) @ w2[expert].t()
        if w2_bias is not None:
            expert_out = expert_out + w2_bias[expert]
        result.index_add_(0, tokens, expert_out.float() * flat_weights[rows, None])
    output.copy_(result.to(output.dtype))


_LIBRARY: torch.library.Library | None = None


def register() -> None:
    """Define every op of :data:`SCHEMAS` under ``torch.ops._C`` with its torch implementation (once).

    Raises:
        RuntimeError: if ``torch.ops._C`` already holds one of these ops (vLLM's compiled CPU extension
            is loaded; this platform is only for a vLLM installed without it).
    """
    global _LIBRARY
    if _LIBRARY is not None:
        return
    library = torch.library.Library("_C", "FRAGMENT")
    implementations = globals()
    for name, schema in SCHEMAS.items():
        library.define(schema)
        library.impl(name, implementations[name], "CompositeExplicitAutograd")
    _LIBRARY = library
