"""Patch 0012: the CPU slot-mapping fallback takes the arguments vLLM 0.32.0's launcher gives it.

The model runner computes each scheduled token's KV cache slot with ``_COMPUTE_SLOT_MAPPING_KERNEL`` (a Triton
kernel on GPUs; on CPU a dispatcher to ``vllm/utils/cpu_triton_utils.py``, which calls the CPU wheel's
``compute_slot_mapping_kernel_impl``). The sdist's fallback expects a ``block_size`` argument the launcher no
longer passes: positionally, ``slot_mapping`` then lands in ``block_size`` and the first step of every CPU engine
dies ("Boolean value of Tensor with more than one value is ambiguous"). Here the launch is made as
``BlockTable.compute_slot_mapping`` makes it, on two requests, and the slots are checked.
"""

from __future__ import annotations

import pytest

#: A mainline patch for code 0.32.0 added: 0.26.0 has no `_COMPUTE_SLOT_MAPPING_KERNEL`
#: (the v0.26 line has no such patch).
pytestmark = [pytest.mark.install, pytest.mark.line("v0.32")]


def test_slots_of_two_requests() -> None:
    torch = pytest.importorskip("torch")
    from vllm.platforms import current_platform
    from vllm.v1.worker.block_table import _COMPUTE_SLOT_MAPPING_KERNEL

    if not current_platform.is_cpu():
        pytest.skip("the fallback is the CPU platform's (a GPU runs the Triton kernel)")
    current_platform.register_triton_kernel_overrides()  # as the worker does at start (worker_base.py)

    block_size = 16
    block_table = torch.tensor([[3, 7, 0, 0], [5, 0, 0, 0]], dtype=torch.int32)
    positions = torch.tensor([14, 15, 16, 17, 0, 1], dtype=torch.int64)  # request 0: 4 tokens, request 1: 2
    query_start_loc = torch.tensor([0, 4, 6], dtype=torch.int32)
    slot_mapping = torch.full((8,), -7, dtype=torch.int64)
    _COMPUTE_SLOT_MAPPING_KERNEL(2, 6, 8, query_start_loc, positions, block_table, block_table.stride(0),
                                 slot_mapping, block_size, 1, 0, 1)
    expected = [3 * 16 + 14, 3 * 16 + 15, 7 * 16 + 0, 7 * 16 + 1, 5 * 16 + 0, 5 * 16 + 1]
    assert slot_mapping[:6].tolist() == expected
