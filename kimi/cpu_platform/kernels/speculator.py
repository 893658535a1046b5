"""Torch versions of the Triton kernels in
``vllm/v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py`` (EAGLE, EAGLE-3, MTP drafting)."""

from __future__ import annotations

import torch

from kimi.cpu_platform.kernels._util import ragged_rows

_UP = "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator"


def prepare_prefill_inputs(
    last_token_indices_ptr: torch.Tensor,
    draft_current_step_ptr: torch.Tensor,
    draft_input_ids_ptr: torch.Tensor,
    draft_positions_ptr: torch.Tensor,
    draft_query_start_loc_ptr: torch.Tensor,
    draft_seq_lens_ptr: torch.Tensor,
    target_input_ids_ptr: torch.Tensor,
    target_positions_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    last_sampled_ptr: torch.Tensor,
    next_prefill_tokens_ptr: torch.Tensor,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    max_num_reqs: int,
    BLOCK_SIZE: int,
) -> None:
    """Build the drafter's prefill inputs from the target step: each request's accepted tokens
    (query length minus rejected) shifted left by one, followed by the next token (the last
    sampled one, or the next prompt token while chunk-prefilling); positions, query_start_loc and
    seq_lens copied; ``last_token_indices`` set.  Pads query_start_loc (with the batch's token
    count), seq_lens and last_token_indices (with 0) up to max_num_reqs and resets the draft step.

    Batch tensors [num_reqs] / [num_reqs + 1] / [num_tokens]; last_sampled, next_prefill_tokens
    [max_num_reqs]; draft buffers sized max_num_reqs(+1) / max_num_tokens.
    Replaces ``vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator._prepare_prefill_inputs_kernel``.
    """
    num_reqs = idx_mapping_ptr.shape[0]
    req = idx_mapping_ptr.to(torch.int64)
    starts = query_start_loc_ptr[:num_reqs].to(torch.int64)
    ends = query_start_loc_ptr[1 : num_reqs + 1].to(torch.int64)
    query_len = ends - starts - num_rejected_ptr[:num_reqs].to(torch.int64)
    # each source is read only for the rows that take it, as upstream's branch does: the other one may
    # not cover the row's state index (the dummy batches of start-up)
    sampled = num_sampled_ptr[:num_reqs] > 0
    next_token = torch.empty(num_reqs, dtype=torch.int32)
    next_token[sampled] = last_sampled_ptr.view(-1)[req[sampled]].to(torch.int32)
    next_token[~sampled] = next_prefill_tokens_ptr.view(-1)[req[~sampled]].to(torch.int32)

    row, offset = ragged_rows(query_len)
    tokens = starts[row] + offset
    shifted = offset >= 1
    draft_input_ids_ptr[tokens[shifted] - 1] = target_input_ids_ptr[tokens[shifted]].to(draft_input_ids_ptr.dtype)
    last = starts + query_len - 1
    last_token_indices_ptr[:num_reqs] = last.to(last_token_indices_ptr.dtype)
    draft_input_ids_ptr[last] = next_token.to(draft_input_ids_ptr.dtype)
    draft_positions_ptr[tokens] = target_positions_ptr[tokens].to(draft_positions_ptr.dtype)

    draft_query_start_loc_ptr[:num_reqs] = starts.to(draft_query_start_loc_ptr.dtype)
    draft_seq_lens_ptr[:num_reqs] = seq_lens_ptr[:num_reqs].to(draft_seq_lens_ptr.dtype)
    if num_reqs > 0:
        draft_current_step_ptr.fill_(0)
        draft_query_start_loc_ptr[num_reqs : max_num_reqs + 1] = query_start_loc_ptr[num_reqs]
        draft_seq_lens_ptr[num_reqs:max_num_reqs] = 0
        last_token_indices_ptr[num_reqs:max_num_reqs] = 0


