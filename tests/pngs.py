"""Test helpers for the PNG charts: a strict PNG check and "matplotlib must be here" in the fork's venv."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import pytest

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def require_matplotlib() -> None:
    """Skip without matplotlib, except under ``kimi test`` (``KIMI_TEST_INSTALLED=1``), whose venv must have it."""
    if os.environ.get("KIMI_TEST_INSTALLED") == "1":
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            pytest.fail("matplotlib is missing from the fork's venv: `kimi setup` installs it (kimi.devenv.TOOLS)")
    else:
        pytest.importorskip("matplotlib")


def assert_png(path: Path, min_size: tuple[int, int] = (1, 1)) -> tuple[int, int]:
    """Assert that ``path`` is a whole PNG: signature, IHDR first, every chunk's CRC, IDAT that inflates, IEND
    last, and at least ``min_size`` (width, height) pixels. Returns (width, height)."""
    data = path.read_bytes()
    assert data[:8] == SIGNATURE, f"{path}: not a PNG signature"
    pos, names, idat = 8, [], b""
    while pos < len(data):
        assert pos + 12 <= len(data), f"{path}: truncated at byte {pos}"
        length, name = struct.unpack(">I4s", data[pos:pos + 8])
        assert pos + 12 + length <= len(data), f"{path}: chunk {name!r} truncated"
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(name + body) == crc, f"{path}: bad CRC in chunk {name!r}"
        names.append(name)
        if name == b"IDAT":
            idat += body
        pos += 12 + length
    assert names[0] == b"IHDR" and names[-1] == b"IEND" and b"IDAT" in names, f"{path}: chunks {names}"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= min_size[0] and height >= min_size[1], f"{path}: {width}x{height}"
    assert len(zlib.decompress(idat)) > 0
    return width, height
