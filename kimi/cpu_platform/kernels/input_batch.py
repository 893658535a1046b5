"""Torch versions of the Triton kernels in ``vllm/v1/worker/gpu/input_batch.py``.

Each function takes the kernel's launch arguments (same names, same order, constexprs included) and
covers the whole launch grid, which the dispatcher drops: the number of requests is read from the
argument the upstream launcher sized the grid with (``idx_mapping.shape[0]`` or ``cu_num_logits``).
"""

from __future__ import annotations

import torch

from kimi.cpu_platform.kernels._util import ragged_rows

_UP = "vllm.v1.worker.gpu.input_batch"


def _query_bounds(query_start_loc: torch.Tensor, num_reqs: int) -> tuple[torch.Tensor, torch.Tensor]:
    starts = query_start_loc[:num_reqs].to(torch.int64)
    ends = query_start_loc[1 : num_reqs + 1].to(torch.int64)
    return starts, ends


def prepare_prefill_inputs(
    input_ids_ptr: torch.Tensor,
    next_prefill_tokens_ptr: torch.Tensor,
    next_prefill_tokens_stride: int,
    num_lookahead: int,
    idx_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    prefill_lens_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    BLOCK_SIZE: int,
    LOOKAHEAD_BLOCK: int,
) -> None:
    """Copy each prefilling request's scheduled prompt chunk into ``input_ids`` and its next
    ``num_lookahead`` prompt tokens (0 past the prompt) into ``next_prefill_tokens[j, req_state]``.

    input_ids [num_tokens] int32; next_prefill_tokens [num_lookahead, max_num_reqs];
    idx_mapping [num_reqs]; query_start_loc [num_reqs + 1]; all_token_ids [max_num_reqs, max_len];
    prefill_lens, num_computed_tokens [max_num_reqs].  Rows already past their prompt are skipped.
    Replaces ``vllm.v1.worker.gpu.input_batch._prepare_prefill_inputs_kernel``.
    """
    num_reqs = idx_mapping_ptr.shape[0]
    req = idx_mapping_ptr.to(torch.int64)
    prefill_len = prefill_lens_ptr[req].to(torch.int64)
    computed = num_computed_tokens_ptr[req].to(torch.int64)
    prefilling = computed < prefill_len
    starts, ends = _query_bounds(query_start_loc_ptr, num_reqs)
    query_len = torch.where(prefilling, ends - starts, 0)

    row, offset = ragged_rows(query_len)
    input_ids_ptr[starts[row] + offset] = all_token_ids_ptr[req[row], computed[row] + offset].to(input_ids_ptr.dtype)

    if num_lookahead > 0:
        rows = prefilling.nonzero().squeeze(1)
        pos = (computed + query_len)[rows, None] + torch.arange(num_lookahead, device=req.device)
        in_prompt = pos < prefill_len[rows, None]
        width = all_token_ids_ptr.shape[1]
        tokens = all_token_ids_ptr[req[rows, None], pos.clamp_max(width - 1)]
        tokens = torch.where(in_prompt, tokens, 0).to(next_prefill_tokens_ptr.dtype)
        next_prefill_tokens_ptr[:num_lookahead, req[rows]] = tokens.T


def prepare_pos_seq_lens(
    pos_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    max_num_reqs: int,
    BLOCK_SIZE: int,
) -> None:
    """Write token positions (``num_computed + i`` for the i-th scheduled token) and
    ``seq_lens = num_computed + query_len``; ``seq_lens[num_reqs:max_num_reqs]`` is zeroed.

    pos [num_tokens] int64; seq_lens [max_num_reqs] int32; idx_mapping [num_reqs];
    query_start_loc [num_reqs + 1]; num_computed_tokens [max_num_reqs].
    Replaces ``vllm.v1.worker.gpu.input_batch._prepare_pos_seq_lens_kernel``.
    """
    num_reqs = idx_mapping_ptr.shape[0]
    computed = num_computed_tokens_ptr[idx_mapping_ptr.to(torch.int64)].to(torch.int64)
    starts, ends = _query_bounds(query_start_loc_ptr, num_reqs)
    seq_lens_ptr[:num_reqs] = (computed + ends - starts).to(seq_lens_ptr.dtype)
    seq_lens_ptr[num_reqs:max_num_reqs] = 0
    row, offset = ragged_rows(ends - starts)
    pos_ptr[starts[row] + offset] = (computed[row] + offset).to(pos_ptr.dtype)


