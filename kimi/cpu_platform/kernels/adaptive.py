"""Torch versions of adaptive verification's Triton kernels: the draft-token budget
(``vllm/v1/worker/gpu/spec_decode/adaptive_verification.py``) and the online acceptance estimator's per-step
kernels (``acceptance_estimator.py``: the per-step ones and the refit, once per 100 steps, which took ~30 ms a call in
Triton's interpreter)."""

from __future__ import annotations

import torch

_UP = "vllm.v1.worker.gpu.spec_decode.adaptive_verification"
#: The float32 bits of +inf: the top of upstream's threshold search.
_INF_BITS = 0x7F800000


def assign_draft_token_budget(
    confidence_probs_ptr: torch.Tensor,
    confidence_probs_stride: int,
    idx_mapping_ptr: torch.Tensor,
    capacities_ptr: torch.Tensor,
    survival_ptr: torch.Tensor,
    num_reqs: int,
    draft_budget: int,
    NUM_STEPS: int,
    BLOCK_REQS: int,
    BLOCK_SIZE: int,
    **launch_options,
) -> None:
    """Admit the ``draft_budget`` draft slots of highest survival probability, in place.

    Slot (request b, step s) scores the float32 bits of ``prod(confidence_probs[idx_mapping[b], :s + 1])``
    if ``s < capacities[b]``, else -1 (written to ``survival`` [num_reqs * NUM_STEPS] int32).  The threshold
    is the largest value that at least ``draft_budget`` slots reach (clamped to [0, +inf bits]); slots above
    it are admitted, tied slots go out in request order until the budget is spent.  ``capacities``
    [num_reqs] int32 enters as each request's scheduled draft count and leaves as its admitted count.
    ``confidence_probs`` [max_num_reqs, NUM_STEPS] float32 (row stride ``confidence_probs_stride``),
    ``idx_mapping`` [num_reqs] int.  Block sizes and launch options are ignored.
    Replaces ``vllm.v1.worker.gpu.spec_decode.adaptive_verification._assign_draft_token_budget_kernel``.
    """
    if num_reqs <= 0:
        return
    rows = idx_mapping_ptr[:num_reqs].to(torch.int64)
    flat = confidence_probs_ptr.reshape(-1)
    columns = torch.arange(NUM_STEPS, dtype=torch.int64)
    probs = flat[rows[:, None] * confidence_probs_stride + columns[None, :]].to(torch.float32)
    # step by step in float32, as the kernel multiplies (torch.cumprod rounds differently)
    running = torch.ones(num_reqs, dtype=torch.float32)
    products = torch.empty_like(probs)
    for step in range(NUM_STEPS):
        running = running * probs[:, step]
        products[:, step] = running
    survival = products.view(torch.int32)
    capacity = capacities_ptr[:num_reqs].to(torch.int64)
    bits = torch.where(columns[None, :] < capacity[:, None], survival, torch.full_like(survival, -1))
    survival_ptr[: num_reqs * NUM_STEPS] = bits.reshape(-1)

    if draft_budget <= 0:
        threshold = _INF_BITS
    elif draft_budget > bits.numel():
        threshold = 0
    else:
        ranked = torch.sort(bits.reshape(-1), descending=True).values
        threshold = min(max(int(ranked[draft_budget - 1]), 0), _INF_BITS)
    above = (bits > threshold).sum(dim=1)
    tied = (bits == threshold).sum(dim=1)
    ties_left = draft_budget - int(above.sum())
    tied_before = torch.cumsum(tied, 0) - tied
    taken = torch.minimum(tied, (ties_left - tied_before).clamp_min(0))
    capacities_ptr[:num_reqs] = (above + taken).to(capacities_ptr.dtype)


_EST = "vllm.v1.worker.gpu.spec_decode.acceptance_estimator"


