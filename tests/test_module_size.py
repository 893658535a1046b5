"""No module of ``kimi/`` or of the lab (``lab/kimi_lab/``) over :data:`MAX_LINES` lines: one that grows past it does
more than one job and is split along them (``kimi/kernels/vllm_build.py`` became toolchain, CMake tree, plan and
run; the lab's ``gpukit.py`` its command line and ``kit/``)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KIMI = ROOT / "kimi"
LAB = ROOT / "lab" / "kimi_lab"
MAX_LINES = 600


def oversized(package: Path, limit: int = MAX_LINES) -> dict[str, int]:
    """``{path: lines}`` of the Python files under ``package`` longer than ``limit`` lines."""
    sizes = {path: len(path.read_text().splitlines()) for path in sorted(package.rglob("*.py"))}
    return {str(path.relative_to(ROOT)): n for path, n in sizes.items() if n > limit}


def test_no_module_over_the_limit() -> None:
    assert oversized(KIMI) == {}


def test_no_lab_module_over_the_limit() -> None:
    assert oversized(LAB) == {}
