"""Torch version of the Triton kernel in ``vllm/v1/worker/gpu/structured_outputs.py``.

Upstream's kernel does not run in Triton's interpreter ("mask has unsupported dtype": its store mask ANDs a
scalar with a block), so structured outputs (``response_format``, guided regex/JSON) need this override on the
CPU platform.
"""

from __future__ import annotations

import torch

_UP = "vllm.v1.worker.gpu.structured_outputs"


def apply_grammar_bitmask(
    logits_ptr: torch.Tensor,
    logits_stride: int,
    logits_indices_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    bitmask_ptr: torch.Tensor,
    bitmask_stride: int,
    vocab_size: int,
    MASK_STRIDE: int,
    BLOCK_SIZE: int,
) -> None:
    """Set to ``-inf`` the logits of the tokens each grammar forbids, in place.

    logits [num_logits, >= vocab_size] float; bitmask [num_masks, words] int32, bit ``t % 32`` of word
    ``t // 32`` set where token ``t`` is allowed (xgrammar's packing); logits_indices [>= num_masks] int32,
    mask ``m`` belonging to request ``logits_indices[m] // MASK_STRIDE`` at its position
    ``logits_indices[m] % MASK_STRIDE``, whose logits row is ``cu_num_logits[request] + position``; a position at
    or past the request's number of logits rows is skipped (adaptive verification may trim them). A token past
    the bitmask's words is forbidden, as the kernel's masked load reads 0 there.
    Replaces ``vllm.v1.worker.gpu.structured_outputs._apply_grammar_bitmask_kernel``.
    """
    num_masks = bitmask_ptr.shape[0]
    if num_masks == 0:
        return
    mapping = logits_indices_ptr[:num_masks].to(torch.int64)
    request, position = mapping // MASK_STRIDE, mapping % MASK_STRIDE
    cu = cu_num_logits_ptr.to(torch.int64)
    active = position < cu[request + 1] - cu[request]
    rows = (cu[request] + position)[active]
    if rows.numel() == 0:
        return
    words = min(int(bitmask_stride), bitmask_ptr.shape[1])
    packed = bitmask_ptr[active, :words]
    shifts = torch.arange(32, dtype=packed.dtype, device=packed.device)
    allowed = ((packed.unsqueeze(-1) >> shifts) & 1).reshape(rows.numel(), words * 32).bool()
    forbidden = torch.ones(rows.numel(), vocab_size, dtype=torch.bool, device=logits_ptr.device)
    width = min(vocab_size, words * 32)
    forbidden[:, :width] = ~allowed[:, :width]
    view = logits_ptr.as_strided((logits_ptr.shape[0], vocab_size), (int(logits_stride), 1))
    view[rows] = view[rows].masked_fill(forbidden, float("-inf"))


OVERRIDES = {
    f"{_UP}._apply_grammar_bitmask_kernel": apply_grammar_bitmask,
}
