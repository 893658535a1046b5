"""Torch versions of the Triton kernels of the standard rejection sampler:
``vllm/v1/worker/gpu/spec_decode/rejection_sampler.py`` and ``rejection_sampler_utils.py``.

Covered: greedy and probabilistic (Leviathan et al.) verification, with one-hot or cached draft
logits, and synthetic acceptance rates.  Block verification, FLy windows and watermarking are not
(their launches raise NotImplementedError).
"""

from __future__ import annotations

import torch

from kimi.cpu_platform.kernels._util import ragged_rows
from kimi.cpu_platform.kernels.gumbel import gumbel_block_argmax, tl_rand32

_UP_SAMPLER = "vllm.v1.worker.gpu.spec_decode.rejection_sampler"
_UP_UTILS = "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"


def _draft_rows(req_state: torch.Tensor, row_mapping: torch.Tensor | None) -> torch.Tensor:
    """Row of each request in the draft logits cache, clamped at 0 as the kernels load it."""
    if row_mapping is None:
        return req_state.clamp_min(0)
    rows = torch.where(req_state >= 0, row_mapping[req_state.clamp_min(0)].to(torch.int64), -1)
    return rows.clamp_min(0)


def _padded(x: torch.Tensor, width: int) -> torch.Tensor:
    """fp32 copy of ``x`` [n, v] padded with -inf to ``width`` columns."""
    out = torch.full((x.shape[0], width), float("-inf"), dtype=torch.float32, device=x.device)
    out[:, : x.shape[1]] = x.to(torch.float32)
    return out


