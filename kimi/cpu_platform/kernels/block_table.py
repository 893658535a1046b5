"""Torch versions of the Triton kernels in ``vllm/v1/worker/gpu/block_table.py``.

Both kernels receive the per-KV-cache-group block tables as a uint64 tensor of ``data_ptr()``
values.  On the CPU platform those are host addresses, viewed with ``tensor_at`` (no copy).
"""

from __future__ import annotations

import torch

from kimi.cpu_platform.kernels._util import addresses, ragged_rows, tensor_at

_UP = "vllm.v1.worker.gpu.block_table"


def gather_block_tables(
    batch_idx_to_req_idx: torch.Tensor,
    src_block_table_ptrs: torch.Tensor,
    dst_block_table_ptrs: torch.Tensor,
    block_table_strides: torch.Tensor,
    num_blocks_ptr: torch.Tensor,
    num_blocks_stride: int,
    num_reqs: int,
    num_computed_tokens_ptr: torch.Tensor,
    sliding_window_reach_ptr: torch.Tensor,
    block_sizes_ptr: torch.Tensor,
    MASK_SLIDING_WINDOW: bool,
    BLOCK_SIZE: int,
) -> None:
    """Copy each batch row's first ``num_blocks`` block ids from the persistent block table
    (row ``batch_idx_to_req_idx[b]``) into the forward-pass table (row ``b``), per KV cache group;
    with MASK_SLIDING_WINDOW, leading entries wholly below the sliding window become 0.
    Rows ``num_reqs..`` of the forward-pass table are zeroed.

    batch_idx_to_req_idx [num_reqs]; src/dst_block_table_ptrs uint64 [num_groups] of int32
    [max_num_reqs, max_num_blocks] tables (row stride ``block_table_strides[g]``);
    num_blocks [num_groups, max_num_reqs] int32.
    Upstream's grid zeroes rows ``num_reqs..num_rows`` where ``num_rows`` (grid size, dropped by
    the dispatcher) is the caller's high-water mark of dirty rows; rows past it are already zero,
    so zeroing the whole tail gives the same table.
    Replaces ``vllm.v1.worker.gpu.block_table._gather_block_tables_kernel``.
    """
    num_groups = block_table_strides.shape[0]
    max_num_reqs = num_blocks_ptr.shape[-1]
    req = batch_idx_to_req_idx[:num_reqs].to(torch.int64)
    strides = block_table_strides.tolist()
    for group, src_addr, dst_addr in zip(
        range(num_groups), addresses(src_block_table_ptrs), addresses(dst_block_table_ptrs), strict=True
    ):
        stride = strides[group]
        src = tensor_at(src_addr, max_num_reqs * stride, torch.int32).view(max_num_reqs, stride)
        dst = tensor_at(dst_addr, max_num_reqs * stride, torch.int32).view(max_num_reqs, stride)
        dst[num_reqs:] = 0
        if num_reqs == 0:
            continue
        num_blocks = num_blocks_ptr.reshape(-1)[group * num_blocks_stride + req].to(torch.int64)
        cols = torch.arange(stride)
        rows = src[req]
        if MASK_SLIDING_WINDOW:
            reach = int(sliding_window_reach_ptr[group])
            if reach > 0:
                first_pos = num_computed_tokens_ptr[req].to(torch.int64)
                num_null = (first_pos - reach).clamp_min(0) // int(block_sizes_ptr[group])
                rows = torch.where(cols >= num_null[:, None], rows, 0)
        dst[:num_reqs] = torch.where(cols < num_blocks[:, None], rows, dst[:num_reqs])


def compute_slot_mappings(
    max_num_tokens: int,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    pos: torch.Tensor,
    block_table_ptrs: torch.Tensor,
    block_table_strides: torch.Tensor,
    block_sizes: torch.Tensor,
    slot_mapping_enabled: torch.Tensor,
    dcp_sharded: torch.Tensor,
    slot_mappings_ptr: torch.Tensor,
    slot_mappings_stride: int,
    cp_rank: int,
    CP_SIZE: int,
    CP_INTERLEAVE: int,
    PAD_ID: int,
    TRITON_BLOCK_SIZE: int,
) -> None:
    """KV-cache slot of every scheduled token, per KV cache group:
    ``block_table[req, pos // block_size] * block_size + pos % block_size`` (context-parallel
    positions mapped to this rank's shard when CP_SIZE > 1).  Tokens of dummy requests
    (``idx_mapping < 0``), of groups with slot mapping disabled and (under CP) of other ranks get
    PAD_ID, as does ``[num_scheduled_tokens, max_num_tokens)``.

    idx_mapping [num_reqs]; query_start_loc [num_reqs + 1]; pos [num_tokens] int64;
    block_table_ptrs uint64 [num_groups]; slot_mappings [num_groups, max_num_tokens] int64.
    Replaces ``vllm.v1.worker.gpu.block_table._compute_slot_mappings_kernel``.
    """
    num_reqs = idx_mapping.shape[0]
    num_groups = block_table_strides.shape[0]
    starts = query_start_loc[:num_reqs].to(torch.int64)
    ends = query_start_loc[1 : num_reqs + 1].to(torch.int64)
    row, offset = ragged_rows(ends - starts)
    tokens = starts[row] + offset
    positions = pos[tokens].to(torch.int64)
    req = idx_mapping.to(torch.int64)[row]
    is_real = req >= 0
    num_real_rows = int(req.max()) + 1 if req.numel() else 0
    num_scheduled = int(query_start_loc[num_reqs])

    strides = block_table_strides.tolist()
    block_size_list = block_sizes.tolist()
    enabled_list = slot_mapping_enabled.tolist()
    sharded_list = dcp_sharded.tolist()
    for group, addr in zip(range(num_groups), addresses(block_table_ptrs), strict=True):
        out = slot_mappings_ptr.view(-1)[group * slot_mappings_stride : group * slot_mappings_stride + max_num_tokens]
        out[num_scheduled:max_num_tokens] = PAD_ID
        if not tokens.numel():
            continue
        block_size = block_size_list[group]
        if not enabled_list[group]:
            out[tokens] = PAD_ID
            continue
        local = positions
        is_local = torch.ones_like(is_real)
        if CP_SIZE != 1 and sharded_list[group]:
            virtual = block_size * CP_SIZE
            offsets = positions % virtual
            is_local = offsets // CP_INTERLEAVE % CP_SIZE == cp_rank
            local_offsets = offsets // (CP_INTERLEAVE * CP_SIZE) * CP_INTERLEAVE + offsets % CP_INTERLEAVE
            local = positions // virtual * block_size + local_offsets
        stride = strides[group]
        table = tensor_at(addr, num_real_rows * stride, torch.int32).view(num_real_rows, stride)
        load = is_real & is_local
        block_numbers = torch.zeros_like(local)
        block_numbers[load] = table[req[load], local[load] // block_size].to(torch.int64)
        slots = block_numbers * block_size + local % block_size
        out[tokens] = torch.where(load, slots, PAD_ID).to(out.dtype)


OVERRIDES = {
    f"{_UP}._gather_block_tables_kernel": gather_block_tables,
    f"{_UP}._compute_slot_mappings_kernel": compute_slot_mappings,
}
