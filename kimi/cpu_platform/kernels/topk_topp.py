"""Torch version of the top-k / top-p Triton kernel in ``vllm/v1/sample/ops/topk_topp_triton.py``.

Upstream's kernel does not run in Triton's interpreter (``row_id.to(tl.int64)`` on the Python int that
``tl.range`` yields there: "'int' object has no attribute 'to'"), so every sampled request with ``top_k`` or
``top_p`` (and the engine's JIT warm-up, which samples with both) stops the engine on the CPU platform without
this override. It masks as upstream's torch path does (``apply_top_k_top_p_pytorch``,
``vllm/v1/sample/ops/topk_topp_sampler.py``): top-k keeps every logit at or above the k-th largest (ties kept),
then top-p keeps the smallest set of the largest remaining logits whose probability reaches ``p`` (at least one).
"""

from __future__ import annotations

import inspect

import torch

_UP = "vllm.v1.sample.ops.topk_topp_triton"


def topk_topp(
    LOGITS: torch.Tensor,
    LOGITS_STRIDE_0: int,
    BUFFER: torch.Tensor,
    PERCENTILE_TO_STD_TABLE: torch.Tensor,
    NORMAL_CDF_TO_SIGMA_TABLE: torch.Tensor,
    K: torch.Tensor,
    P: torch.Tensor,
    BATCH_SIZE: int,
    VOCAB_SIZE: int,
    MASK_VALUE: float,
    BLOCK_SIZE: int,
    BLOCK_SIZE_TRUNC: int,
    TOPK_ENABLED: bool,
    TOPP_ENABLED: bool,
    SPLIT_COVERS_PONLY: bool,
    **launch_options: object,
) -> None:
    """Set to ``MASK_VALUE`` the logits top-k and top-p remove, in place.

    LOGITS [>= BATCH_SIZE rows of stride LOGITS_STRIDE_0, >= VOCAB_SIZE] float32; K [BATCH_SIZE] int (a row whose k
    is VOCAB_SIZE or more has no top-k), read when TOPK_ENABLED; P [BATCH_SIZE] float (1.0: no top-p), read when
    TOPP_ENABLED. With SPLIT_COVERS_PONLY (CUDA only) the rows without an active top-k get no top-p here: upstream's
    split pipeline masks them. BUFFER and the two tables are the Triton kernel's scratch and pivot-search tables;
    ``launch_options`` (``num_warps``: upstream's launcher passes it with the arguments) are Triton's.
    Replaces ``vllm.v1.sample.ops.topk_topp_triton._topk_topp_kernel``.
    """
    batch, vocab = int(BATCH_SIZE), int(VOCAB_SIZE)
    if batch == 0 or not (TOPK_ENABLED or TOPP_ENABLED):
        return
    rows = LOGITS.as_strided((batch, vocab), (int(LOGITS_STRIDE_0), 1))
    ordered, order = rows.sort(dim=-1)  # ascending, as upstream's torch path
    drop = torch.zeros_like(ordered, dtype=torch.bool)
    k = K[:batch].to(torch.int64).clamp(1, vocab) if TOPK_ENABLED else None
    if k is not None:
        drop |= ordered < ordered.gather(1, (vocab - k).unsqueeze(1))
    if TOPP_ENABLED:
        p = P[:batch].to(torch.float32)
        if SPLIT_COVERS_PONLY and k is not None:
            p = torch.where(k >= vocab, torch.ones_like(p), p)
        cumulative = ordered.masked_fill(drop, float("-inf")).softmax(dim=-1).cumsum(dim=-1)
        below = cumulative <= 1 - p.unsqueeze(1)
        below[:, -1] = False  # the largest logit stays
        drop |= below
    rows.masked_fill_(torch.zeros_like(drop).scatter_(1, order, drop), MASK_VALUE)


# The dispatcher forwards a launch by keyword, launch options included, when the function's arg_names are the kernel's
topk_topp.arg_names = tuple(name for name, param in inspect.signature(topk_topp).parameters.items()  # type: ignore[attr-defined]
                            if param.kind is not inspect.Parameter.VAR_KEYWORD)

OVERRIDES = {
    f"{_UP}._topk_topp_kernel": topk_topp,
}