def local_max_sumexp(
    local_max_ptr: torch.Tensor,
    local_max_stride: int,
    local_excl_sumexp_ptr: torch.Tensor,
    local_excl_sumexp_stride: int,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    idx_mapping_ptr: torch.Tensor,
    idx_mapping_stride: int,
    temperature_ptr: torch.Tensor,
    num_tokens: int,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    """Per draft row and vocabulary block of ``BLOCK_SIZE``: the max of the temperature-scaled logits and the
    sum of ``exp(logit - max)`` over the block with one copy of the max left out.

    ``logits`` [num_tokens, vocab_size] (pre-temperature; temperature 0 means 1), ``idx_mapping``
    [num_tokens] request state per row (-1: padding, written as -inf / 0), ``temperature`` [max_num_reqs];
    writes ``local_max`` and ``local_excl_sumexp`` [num_tokens, num_blocks] float32.
    Replaces ``vllm.v1.worker.gpu.spec_decode.acceptance_estimator._local_max_sumexp_kernel``.
    """
    if num_tokens <= 0:
        return
    num_blocks = local_max_ptr.shape[1]
    req = idx_mapping_ptr[:num_tokens].to(torch.int64)
    valid = req >= 0
    temp = temperature_ptr[req.clamp_min(0)].to(torch.float32)
    temp = torch.where(temp > 0, temp, torch.ones_like(temp))
    scaled = logits_ptr[:num_tokens, :vocab_size].to(torch.float32) / temp[:, None]
    if num_blocks == 1:  # the whole vocabulary in one block (drafters' draft vocabularies): no padded copy
        blocks = scaled[:, None, :]
    else:
        logits = torch.full((num_tokens, num_blocks * BLOCK_SIZE), float("-inf"), dtype=torch.float32)
        logits[:, :vocab_size] = scaled
        blocks = logits.view(num_tokens, num_blocks, BLOCK_SIZE)
    block_max = blocks.amax(dim=2)
    is_max = blocks == block_max[:, :, None]
    excl = torch.where(is_max, 0.0, torch.exp(blocks - block_max[:, :, None])).sum(dim=2)
    excl = excl + is_max.sum(dim=2).to(torch.float32) - 1.0
    excl = torch.where(block_max > float("-inf"), excl, 0.0)
    local_max_ptr[:num_tokens] = torch.where(valid[:, None], block_max, float("-inf"))
    local_excl_sumexp_ptr[:num_tokens] = torch.where(valid[:, None], excl, 0.0)


def predict(
    features_ptr: torch.Tensor,
    features_stride: int,
    pred_ptr: torch.Tensor,
    pred_stride: int,
    conf_ptr: torch.Tensor,
    conf_stride: int,
    slope_ptr: torch.Tensor,
    intercepts_ptr: torch.Tensor,
    local_max_ptr: torch.Tensor,
    local_max_stride: int,
    local_excl_sumexp_ptr: torch.Tensor,
    local_excl_sumexp_stride: int,
    idx_mapping_ptr: torch.Tensor,
    idx_mapping_stride: int,
    step_ptr: torch.Tensor,
    num_tokens: int,
    vocab_num_blocks: int,
    per_token_step: bool,
    NUM_SPECULATIVE_STEPS: int,
    MAX_LOG_ODDS: float,
    PADDED_VOCAB_NUM_BLOCKS: int,
) -> None:
    """Each draft row's feature ``logit(max softmax)`` (from the block partials, clamped to +-MAX_LOG_ODDS) and
    its predicted acceptance ``sigmoid(slope * feature + intercepts[step])``.

    Writes ``features`` and ``pred`` [max_num_reqs, NUM_SPECULATIVE_STEPS] at (request state, step) and ``conf``
    [num_reqs, NUM_SPECULATIVE_STEPS] at (batch row, step); rows with request state -1 are skipped.  ``step``
    is one draft step for every row, or (``per_token_step``) one per row, a request owning
    NUM_SPECULATIVE_STEPS consecutive rows.
    Replaces ``vllm.v1.worker.gpu.spec_decode.acceptance_estimator._predict_kernel``.
    """
    if num_tokens <= 0:
        return
    rows = torch.arange(num_tokens)
    req = idx_mapping_ptr[:num_tokens].to(torch.int64)
    if per_token_step:
        step = step_ptr[:num_tokens].to(torch.int64)
        batch = rows // NUM_SPECULATIVE_STEPS
    else:
        step = step_ptr.reshape(-1)[0].to(torch.int64).expand(num_tokens)
        batch = rows
    keep = req >= 0
    req, step, batch = req[keep], step[keep], batch[keep]
    maxes = local_max_ptr[:num_tokens, :vocab_num_blocks][keep]
    excl = local_excl_sumexp_ptr[:num_tokens, :vocab_num_blocks][keep]
    if vocab_num_blocks == 1:  # one block: the complement of the top probability is its excluded sum
        complement = excl[:, 0]
    else:
        global_max = maxes.max(dim=1, keepdim=True).values
        best = torch.argmax(maxes, dim=1, keepdim=True)
        scale = torch.exp(maxes - global_max)
        blocks = torch.arange(vocab_num_blocks)[None, :]
        complement = (excl * scale + torch.where(blocks == best, 0.0, scale)).sum(dim=1)
    feature = (-torch.log(complement)).clamp(-MAX_LOG_ODDS, MAX_LOG_ODDS)
    prob = torch.sigmoid(slope_ptr.reshape(-1)[0] * feature + intercepts_ptr[step])
    features_ptr[req, step] = feature
    pred_ptr[req, step] = prob
    conf_ptr[batch, step] = prob


def accumulate(
    info_ptr: torch.Tensor,
    grad_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    features_ptr: torch.Tensor,
    features_stride: int,
    pred_ptr: torch.Tensor,
    pred_stride: int,
    counts_ptr: torch.Tensor,
    num_reqs: int,
    BLOCK_R: int,
    **launch_options,
) -> None:
    """Fold one verified step into the estimator's IRLS statistics, per draft position k.

    Position k of request b is observed when ``k <= accepted`` and ``k < accepted + rejected`` (accepted =
    ``num_sampled - 1``, floored at 0), labelled 1 if ``k < accepted``; with ``w = p (1 - p)``, ``r = label - p``
    and feature ``f`` it adds ``[w f^2, w f, w]`` to ``info`` [K, 3], ``[r f, r]`` to ``grad`` [K, 2] and 1 to
    ``counts`` [K] (float32).  ``features``/``pred`` [max_num_reqs, K] by request state; batch tensors [num_reqs].
    Replaces ``vllm.v1.worker.gpu.spec_decode.acceptance_estimator._accumulate_kernel``.
    """
    num_reqs = min(num_reqs, BLOCK_R)
    if num_reqs <= 0:
        return
    num_steps = info_ptr.shape[0]
    accepted = (num_sampled_ptr[:num_reqs].to(torch.int64) - 1).clamp_min(0)
    admitted = accepted + num_rejected_ptr[:num_reqs].to(torch.int64)
    if not bool((admitted > 0).any()):
        return  # no draft verified (a step without drafts): nothing is observed, every sum below adds 0
    req = idx_mapping_ptr[:num_reqs].to(torch.int64)
    steps = torch.arange(num_steps)[:, None]
    feature = features_ptr[req, :num_steps].to(torch.float32).T
    pred = pred_ptr[req, :num_steps].to(torch.float32).T
    observed = (steps <= accepted[None, :]) & (steps < admitted[None, :])
    label = (steps < accepted[None, :]).to(torch.float32)
    w = torch.where(observed, pred * (1.0 - pred), 0.0)
    resid = torch.where(observed, label - pred, 0.0)
    info_ptr[:, 0] += (w * feature * feature).sum(dim=1)
    info_ptr[:, 1] += (w * feature).sum(dim=1)
    info_ptr[:, 2] += w.sum(dim=1)
    grad_ptr[:, 0] += (resid * feature).sum(dim=1)
    grad_ptr[:, 1] += resid.sum(dim=1)
    counts_ptr += observed.to(torch.float32).sum(dim=1)


def refit(
    slope_ptr: torch.Tensor,
    intercepts_ptr: torch.Tensor,
    info_ptr: torch.Tensor,
    info_row_stride: int,
    grad_ptr: torch.Tensor,
    grad_row_stride: int,
    counts_ptr: torch.Tensor,
    NUM_SPECULATIVE_STEPS: int,
    L2: float,
    DAMPING: float,
    BLOCK: int,
    **launch_options,
) -> None:
    """One damped Newton step of the estimator's logistic fit from the statistics :func:`accumulate` gathered, then
    those statistics cleared.

    The system is upstream's arrowhead one, ``(X^T W X + L2 I) d = X^T r`` over the shared slope ``w`` (``[1]``) and
    the per-position intercepts (``[K]``), solved by eliminating the intercepts: ``dw = (g0 - sum(b g1 / c)) /
    (a - sum(b^2 / c))``, damped by ``n / (n + DAMPING)`` over all positions' counts, dropped if NaN or if it would
    make ``w`` negative; ``db_k = (g1_k - b_k dw) / c_k``, damped by position k's count, dropped if NaN.  ``info``
    ``[K, 3]`` holds ``a_k, b_k, c_k`` (``a = sum a_k + L2``, ``c_k`` + L2), ``grad`` ``[K, 2]`` ``g0_k, g1_k``,
    ``counts`` ``[K]``; float32 throughout.  Replaces
    ``vllm.v1.worker.gpu.spec_decode.acceptance_estimator._refit_kernel``.
    """
    k = NUM_SPECULATIVE_STEPS
    info, grad, n = info_ptr[:k].to(torch.float32), grad_ptr[:k].to(torch.float32), counts_ptr[:k].to(torch.float32)
    a_k, b_k, c_k = info[:, 0], info[:, 1], info[:, 2] + L2
    g0, g1_k = grad[:, 0].sum(), grad[:, 1]
    a = a_k.sum() + L2
    w = slope_ptr.view(-1)[0].to(torch.float32)
    step_w = (g0 - (b_k * g1_k / c_k).sum()) / (a - (b_k * b_k / c_k).sum())
    total_n = n.sum()
    step_w = step_w * (total_n / (total_n + DAMPING))
    step_w = torch.where((step_w == step_w) & (w + step_w >= 0.0), step_w, torch.zeros_like(step_w))
    step_bias = (g1_k - b_k * step_w) / c_k * (n / (n + DAMPING))
    step_bias = torch.where(step_bias == step_bias, step_bias, torch.zeros_like(step_bias))
    slope_ptr.view(-1)[0] = w + step_w
    intercepts_ptr[:k] += step_bias.to(intercepts_ptr.dtype)
    info_ptr[:k] = 0.0
    grad_ptr[:k] = 0.0
    counts_ptr[:k] = 0.0


OVERRIDES = {
    f"{_UP}._assign_draft_token_budget_kernel": assign_draft_token_budget,
    f"{_EST}._local_max_sumexp_kernel": local_max_sumexp,
    f"{_EST}._predict_kernel": predict,
    f"{_EST}._accumulate_kernel": accumulate,
    f"{_EST}._refit_kernel": refit,
}
