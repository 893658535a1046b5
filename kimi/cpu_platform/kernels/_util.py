"""Helpers shared by the torch kernel overrides: ragged index expansion and pointer views."""

from __future__ import annotations

import ctypes

import torch


def ragged_rows(lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Expand per-row lengths into one entry per element.

    ``lengths``: [n] non-negative integers.  Returns ``(row, offset)``, both int64 of size
    ``lengths.sum()``: element ``e`` belongs to row ``row[e]`` at position ``offset[e]`` within it.
    """
    lengths = lengths.to(torch.int64).clamp_min(0)
    total = int(lengths.sum())
    row = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths, output_size=total)
    starts = torch.cumsum(lengths, 0) - lengths
    offset = torch.arange(total, device=lengths.device) - starts[row]
    return row, offset


def tensor_at(address: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A 1-D CPU tensor of ``numel`` elements viewing host memory at ``address`` (no copy).

    Several V2 kernels receive tables of ``data_ptr()`` values (uint64 tensors) instead of tensors;
    on a CPU device those are host addresses, so the memory they name can be viewed directly.  The
    caller must keep the viewed allocation alive and ``numel`` within it.
    """
    if numel <= 0:
        return torch.empty(0, dtype=dtype)
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    return torch.frombuffer((ctypes.c_char * nbytes).from_address(address), dtype=dtype, count=numel)


def addresses(ptrs: torch.Tensor) -> list[int]:
    """The host addresses held in a pointer table (a uint64 or int64 tensor of ``data_ptr()`` values)."""
    return [int(p) & 0xFFFFFFFFFFFFFFFF for p in ptrs.view(torch.int64).tolist()]
