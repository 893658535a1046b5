"""``kimi.fork.revert.reverted``: patches' hunks out of the laid tree inside the block, every file back after it."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import patch_text
from kimi.errors import KimiError
from kimi.fork.patches import Patch
from kimi.fork.revert import reverted

FIRST = ("diff --git a/vllm/spec.py b/vllm/spec.py\n--- a/vllm/spec.py\n+++ b/vllm/spec.py\n@@ -1,3 +1,3 @@\n a\n"
         "-b\n+b patched\n c\n")
SECOND = ("diff --git a/vllm/spec.py b/vllm/spec.py\n--- a/vllm/spec.py\n+++ b/vllm/spec.py\n@@ -3,2 +3,2 @@\n c\n"
          "-d\n+d patched\n")
NEW_FILE = ("diff --git a/vllm/new.py b/vllm/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/vllm/new.py\n"
            "@@ -0,0 +1 @@\n+x = 1\n")


def _patch(name: str, text: str) -> Patch:
    return Patch(path=Path(f"{name}.patch"), header={}, diff=text[text.index("diff --git"):])


def test_series_reverted_then_restored_even_on_error(tmp_path: Path) -> None:
    """Two patches of one file (undone last first), one that creates a file, one of setup.py (left alone)."""
    spec = tmp_path / "vllm" / "spec.py"
    spec.parent.mkdir()
    spec.write_text("a\nb patched\nc\nd patched\n")
    (tmp_path / "vllm" / "new.py").write_text("x = 1\n")
    (tmp_path / "setup.py").write_text("fork\n")
    series = [_patch("0001", FIRST), _patch("0002", SECOND), _patch("0003", NEW_FILE),
              _patch("0004", patch_text("0004", "setup.py", "upstream", "fork", 1, []))]
    before = {p: p.read_bytes() for p in (spec, tmp_path / "vllm" / "new.py", tmp_path / "setup.py")}
    with pytest.raises(RuntimeError), reverted(tmp_path, series) as changed:
        assert changed == ["vllm/new.py", "vllm/spec.py"]
        assert spec.read_text() == "a\nb\nc\nd\n" and not (tmp_path / "vllm" / "new.py").exists()
        assert (tmp_path / "setup.py").read_text() == "fork\n"
        with pytest.raises(KimiError, match="another kimi command"), reverted(tmp_path, []):
            pass  # the checkout's lock is held while the tree is pristine
        raise RuntimeError("a test run failed")
    assert {p: p.read_bytes() for p in before} == before