def prepare_decode_inputs(
    draft_tokens_ptr: torch.Tensor,
    draft_tokens_stride: int,
    target_seq_lens_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    input_ids_ptr: torch.Tensor,
    positions_ptr: torch.Tensor,
    sample_src_positions_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    max_model_len: int,
    max_num_reqs: int,
    BLOCK_SIZE: int,
    ADVANCE_DRAFT_POSITIONS: bool,
) -> None:
    """Inputs of the first draft decode step (one token per request): the first draft token as
    input id, the sampling key advanced, ``seq_len = target_seq_len - num_rejected`` (and with
    ADVANCE_DRAFT_POSITIONS position and seq_len advanced by one, clamped to max_model_len);
    query_start_loc = 0..num_reqs then padded with num_reqs, seq_lens padded with 0.

    draft_tokens [num_reqs] (a column view; its length is the batch size); target_seq_lens,
    num_rejected [num_reqs]; input_ids, positions, sample_src_positions, seq_lens [max_num_reqs];
    query_start_loc [max_num_reqs + 1].
    Replaces ``vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator._prepare_decode_inputs_kernel``.
    """
    num_reqs = draft_tokens_ptr.shape[0]
    query_start_loc_ptr[: max_num_reqs + 1] = torch.arange(max_num_reqs + 1).clamp_max(num_reqs)
    seq_lens_ptr[num_reqs:max_num_reqs] = 0
    input_ids_ptr[:num_reqs] = draft_tokens_ptr.to(input_ids_ptr.dtype)
    sample_src_positions_ptr[:num_reqs] += 1
    seq_len = target_seq_lens_ptr[:num_reqs].to(torch.int64) - num_rejected_ptr[:num_reqs].to(torch.int64)
    if ADVANCE_DRAFT_POSITIONS:
        positions_ptr[:num_reqs] = (positions_ptr[:num_reqs] + 1).clamp_max(max_model_len - 1)
        seq_len = (seq_len + 1).clamp_max(max_model_len)
    seq_lens_ptr[:num_reqs] = seq_len.to(seq_lens_ptr.dtype)


def update_draft_inputs(
    output_draft_tokens_ptr: torch.Tensor,
    output_draft_tokens_stride: int,
    next_input_hidden_states_ptr: torch.Tensor,
    next_input_hidden_states_stride: int,
    input_ids_ptr: torch.Tensor,
    positions_ptr: torch.Tensor,
    sample_src_positions_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    draft_tokens_ptr: torch.Tensor,
    current_draft_step_ptr: torch.Tensor,
    hidden_states_ptr: torch.Tensor,
    hidden_states_stride: int,
    hidden_size: int,
    max_model_len_ptr: torch.Tensor,
    num_speculative_steps: int,
    BLOCK_SIZE: int,
    ADVANCE_DRAFT_POSITIONS: bool,
) -> None:
    """After a draft decode step: store the sampled drafts at column ``current_draft_step`` of
    ``output_draft_tokens``; unless it was the last step, feed them back as input ids, copy the
    hidden states, advance the sampling key and (ADVANCE_DRAFT_POSITIONS) positions and seq_lens,
    clamped to max_model_len.

    draft_tokens [num_reqs] (its length is the batch size); output_draft_tokens
    [max_num_reqs, num_spec]; hidden_states [>= num_reqs, hidden]; current_draft_step and
    max_model_len 0-d/1-element int tensors.
    Replaces ``vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator._update_draft_inputs_kernel``.
    """
    num_reqs = draft_tokens_ptr.shape[0]
    step = int(current_draft_step_ptr.reshape(-1)[0])
    output_draft_tokens_ptr[:num_reqs, step] = draft_tokens_ptr.to(output_draft_tokens_ptr.dtype)
    if step >= num_speculative_steps - 1:
        return
    sample_src_positions_ptr[:num_reqs] += 1
    input_ids_ptr[:num_reqs] = draft_tokens_ptr.to(input_ids_ptr.dtype)
    next_input_hidden_states_ptr[:num_reqs, :hidden_size] = hidden_states_ptr[:num_reqs, :hidden_size]
    if ADVANCE_DRAFT_POSITIONS:
        max_model_len = int(max_model_len_ptr.reshape(-1)[0])
        positions_ptr[:num_reqs] = (positions_ptr[:num_reqs] + 1).clamp_max(max_model_len - 1)
        seq_lens_ptr[:num_reqs] = (seq_lens_ptr[:num_reqs] + 1).clamp_max(max_model_len)


OVERRIDES = {
    f"{_UP}._prepare_prefill_inputs_kernel": prepare_prefill_inputs,
    f"{_UP}._prepare_decode_inputs_kernel": prepare_decode_inputs,
    f"{_UP}._update_draft_inputs_kernel": update_draft_inputs,
}
