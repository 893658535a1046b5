"""Torch version of the Triton kernel in ``vllm/v1/worker/gpu/buffer_utils.py``."""

from __future__ import annotations

import torch

from kimi.cpu_platform.kernels._util import addresses, ragged_rows, tensor_at

_UP = "vllm.v1.worker.gpu.buffer_utils"


def apply_write(
    output_ptr: torch.Tensor,
    output_stride: int | torch.Tensor,
    write_indices_ptr: torch.Tensor,
    write_starts_ptr: torch.Tensor,
    write_contents_ptr: torch.Tensor,
    write_cu_lens_ptr: torch.Tensor,
    write_group_ids_ptr: torch.Tensor | None,
    BLOCK_SIZE: int,
    MULTI_GROUP: bool,
) -> None:
    """Apply staged row writes: write ``w`` copies ``contents[cu_lens[w-1]:cu_lens[w]]`` to
    ``output[indices[w], starts[w]:]``.

    write_indices, write_starts, write_cu_lens [num_writes] int32 (their length is the number of
    writes: upstream passes exactly the staged prefix); write_contents [total_len].
    Single group: ``output_ptr`` is the 2-D destination tensor, ``output_stride`` its row stride.
    MULTI_GROUP: ``output_ptr`` is a uint64 [num_groups] table of int32 destination addresses,
    ``output_stride`` an int64 [num_groups] tensor of row strides and ``write_group_ids`` picks
    each write's group.
    Replaces ``vllm.v1.worker.gpu.buffer_utils._apply_write_kernel``.
    """
    num_writes = write_indices_ptr.shape[0]
    if num_writes == 0:
        return
    cu_end = write_cu_lens_ptr[:num_writes].to(torch.int64)
    cu_start = torch.cat([cu_end.new_zeros(1), cu_end[:-1]])
    row, offset = ragged_rows(cu_end - cu_start)
    contents = write_contents_ptr[cu_start[row] + offset]
    target_row = write_indices_ptr[:num_writes].to(torch.int64)[row]
    target_col = write_starts_ptr[:num_writes].to(torch.int64)[row] + offset
    if not MULTI_GROUP:
        output_ptr.view(-1)[target_row * int(output_stride) + target_col] = contents.to(output_ptr.dtype)
        return
    group = write_group_ids_ptr[:num_writes].to(torch.int64)[row]
    strides = output_stride.tolist()
    for g, addr in enumerate(addresses(output_ptr)):
        selected = group == g
        if not bool(selected.any()):
            continue
        flat = target_row[selected] * strides[g] + target_col[selected]
        dst = tensor_at(addr, int(flat.max()) + 1, torch.int32)
        dst[flat] = contents[selected].to(torch.int32)


OVERRIDES = {
    f"{_UP}._apply_write_kernel": apply_write,
}