def combine_sampled_and_draft_tokens(
    input_ids_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    last_sampled_tokens_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    prefill_len_ptr: torch.Tensor,
    draft_tokens_ptr: torch.Tensor,
    draft_tokens_stride: int,
    cu_num_logits_ptr: torch.Tensor,
    logits_indices_ptr: torch.Tensor,
    BLOCK_SIZE: int,
    NUM_NEW_SAMPLED_TOKENS: int = 1,
) -> None:
    """Fill ``logits_indices`` (the last ``num_logits`` token slots of each request) and, for
    requests past their prompt, write the last sampled token and the draft tokens into the tail
    of the request's ``input_ids`` slice.

    input_ids [num_tokens] int32; idx_mapping [num_reqs]; last_sampled_tokens [max_num_reqs] (or [max_num_reqs, 1]);
    seq_lens [num_reqs]; prefill_len [max_num_reqs]; draft_tokens [max_num_reqs, num_spec];
    cu_num_logits [num_reqs + 1]; logits_indices [num_logits] int64.  At most BLOCK_SIZE logits and
    drafts per request are handled, as upstream.
    Replaces ``vllm.v1.worker.gpu.input_batch._combine_sampled_and_draft_tokens_kernel``.
    """
    num_reqs = idx_mapping_ptr.shape[0]
    req = idx_mapping_ptr.to(torch.int64)
    cu_start = cu_num_logits_ptr[:num_reqs].to(torch.int64)
    num_logits = cu_num_logits_ptr[1 : num_reqs + 1].to(torch.int64) - cu_start
    query_end = query_start_loc_ptr[1 : num_reqs + 1].to(torch.int64)
    logits_start = query_end - num_logits

    row, offset = ragged_rows(num_logits.clamp_max(BLOCK_SIZE))
    logits_indices_ptr[cu_start[row] + offset] = (logits_start[row] + offset).to(logits_indices_ptr.dtype)

    seq_len = seq_lens_ptr[:num_reqs].to(torch.int64)
    prefill_len = prefill_len_ptr[req].to(torch.int64)
    generating = seq_len > prefill_len
    if NUM_NEW_SAMPLED_TOKENS > 0:
        rows = (generating & (seq_len - num_logits >= prefill_len)).nonzero().squeeze(1)
        # upstream reads ``last_sampled_tokens_ptr + req_state_idx``: flat, whatever the tensor's shape
        # (the runner's is [max_num_reqs, 1])
        input_ids_ptr[logits_start[rows]] = last_sampled_tokens_ptr.reshape(-1)[req[rows]].to(input_ids_ptr.dtype)
    num_drafts = torch.where(generating, num_logits - NUM_NEW_SAMPLED_TOKENS, 0).clamp(0, BLOCK_SIZE)
    row, offset = ragged_rows(num_drafts)
    input_ids_ptr[query_end[row] - num_drafts[row] + offset] = draft_tokens_ptr[req[row], offset].to(
        input_ids_ptr.dtype
    )


def get_num_sampled_and_rejected(
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    prefill_len_ptr: torch.Tensor,
) -> None:
    """In place: ``num_sampled`` is zeroed for chunked-prefill rows (``seq_len < prefill_len``),
    ``num_rejected = num_logits - num_sampled`` (0 for those rows).

    num_sampled, num_rejected, seq_lens [num_reqs]; cu_num_logits [num_reqs + 1];
    idx_mapping [num_reqs]; prefill_len [max_num_reqs].
    Replaces ``vllm.v1.worker.gpu.input_batch._get_num_sampled_and_rejected_kernel``.
    """
    num_reqs = idx_mapping_ptr.shape[0]
    chunked = seq_lens_ptr[:num_reqs] < prefill_len_ptr[idx_mapping_ptr.to(torch.int64)]
    num_sampled = torch.where(chunked, 0, num_sampled_ptr[:num_reqs])
    num_sampled_ptr[:num_reqs] = num_sampled.to(num_sampled_ptr.dtype)
    num_logits = cu_num_logits_ptr[1 : num_reqs + 1] - cu_num_logits_ptr[:num_reqs]
    num_rejected_ptr[:num_reqs] = torch.where(chunked, 0, num_logits - num_sampled).to(num_rejected_ptr.dtype)


