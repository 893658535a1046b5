"""Torch implementations of the V2 model runner's Triton kernels, for the CPU platform.

``OVERRIDES`` maps each upstream kernel's qualified name to a plain function taking the kernel's
launch arguments (same names and order, constexprs included); the platform passes it to
``vllm.triton_utils.dispatcher.register_kernels``.  The dispatcher drops the launch grid, so every
function covers the whole launch from its arguments.  Kernels not listed keep running in Triton's
interpreter.
"""

from __future__ import annotations

from collections.abc import Callable

from kimi.cpu_platform.kernels import (
    adaptive,
    block_table,
    buffer_utils,
    gumbel,
    input_batch,
    rejection,
    speculator,
    structured_outputs,
    topk_topp,
)

OVERRIDES: dict[str, Callable[..., None]] = {
    **input_batch.OVERRIDES,
    **block_table.OVERRIDES,
    **buffer_utils.OVERRIDES,
    **gumbel.OVERRIDES,
    **rejection.OVERRIDES,
    **speculator.OVERRIDES,
    **adaptive.OVERRIDES,
    **structured_outputs.OVERRIDES,
    **topk_topp.OVERRIDES,
}

__all__ = ["OVERRIDES"]
