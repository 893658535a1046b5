"""Which of upstream's tests cover the files the patch series changes.

A test file is chosen when it names a module the series changes: it imports it (``import vllm.a.b``,
``from vllm.a.b import x``, ``from vllm.a import b``, also inside functions) or names it in a string
(``mock.patch("vllm.a.b.X")``).  Only ``vllm/`` Python files count: build-time files have no tests upstream.
"""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

from kimi.fork.patches import Patch


def module_of(path: str) -> str | None:
    """The dotted module of a ``vllm/`` Python file (``vllm/a/__init__.py`` -> ``vllm.a``); None for others."""
    if not (path.startswith("vllm/") and path.endswith(".py")):
        return None
    parts = path[:-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def touched_modules(series: list[Patch]) -> dict[str, list[str]]:
    """Each ``vllm/`` module the series changes -> the patches that change it (series order)."""
    touched: dict[str, list[str]] = {}
    for patch in series:
        for path in patch.files():
            module = module_of(path)
            if module is not None:
                touched.setdefault(module, []).append(patch.name)
    return touched


def named_modules(source: str) -> set[str]:
    """The modules a test file's text imports or names in a string (every dotted prefix of a string counts);
    empty for a file Python cannot parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("vllm."):
            parts = node.value.split(".")
            names.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))
    return names


def select_tests(root: Path, touched: dict[str, list[str]], only: list[str] | None = None) -> dict[str, list[str]]:
    """The upstream test files under ``root/tests`` (``test_*.py``) that name a ``touched`` module -> the modules
    they name, sorted by path.  ``only``: keep the files matching one of these globs or path prefixes."""
    chosen = {}
    for path in sorted((root / "tests").rglob("test_*.py")):
        rel = path.relative_to(root).as_posix()
        if only and not any(fnmatch.fnmatch(rel, pattern) or rel.startswith(pattern) for pattern in only):
            continue
        hits = sorted(named_modules(path.read_text(errors="replace")) & touched.keys())
        if hits:
            chosen[rel] = hits
    return chosen
