"""The hook rules of ``kimi/hooks/__init__.py``, checked on every line's patch series and on the package.

The mainline's patches reach the fork's code through ``kimi.hooks.<module named after the patch>`` only, and
lazily; ``kimi install-into`` copies the runtime part of ``kimi`` (the hooks and what they import) and no
build, training or fork tooling.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kimi.fork.patches import load_series
from kimi.fork.runtime import runtime_files, runtime_modules
from kimi.hooks import BUILD_TIME

ROOT = Path(__file__).resolve().parents[1]
LINES = ROOT / "kimi" / "lines"
HOOKS = ROOT / "kimi" / "hooks"
MAINLINE = load_series(LINES / "mainline" / "patches")


def _added_lines(diff: str) -> list[tuple[str, str]]:
    """(file, text) of each ``+`` line of a diff."""
    out, path = [], ""
    for line in diff.splitlines():
        if line.startswith("+++ "):
            path = line[6:] if line.startswith("+++ b/") else line[4:]
        elif line.startswith("+"):
            out.append((path, line[1:]))
    return out


def _hook_module(patch_name: str) -> str:
    return "kimi.hooks." + patch_name.split("-", 1)[1].replace("-", "_")


@pytest.mark.parametrize("patch", MAINLINE, ids=lambda p: p.name)
def test_mainline_patches_name_only_their_own_hook(patch) -> None:
    own = _hook_module(patch.name)
    for path, text in _added_lines(patch.diff):
        for name in re.findall(r"\bkimi(?:\.\w+)+", text):
            assert name == own or name.startswith(own + "."), f"{patch.name}: {path}: {text.strip()!r} names {name}"
            module = HOOKS / f"{own.rsplit('.', 1)[1]}.py"
            assert module.is_file(), f"{patch.name} calls {own}, but {module} does not exist"


@pytest.mark.parametrize("patch", MAINLINE, ids=lambda p: p.name)
def test_mainline_patches_import_kimi_lazily(patch) -> None:
    for path, text in _added_lines(patch.diff):
        if re.match(r"\s*(from|import) kimi\b", text) and path != "setup.py":
            assert text[:1].isspace(), f"{patch.name}: {path}: a top-level import of kimi: {text!r}"


def test_every_hook_is_called_by_a_patch() -> None:
    called = {name for line in LINES.iterdir() for patch in load_series(line / "patches")
              for _, text in _added_lines(patch.diff) for name in re.findall(r"\bkimi\.hooks\.(\w+)", text)}
    modules = {p.stem for p in HOOKS.glob("*.py") if p.stem != "__init__"}
    assert not modules - called, "hook modules no patch calls"
    assert modules >= BUILD_TIME


def test_runtime_part_is_hooks_and_what_they_import() -> None:
    modules = runtime_modules(ROOT)
    assert "kimi.hooks.eagle3_drafter_checks" in modules and "kimi.drafter.inspect" in modules
    assert "kimi.cpu_mla.backend" in modules  # named by a string: vLLM loads the backend by its path
    assert not [m for m in modules if m.split(".")[1:2] in (["cli"], ["train"], ["bench"], ["models"])]
    assert "kimi.fork.rebase" not in modules and "kimi.hooks.precompiled_fork_build" not in modules
    assert "kimi.fork.precompiled" not in modules  # the build hook's logic is build time too
    assert "kimi.cpu_mla.selection" in modules
    assert all((ROOT / f).is_file() for f in runtime_files(ROOT))


def test_runtime_part_names_a_missing_module(tmp_path: Path) -> None:
    (tmp_path / "kimi" / "hooks").mkdir(parents=True)
    (tmp_path / "kimi" / "__init__.py").write_text("")
    (tmp_path / "kimi" / "hooks" / "__init__.py").write_text("BUILD_TIME = frozenset()\n")
    (tmp_path / "kimi" / "hooks" / "some_patch.py").write_text("def f():\n    from kimi.gone import x\n")
    with pytest.raises(ValueError, match="kimi.gone"):
        runtime_modules(tmp_path)
