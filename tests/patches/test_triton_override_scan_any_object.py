"""Patch 0013: the Triton-override scan skips objects whose ``__dict__`` is not a mapping.

On CPU the worker swaps vLLM's Triton kernels for C++ fallbacks at start (``register_triton_kernel_overrides`` ->
``vllm/triton_utils/dispatcher.py``), scanning every attribute of every imported module. llvmlite's ``ffi.lib``
(imported with numba) answers ``__dict__`` through its ``__getattr__`` with a function wrapper, and upstream's
``vars(value).get("kernel")`` then raises ``AttributeError: '_lib_fn_wrapper' object has no attribute 'get'``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

#: A mainline patch for code 0.32.0 added: 0.26.0 has no Triton-override dispatcher
#: (`register_triton_kernel_overrides` is None there).
pytestmark = [pytest.mark.install, pytest.mark.line("v0.32")]

_SCRIPT = textwrap.dedent("""
    import llvmlite.binding  # noqa: F401  (brings ffi.lib into sys.modules, as numba does)
    from vllm.platforms import current_platform
    if not current_platform.is_cpu():
        print("SKIP the overrides are the CPU platform's")
        raise SystemExit(0)
    current_platform.register_triton_kernel_overrides()
    from vllm.v1.worker.block_table import ComputeSlotMappingKernel
    from vllm.triton_utils.dispatcher import KernelOverride
    print("OK", isinstance(ComputeSlotMappingKernel.kernel, KernelOverride))
""")


def test_overrides_register_with_llvmlite_imported() -> None:
    pytest.importorskip("llvmlite")
    result = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    if "SKIP" in result.stdout:
        pytest.skip(result.stdout.strip())
    assert "OK True" in result.stdout, result.stdout + result.stderr[-1000:]