def post_update(
    idx_mapping_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    last_sampled_tokens_ptr: torch.Tensor,
    output_bin_counts_ptr: torch.Tensor | None,
    output_bin_counts_stride: int,
    sampled_tokens_ptr: torch.Tensor,
    sampled_tokens_stride: int,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor | None,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    total_len_ptr: torch.Tensor,
    draft_tokens_ptr: torch.Tensor | None,
    draft_tokens_out_ptr: torch.Tensor | None,
    num_draft_tokens: int,
    **launch_options: object,
) -> None:
    """Per-request state update after a step, for rows with ``idx_mapping >= 0``: copy the drafts
    to ``draft_tokens_out[req_state]``; append the ``num_sampled`` sampled tokens to
    ``all_token_ids`` at ``total_len`` (and count them in ``output_bin_counts``), advance
    ``total_len`` and ``last_sampled_tokens``; add ``query_len - num_rejected`` to
    ``num_computed_tokens``.

    idx_mapping [num_reqs]; sampled_tokens [num_reqs, num_spec + 1]; num_sampled, num_rejected
    [num_reqs]; query_start_loc [num_reqs + 1] or None; per-state tensors [max_num_reqs(, ...)].
    Request states must be distinct across rows (as upstream's scheduler guarantees).
    Replaces ``vllm.v1.worker.gpu.input_batch._post_update_kernel``.
    """
    num_reqs = idx_mapping_ptr.shape[0]
    rows = (idx_mapping_ptr >= 0).nonzero().squeeze(1)
    req = idx_mapping_ptr[rows].to(torch.int64)

    if draft_tokens_ptr is not None and num_draft_tokens > 0:
        drafts = draft_tokens_ptr.reshape(-1)[: num_reqs * num_draft_tokens].view(num_reqs, num_draft_tokens)
        out = draft_tokens_out_ptr.view(-1, num_draft_tokens)
        out[req] = drafts[rows].to(out.dtype)

    num_sampled = num_sampled_ptr[rows].to(torch.int64).clamp_min(0)
    total_len = total_len_ptr[req].to(torch.int64)
    has_sampled = num_sampled > 0
    last_col = (num_sampled - 1).clamp_min(0)
    last_token = sampled_tokens_ptr[rows, last_col]
    last_sampled = last_sampled_tokens_ptr.view(-1)  # upstream stores at ``ptr + req_state_idx``
    last_sampled[req] = torch.where(has_sampled, last_token, last_sampled[req]).to(last_sampled.dtype)
    total_len_ptr[req] = (total_len + num_sampled).to(total_len_ptr.dtype)

    row, offset = ragged_rows(num_sampled)
    tokens = sampled_tokens_ptr[rows[row], offset]
    all_token_ids_ptr[req[row], total_len[row] + offset] = tokens.to(all_token_ids_ptr.dtype)
    if output_bin_counts_ptr is not None:
        ones = torch.ones_like(tokens, dtype=output_bin_counts_ptr.dtype)
        output_bin_counts_ptr.index_put_((req[row], tokens.to(torch.int64)), ones, accumulate=True)

    if query_start_loc_ptr is None:
        query_len = torch.zeros_like(req)
    else:
        query_len = (query_start_loc_ptr[rows + 1] - query_start_loc_ptr[rows]).to(torch.int64)
    delta = query_len - num_rejected_ptr[rows].to(torch.int64)
    num_computed_tokens_ptr[req] = (num_computed_tokens_ptr[req].to(torch.int64) + delta).to(
        num_computed_tokens_ptr.dtype
    )


def post_update_num_computed_tokens(
    idx_mapping_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
) -> None:
    """``num_computed_tokens[idx_mapping[i]] += query_len[i]`` for every batch row.

    idx_mapping [num_reqs]; num_computed_tokens [max_num_reqs]; query_start_loc [num_reqs + 1].
    Replaces ``vllm.v1.worker.gpu.input_batch._post_update_num_computed_tokens_kernel``.
    """
    num_reqs = idx_mapping_ptr.shape[0]
    starts, ends = _query_bounds(query_start_loc_ptr, num_reqs)
    query_len = (ends - starts).to(num_computed_tokens_ptr.dtype)
    num_computed_tokens_ptr.index_add_(0, idx_mapping_ptr.to(torch.int64), query_len)


def expand_idx_mapping(
    idx_mapping_ptr: torch.Tensor,
    expanded_idx_mapping_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    BLOCK_SIZE: int,
) -> None:
    """Repeat each row's request-state index over its logits and number them 0..n-1.

    idx_mapping [num_reqs]; expanded_idx_mapping, expanded_local_pos (int32) [num_logits];
    cu_num_logits [num_reqs + 1].  At most BLOCK_SIZE logits per request, as upstream.
    Replaces ``vllm.v1.worker.gpu.input_batch._expand_idx_mapping_kernel``.
    """
    num_reqs = idx_mapping_ptr.shape[0]
    starts = cu_num_logits_ptr[:num_reqs].to(torch.int64)
    counts = cu_num_logits_ptr[1 : num_reqs + 1].to(torch.int64) - starts
    row, offset = ragged_rows(counts.clamp_max(BLOCK_SIZE))
    expanded_idx_mapping_ptr[starts[row] + offset] = idx_mapping_ptr[row].to(expanded_idx_mapping_ptr.dtype)
    expanded_local_pos_ptr[starts[row] + offset] = offset.to(expanded_local_pos_ptr.dtype)


OVERRIDES = {
    f"{_UP}._prepare_prefill_inputs_kernel": prepare_prefill_inputs,
    f"{_UP}._prepare_pos_seq_lens_kernel": prepare_pos_seq_lens,
    f"{_UP}._combine_sampled_and_draft_tokens_kernel": combine_sampled_and_draft_tokens,
    f"{_UP}._get_num_sampled_and_rejected_kernel": get_num_sampled_and_rejected,
    f"{_UP}._post_update_kernel": post_update,
    f"{_UP}._post_update_num_computed_tokens_kernel": post_update_num_computed_tokens,
    f"{_UP}._expand_idx_mapping_kernel": expand_idx_mapping,
}
