"""Stand-ins for libraries that upstream's test modules import at load and that the CPU venv cannot install.

Each is a folder holding a package of the library's name; :func:`needed` returns this folder for ``PYTHONPATH``
where an interpreter cannot import one of them.  Today: ``torchvision`` (vLLM's MiniMax-M3 processor imports it at
module level; the package index has no CPU build for torch 2.13, and its CUDA builds need ``libtorch_cuda``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

#: The folder to put first on ``PYTHONPATH``.
FOLDER = Path(__file__).resolve().parent
#: The libraries stood in for.
LIBRARIES = ("torchvision",)


def needed(python: Path) -> list[str]:
    """The libraries of :data:`LIBRARIES` that ``python`` cannot import (each checked in a child process)."""
    return [name for name in LIBRARIES
            if subprocess.run([str(python), "-c", f"import {name}"], capture_output=True).returncode != 0]
