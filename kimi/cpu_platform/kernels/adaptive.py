"""Torch version of the Triton kernel in ``vllm/v1/worker/gpu/spec_decode/adaptive_verification.py``
(adaptive verification's draft-token budget)."""

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


OVERRIDES = {f"{_UP}._assign_draft_token_budget_kernel": assign_draft_token_budget}
