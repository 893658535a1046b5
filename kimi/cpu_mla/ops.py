"""Paged latent-cache MLA in plain torch: the arithmetic of the fork's CPU MLA backend.

Multi-head latent attention (DeepSeek-V2 paper, arXiv 2405.04434, section 2.1) caches one vector per
token: the normalised latent ``c_kv`` (``kv_lora_rank`` wide, 512 for DeepSeek-V3/Kimi) followed by the
rotary key part ``k_pe`` (``qk_rope_head_dim``, 64): 576 values. With the "absorbed" form every query
head is projected into the latent space, so one attention over the latent cache serves all heads:

    score[t, h, s] = scale * <q[t, h, :], cache[s, :]>        (all 576 values)
    out[t, h, :]   = softmax_s(score[t, h, :]) @ cache[s, :kv_lora_rank]

Here that one formula serves prefill, decode, chunked prefill and the multi-token queries of
speculative verification: a request with ``q_len`` new tokens and ``seq_len`` tokens in all has its
queries at positions ``seq_len - q_len .. seq_len - 1``, and query ``i`` sees keys ``0 .. its position``.

The cache layout is vLLM's MLA layout (``MLACommonBackend.get_kv_cache_shape``):
``[num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]``; a token's slot is
``block_id * block_size + offset``; slot ``-1`` marks a padding token that is not written.
"""

from __future__ import annotations

import torch


def write_latent_cache(kv_c: torch.Tensor, k_pe: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Store each token's latent and rotary key into its cache slot, in place.

    Args:
        kv_c: ``[T, kv_lora_rank]``, the normalised latent of each new token.
        k_pe: ``[T, rope]`` or ``[T, 1, rope]``, the rotary key part (after RoPE).
        cache: ``[num_blocks, block_size, kv_lora_rank + rope]``, any float dtype; values are cast to it.
        slots: ``[T]`` int, flat slot per token; negative slots (padding) are skipped.

    Raises:
        ValueError: if the widths of ``kv_c`` and ``k_pe`` do not add up to the cache's last dimension.
    """
    num_tokens = slots.shape[0]
    if num_tokens == 0 or cache.numel() == 0:
        return
    k_pe = k_pe.reshape(k_pe.shape[0], -1)
    width = kv_c.shape[-1] + k_pe.shape[-1]
    if width != cache.shape[-1]:
        raise ValueError(
            f"MLA latent cache is {cache.shape[-1]} wide but kv_c ({kv_c.shape[-1]}) + k_pe ({k_pe.shape[-1]}) "
            f"is {width}: the model's kv_lora_rank / qk_rope_head_dim do not match the cache spec"
        )
    slots = slots.flatten().to(torch.long)
    keep = slots >= 0
    flat = cache.view(-1, cache.shape[-1])
    rows = torch.cat([kv_c[:num_tokens], k_pe[:num_tokens]], dim=-1).to(cache.dtype)
    if bool(keep.all()):
        flat.index_copy_(0, slots, rows)
    else:
        flat.index_copy_(0, slots[keep], rows[keep])


def paged_latent_attention(
    q: torch.Tensor,
    cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    kv_lora_rank: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal absorbed-MLA attention of variable-length queries over the paged latent cache.

    Args:
        q: ``[T, H, kv_lora_rank + rope]``, queries already absorbed into the latent space
            (``q_nope @ W_UK`` then ``q_pe``), T = total query tokens of all requests.
        cache: ``[num_blocks, block_size, kv_lora_rank + rope]``.
        block_table: ``[R, max_blocks]`` int32/int64, request r's blocks in order.
        seq_lens: ``[R]``, tokens in the cache per request, including this step's queries.
        query_start_loc: ``[R + 1]``, request r's queries are ``q[query_start_loc[r]:query_start_loc[r + 1]]``.
        scale: softmax scale (vLLM passes ``qk_head_dim ** -0.5``, times the YaRN mscale² if any).
        kv_lora_rank: width of the value part (the latent), 512 for DeepSeek-V3/Kimi.

    Returns:
        ``(out, lse)``: ``out`` ``[T, H, kv_lora_rank]`` in ``q``'s dtype, and ``lse`` ``[T, H]`` float32,
        the natural-log log-sum-exp of each row's scores (what vLLM's decode kernels return for merging).

    Scores and softmax are computed in float32 whatever the input dtype.

    Raises:
        ValueError: if a request has more queries than tokens, or more tokens than its blocks hold.
    """
    num_tokens, num_heads, width = q.shape
    block_size = cache.shape[1]
    out = torch.empty(num_tokens, num_heads, kv_lora_rank, dtype=q.dtype, device=q.device)
    lse = torch.empty(num_tokens, num_heads, dtype=torch.float32, device=q.device)
    starts = query_start_loc.tolist()
    lengths = seq_lens.tolist()
    for r, seq_len in enumerate(lengths):
        begin, end = starts[r], starts[r + 1]
        q_len = end - begin
        if q_len == 0:
            continue
        if q_len > seq_len:
            raise ValueError(f"request {r} has {q_len} query tokens but only {seq_len} tokens in the cache")
        num_blocks = -(-seq_len // block_size)
        if num_blocks > block_table.shape[1]:
            raise ValueError(f"request {r} needs {num_blocks} cache blocks; its block table has {block_table.shape[1]}")
        blocks = block_table[r, :num_blocks].to(torch.long)
        keys = cache.index_select(0, blocks).reshape(-1, width)[:seq_len].float()  # [S, 576]
        queries = q[begin:end].float()  # [q_len, H, 576]
        scores = torch.einsum("qhd,sd->hqs", queries, keys) * scale  # [H, q_len, S]
        positions = torch.arange(seq_len - q_len, seq_len, device=q.device)
        future = torch.arange(seq_len, device=q.device)[None, :] > positions[:, None]  # [q_len, S]
        scores.masked_fill_(future, float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)  # [H, q_len]
        probs = torch.exp(scores - row_lse[..., None])
        out[begin:end] = torch.einsum("hqs,sd->qhd", probs, keys[:, :kv_lora_rank]).to(q.dtype)
        lse[begin:end] = row_lse.transpose(0, 1)
    return out, lse