def _block_max_and_sumexp(logits: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block of ``block_size`` columns: max (NaN skipped) and ``sum(exp(x - max))``, 0 for an
    all -inf block."""
    blocks = logits.view(logits.shape[0], -1, block_size)
    block_max = torch.where(blocks.isnan(), float("-inf"), blocks).amax(dim=-1)
    sumexp = torch.exp(blocks - block_max[..., None]).sum(dim=-1)
    return block_max, torch.where(block_max > float("-inf"), sumexp, 0.0)


def _global_logsumexp(local_max: torch.Tensor, local_sumexp: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """Combine per-block max and summed exponentials [n, >= num_blocks] into a logsumexp [n]."""
    maxes = local_max[:, :num_blocks]
    global_max = maxes.amax(dim=1)
    return global_max + torch.log((local_sumexp[:, :num_blocks] * torch.exp(maxes - global_max[:, None])).sum(dim=1))


def gather_draft_sampled(
    draft_sampled_ptr: torch.Tensor,
    pos_ptr: torch.Tensor,
    input_ids_ptr: torch.Tensor,
    positions_ptr: torch.Tensor,
    logits_indices_ptr: torch.Tensor,
    expanded_idx_mapping_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    prefill_len_ptr: torch.Tensor,
    num_logits: int,
    BLOCK_SIZE: int,
) -> None:
    """Input token and position of every logits row; draft rows (local position > 0) of a step
    that starts inside the prompt are placeholders and get token -1.

    draft_sampled, pos, logits_indices, expanded_idx_mapping, expanded_local_pos [num_logits];
    input_ids, positions [num_tokens]; prefill_len [max_num_reqs].
    Replaces ``vllm.v1.worker.gpu.spec_decode.rejection_sampler._gather_draft_sampled_kernel``.
    """
    token_idx = logits_indices_ptr[:num_logits].to(torch.int64)
    token_id = input_ids_ptr[token_idx]
    pos = positions_ptr[token_idx]
    local_pos = expanded_local_pos_ptr[:num_logits].to(torch.int64)
    prefill_len = prefill_len_ptr[expanded_idx_mapping_ptr[:num_logits].to(torch.int64)]
    placeholder = (local_pos > 0) & (pos - local_pos < prefill_len)
    draft_sampled_ptr[:num_logits] = torch.where(placeholder, -1, token_id).to(draft_sampled_ptr.dtype)
    pos_ptr[:num_logits] = pos.to(pos_ptr.dtype)


def flatten_sampled(
    flat_sampled_ptr: torch.Tensor,
    sampled_ptr: torch.Tensor,
    sampled_stride: int,
    num_sampled_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    **launch_options: object,
) -> None:
    """Pack each request's ``num_sampled`` tokens into ``flat_sampled`` at its logits offset.

    flat_sampled [num_logits]; sampled [num_reqs, num_spec + 1]; num_sampled [num_reqs];
    cu_num_logits [num_reqs + 1].
    Replaces ``vllm.v1.worker.gpu.spec_decode.rejection_sampler._flatten_sampled_kernel``.
    """
    num_reqs = cu_num_logits_ptr.shape[0] - 1
    row, offset = ragged_rows(num_sampled_ptr[:num_reqs])
    start = cu_num_logits_ptr[:num_reqs].to(torch.int64)
    flat_sampled_ptr[start[row] + offset] = sampled_ptr[row, offset].to(flat_sampled_ptr.dtype)


def compute_local_logits_stats(
    target_local_argmax_ptr: torch.Tensor,
    target_local_argmax_stride: int,
    target_local_max_ptr: torch.Tensor,
    target_local_max_stride: int,
    target_local_sumexp_ptr: torch.Tensor,
    target_local_sumexp_stride: int,
    draft_local_max_ptr: torch.Tensor,
    draft_local_max_stride: int,
    draft_local_sumexp_ptr: torch.Tensor,
    draft_local_sumexp_stride: int,
    target_logits_ptr: torch.Tensor,
    target_logits_stride: int,
    draft_logits_ptr: torch.Tensor | None,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    draft_logits_row_mapping_ptr: torch.Tensor | None,
    expanded_idx_mapping_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    vocab_size: int,
    num_logits: int,
    BLOCK_SIZE: int,
    HAS_DRAFT_LOGITS: bool,
) -> None:
    """Per logits row (bonus rows skipped) and vocab block: for greedy requests the target max and
    argmax; otherwise the target max and summed exponentials, and with draft logits the same for
    the temperature-scaled cached draft logits.  Entries not described are left untouched.

    target_local_* and draft_local_* [num_logits, num_blocks] (argmax int64, others fp32);
    target_logits [num_logits, V]; draft_logits [rows, num_spec, V'] pre-temperature;
    expanded_idx_mapping, expanded_local_pos [num_logits]; temp [max_num_reqs].
    Replaces ``vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils._compute_local_logits_stats_kernel``.
    """
    num_blocks = target_local_argmax_ptr.shape[1]
    width = num_blocks * BLOCK_SIZE
    local_pos = expanded_local_pos_ptr[:num_logits].to(torch.int64)
    next_pos = torch.cat([local_pos[1:], local_pos.new_zeros(1)])
    req = expanded_idx_mapping_ptr[:num_logits].to(torch.int64)
    temp = temp_ptr[req].to(torch.float32)
    active = next_pos != 0
    greedy = (active & (temp == 0.0)).nonzero().squeeze(1)
    sampling = (active & (temp != 0.0)).nonzero().squeeze(1)

    if greedy.numel():
        blocks = _padded(target_logits_ptr[greedy, :vocab_size], width).view(greedy.numel(), num_blocks, BLOCK_SIZE)
        values, index = torch.where(blocks.isnan(), float("-inf"), blocks).max(dim=-1)
        target_local_argmax_ptr[greedy, :num_blocks] = index + torch.arange(num_blocks)[None, :] * BLOCK_SIZE
        target_local_max_ptr[greedy, :num_blocks] = values
    if sampling.numel():
        block_max, sumexp = _block_max_and_sumexp(_padded(target_logits_ptr[sampling, :vocab_size], width), BLOCK_SIZE)
        target_local_max_ptr[sampling, :num_blocks] = block_max
        target_local_sumexp_ptr[sampling, :num_blocks] = sumexp
        if HAS_DRAFT_LOGITS:
            rows = _draft_rows(req[sampling], draft_logits_row_mapping_ptr)
            draft = draft_logits_ptr[rows, local_pos[sampling], :vocab_size].to(torch.float32) / temp[sampling, None]
            block_max, sumexp = _block_max_and_sumexp(_padded(draft, width), BLOCK_SIZE)
            draft_local_max_ptr[sampling, :num_blocks] = block_max
            draft_local_sumexp_ptr[sampling, :num_blocks] = sumexp


def rejection(
    sampled_ptr: torch.Tensor,
    sampled_stride: int,
    rejected_steps_ptr: torch.Tensor,
    target_rejected_logsumexp_ptr: torch.Tensor,
    draft_rejected_logsumexp_ptr: torch.Tensor,
    target_logits_ptr: torch.Tensor,
    target_logits_stride: int,
    target_local_argmax_ptr: torch.Tensor,
    target_local_argmax_stride: int,
    target_local_max_ptr: torch.Tensor,
    target_local_max_stride: int,
    target_local_sumexp_ptr: torch.Tensor,
    target_local_sumexp_stride: int,
    draft_sampled_ptr: torch.Tensor,
    draft_logits_ptr: torch.Tensor | None,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    draft_logits_row_mapping_ptr: torch.Tensor | None,
    draft_local_max_ptr: torch.Tensor,
    draft_local_max_stride: int,
    draft_local_sumexp_ptr: torch.Tensor,
    draft_local_sumexp_stride: int,
    cu_num_logits_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    seed_ptr: torch.Tensor,
    pos_ptr: torch.Tensor,
    synthetic_conditional_rates_ptr: torch.Tensor | None,
    cumulative_log_p_ptr: torch.Tensor | None,
    local_residual_mass_ptr: torch.Tensor | None,
    local_residual_mass_stride: int,
    fly_entropy_ptr: torch.Tensor | None,
    fly_entropy_threshold: float,
    vocab_num_blocks: int,
    PADDED_VOCAB_NUM_BLOCKS: int,
    HAS_DRAFT_LOGITS: bool,
    SYNTHETIC_MODE: bool,
    USE_BLOCK_VERIFICATION: bool,
    FLY_WINDOW_SIZE: int,
    **launch_options: object,
) -> None:
    """Verify each request's drafts in order until the first rejection.  Greedy requests accept a
    draft equal to the target argmax and store the argmax at the rejected step; others accept
    when ``log p(x) > log u + log q(x)`` (q one-hot without draft logits; u = ``tl.rand(seed, pos)``)
    or, in synthetic mode, when ``u < rate[step]``.  A -1 draft is rejected (and, for non-greedy
    requests, ends verification unevaluated).  Writes the verified steps of ``sampled``, the
    accepted count into ``rejected_steps`` and the target/draft logsumexp of the last verified
    step (0 for greedy requests) for the resampler.

    sampled [num_reqs, num_spec + 1] int64; rejected_steps [num_reqs] int32; *_logsumexp
    [num_reqs] fp32; target_logits [num_logits, V]; local stats [num_logits, num_blocks];
    draft_sampled, pos [num_logits]; cu_num_logits [num_reqs + 1]; idx_mapping [num_reqs];
    temp, seed [max_num_reqs].
    Replaces ``vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils._rejection_kernel``.
    """
    if USE_BLOCK_VERIFICATION or FLY_WINDOW_SIZE > 0:
        raise NotImplementedError("torch rejection kernel: block verification and FLy are not implemented")
    num_reqs = cu_num_logits_ptr.shape[0] - 1
    num_steps = sampled_ptr.shape[1] - 1
    num_logits = draft_sampled_ptr.shape[0]
    req = idx_mapping_ptr[:num_reqs].to(torch.int64)
    start = cu_num_logits_ptr[:num_reqs].to(torch.int64)
    num_drafts = cu_num_logits_ptr[1 : num_reqs + 1].to(torch.int64) - start - 1
    temp = temp_ptr[req].to(torch.float32)
    greedy = (temp == 0.0)[:, None]

    step = torch.arange(num_steps)[None, :]
    in_range = step < num_drafts[:, None]
    logit_idx = torch.where(in_range, start[:, None] + step, 0)
    draft = torch.where(in_range, draft_sampled_ptr[(logit_idx + 1).clamp_max(num_logits - 1)].to(torch.int64), -1)
    valid_draft = draft >= 0
    draft = draft.clamp_min(0)

    # Greedy: the target argmax of each step.
    local_max = target_local_max_ptr[logit_idx.view(-1), :vocab_num_blocks]
    best_block = torch.where(local_max.isnan(), float("-inf"), local_max).argmax(dim=1, keepdim=True)
    target_argmax = target_local_argmax_ptr[logit_idx.view(-1)].gather(1, best_block).view_as(draft)
    # Where every request is greedy no draw and no log-probability is read, and the logsumexps stay 0.
    all_greedy = not SYNTHETIC_MODE and bool(greedy.all())
    if all_greedy:
        accepted = target_argmax == draft
    else:
        u = tl_rand32(seed_ptr[req].to(torch.int64)[:, None], pos_ptr[logit_idx], includes_zero=False)
        # Probabilistic: log-probabilities of the draft token under target and draft.
        target_lse = _global_logsumexp(
            target_local_max_ptr[logit_idx.view(-1)], target_local_sumexp_ptr[logit_idx.view(-1)], vocab_num_blocks
        ).view_as(draft)
        target_logit = torch.where(valid_draft, target_logits_ptr[logit_idx, draft].to(torch.float32), float("-inf"))
        target_logprob = target_logit - target_lse
        if HAS_DRAFT_LOGITS:
            rows = _draft_rows(req, draft_logits_row_mapping_ptr)[:, None]
            draft_logit = draft_logits_ptr[rows, step.expand_as(draft), draft].to(torch.float32)
            draft_logit = torch.where(valid_draft, draft_logit, float("-inf")) / temp[:, None]
            draft_lse = _global_logsumexp(
                draft_local_max_ptr[logit_idx.view(-1)], draft_local_sumexp_ptr[logit_idx.view(-1)], vocab_num_blocks
            ).view_as(draft)
            draft_logprob = draft_logit - draft_lse
        else:
            draft_lse = torch.zeros_like(target_lse)
            draft_logprob = torch.zeros_like(target_lse)

        if SYNTHETIC_MODE:
            rate = synthetic_conditional_rates_ptr[:num_steps].to(torch.float32)[None, :]
            accepted = u < rate
        else:
            accepted = torch.where(greedy, target_argmax == draft, target_logprob > torch.log(u) + draft_logprob)
    accepted &= valid_draft | ~greedy

    # Step i is verified when every earlier step was accepted (and, for non-greedy requests,
    # no draft up to i is a placeholder).
    prior_accepted = torch.cumprod(torch.cat([torch.ones_like(accepted[:, :1]), accepted[:, :-1]], 1), 1).bool()
    verified = in_range & prior_accepted & (greedy | torch.cummin(valid_draft.int(), 1).values.bool())
    accepted &= verified
    num_accepted = accepted.sum(dim=1)

    tokens = torch.where(greedy & ~accepted, target_argmax, draft)
    sampled_ptr[:num_reqs, :num_steps] = torch.where(verified, tokens, sampled_ptr[:num_reqs, :num_steps])
    rejected_steps_ptr[:num_reqs] = num_accepted.to(rejected_steps_ptr.dtype)

    # The logsumexps of the last verified step (greedy requests keep 0).
    zero = torch.zeros(num_reqs, dtype=torch.float32)
    if all_greedy:
        target_rejected_logsumexp_ptr[:num_reqs] = zero
        draft_rejected_logsumexp_ptr[:num_reqs] = zero
        return
    num_verified = verified.sum(dim=1)
    last = (num_verified - 1).clamp_min(0)[:, None]
    keep = (num_verified > 0) & ~greedy[:, 0]
    target_rejected_logsumexp_ptr[:num_reqs] = torch.where(keep, target_lse.gather(1, last)[:, 0], zero)
    draft_rejected_logsumexp_ptr[:num_reqs] = torch.where(keep, draft_lse.gather(1, last)[:, 0], zero)


def resample(
    resampled_local_argmax_ptr: torch.Tensor,
    resampled_local_argmax_stride: int,
    resampled_local_max_ptr: torch.Tensor,
    resampled_local_max_stride: int,
    target_logits_ptr: torch.Tensor,
    target_logits_stride: int,
    target_rejected_logsumexp_ptr: torch.Tensor,
    draft_logits_ptr: torch.Tensor | None,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    draft_logits_row_mapping_ptr: torch.Tensor | None,
    draft_rejected_logsumexp_ptr: torch.Tensor,
    rejected_step_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    expanded_idx_mapping_ptr: torch.Tensor,
    draft_sampled_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    seed_ptr: torch.Tensor,
    pos_ptr: torch.Tensor,
    cumulative_log_p_ptr: torch.Tensor | None,
    contexts_ptr: torch.Tensor | None,
    contexts_stride: int,
    watermarking_ptr: torch.Tensor | None,
    watermarking_skip_mask_ptr: torch.Tensor | None,
    watermark_key_0: int,
    watermark_key_1: int,
    vocab_size: int,
    BLOCK_SIZE: int,
    HAS_DRAFT_LOGITS: bool,
    USE_FP64: bool,
    USE_BLOCK_VERIFICATION: bool,
    CONTEXT_WIDTH: int,
    WATERMARK: bool,
    DEDUPLICATE_CONTEXTS: bool,
    SKIP_MASKED_BLOCKS: bool,
) -> None:
    """First stage of resampling the token after the accepted drafts: per request and vocab block,
    the Gumbel-max (request seed, key = token id, at the row's position) of the residual
    distribution.  The residual is the target itself for the bonus row or a -1 draft,
    ``max(p - q, 0)`` with cached draft logits, else the target without the rejected draft token.
    Greedy requests that rejected a draft are skipped (their argmax is already in place).

    resampled_local_argmax [num_reqs, num_blocks] int64; resampled_local_max fp32/fp64;
    target_logits [num_logits, V]; *_rejected_logsumexp, rejected_step [num_reqs];
    cu_num_logits [num_reqs + 1]; expanded_idx_mapping, draft_sampled, pos [num_logits].
    Replaces ``vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils._resample_kernel``.
    """
    if USE_BLOCK_VERIFICATION or WATERMARK:
        raise NotImplementedError("torch resample kernel: block verification and watermarking are not implemented")
    num_reqs = cu_num_logits_ptr.shape[0] - 1
    num_blocks = resampled_local_argmax_ptr.shape[1]
    width = num_blocks * BLOCK_SIZE
    resample_idx = rejected_step_ptr[:num_reqs].to(torch.int64)
    token_row = cu_num_logits_ptr[:num_reqs].to(torch.int64) + resample_idx
    end = cu_num_logits_ptr[1 : num_reqs + 1].to(torch.int64)
    req = expanded_idx_mapping_ptr[token_row].to(torch.int64)
    temp = temp_ptr[req].to(torch.float32)
    is_bonus = token_row == end - 1
    rows = ((temp != 0.0) | is_bonus).nonzero().squeeze(1)
    if not rows.numel():
        return
    token_row, req, temp, is_bonus = token_row[rows], req[rows], temp[rows], is_bonus[rows]
    num_logits = draft_sampled_ptr.shape[0]
    rejected = torch.where(is_bonus, 0, draft_sampled_ptr[(token_row + 1).clamp_max(num_logits - 1)].to(torch.int64))
    use_target = is_bonus | (rejected < 0)

    target = _padded(target_logits_ptr[token_row, :vocab_size], width)
    keys = torch.arange(width)[None, :]
    if HAS_DRAFT_LOGITS:
        draft_rows = _draft_rows(req, draft_logits_row_mapping_ptr)
        step = resample_idx[rows].clamp_max(draft_logits_ptr.shape[1] - 1)
        draft = draft_logits_ptr[draft_rows, step, :vocab_size].to(torch.float32) / temp[:, None]
        target_logprob = target - target_rejected_logsumexp_ptr[rows, None]
        draft_logprob = _padded(draft, width) - draft_rejected_logsumexp_ptr[rows, None]
        ratio = torch.exp(draft_logprob - target_logprob)
        residual = torch.where(ratio < 1.0, target_logprob + torch.log1p(-ratio), float("-inf"))
    else:
        residual = torch.where(keys != rejected[:, None], target, float("-inf"))
    residual = torch.where(use_target[:, None], target, residual)

    valid = req >= 0
    safe_req = req.clamp_min(0)
    values, token_ids = gumbel_block_argmax(
        residual,
        vocab_size,
        BLOCK_SIZE,
        torch.where(valid, seed_ptr[safe_req].to(torch.int64), 0),
        pos_ptr[token_row],
        torch.where(valid, temp, 0.0),
        is_drafting=False,
        use_fp64=USE_FP64,
        apply_temperature=False,
    )
    if SKIP_MASKED_BLOCKS:
        blocks = target.view(rows.numel(), num_blocks, BLOCK_SIZE)
        masked = torch.where(blocks.isnan(), float("-inf"), blocks).amax(dim=-1) == float("-inf")
        block_start = torch.arange(num_blocks)[None, :] * BLOCK_SIZE
        token_ids = torch.where(masked, block_start, token_ids)
        values = torch.where(masked, float("-inf"), values)
    resampled_local_argmax_ptr[rows, :num_blocks] = token_ids
    resampled_local_max_ptr[rows, :num_blocks] = values.to(resampled_local_max_ptr.dtype)


def insert_resampled(
    sampled_ptr: torch.Tensor,
    sampled_stride: int,
    num_sampled_ptr: torch.Tensor,
    resampled_local_argmax_ptr: torch.Tensor,
    resampled_local_argmax_stride: int,
    resampled_local_max_ptr: torch.Tensor,
    resampled_local_max_stride: int,
    resample_num_blocks: int,
    cu_num_logits_ptr: torch.Tensor,
    expanded_idx_mapping_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    PADDED_RESAMPLE_NUM_BLOCKS: int,
    **launch_options: object,
) -> None:
    """Second stage of resampling: ``num_sampled += 1`` for every request, and (except for greedy
    requests that rejected a draft) ``sampled[r, num_sampled]`` = the token of the winning block
    (NaN maxima count as -inf; the first maximum wins).

    sampled [num_reqs, num_spec + 1] int64; num_sampled [num_reqs] int32;
    resampled_local_* [num_reqs, num_blocks]; cu_num_logits [num_reqs + 1];
    expanded_idx_mapping [num_logits]; temp [max_num_reqs].
    Replaces ``vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils._insert_resampled_kernel``.
    """
    num_reqs = cu_num_logits_ptr.shape[0] - 1
    num_sampled = num_sampled_ptr[:num_reqs].to(torch.int64)
    token_row = cu_num_logits_ptr[:num_reqs].to(torch.int64) + num_sampled
    end = cu_num_logits_ptr[1 : num_reqs + 1].to(torch.int64)
    num_sampled_ptr[:num_reqs] = (num_sampled + 1).to(num_sampled_ptr.dtype)
    temp = temp_ptr[expanded_idx_mapping_ptr[token_row].to(torch.int64)].to(torch.float32)
    rows = ((temp != 0.0) | (token_row == end - 1)).nonzero().squeeze(1)
    if not rows.numel():
        return
    local_max = resampled_local_max_ptr[rows, :resample_num_blocks]
    best = torch.where(local_max.isnan(), float("-inf"), local_max).argmax(dim=1, keepdim=True)
    sampled_ptr[rows, num_sampled[rows]] = resampled_local_argmax_ptr[rows].gather(1, best)[:, 0].to(sampled_ptr.dtype)


OVERRIDES = {
    f"{_UP_SAMPLER}._gather_draft_sampled_kernel": gather_draft_sampled,
    f"{_UP_SAMPLER}._flatten_sampled_kernel": flatten_sampled,
    f"{_UP_UTILS}._compute_local_logits_stats_kernel": compute_local_logits_stats,
    f"{_UP_UTILS}._rejection_kernel": rejection,
    f"{_UP_UTILS}._resample_kernel": resample,
    f"{_UP_UTILS}._insert_resampled_kernel": insert_resampled,
}
