"""No module of ``kimi/`` over :data:`MAX_LINES` lines: one that grows past it does more than one job and is split
along them (``kimi/kernels/vllm_build.py`` became toolchain, CMake tree, plan and run)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KIMI = ROOT / "kimi"
MAX_LINES = 600
#: The lab's two largest modules, which leave the installed package with the rest of the lab.
LEAVING = (KIMI / "gpukit.py", KIMI / "drafter" / "assumptions.py")


def oversized(package: Path, limit: int = MAX_LINES) -> dict[str, int]:
    """``{path: lines}`` of the Python files under ``package`` longer than ``limit`` lines."""
    sizes = {path: len(path.read_text().splitlines()) for path in sorted(package.rglob("*.py"))}
    return {str(path.relative_to(ROOT)): n for path, n in sizes.items() if n > limit and path not in LEAVING}


def test_no_module_over_the_limit() -> None:
    assert oversized(KIMI) == {}
