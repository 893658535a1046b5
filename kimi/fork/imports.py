"""The ``kimi`` modules a source file names, read from its syntax tree (nothing is imported).

A module names another in an ``import`` / ``from ... import`` statement anywhere in it (lazy imports inside
functions included), or as a dotted path in a string constant (vLLM resolves attention backends from such
strings: ``"kimi.cpu_mla.backend.CpuMLABackend"``).  :mod:`kimi.fork.runtime` follows these names from the
hooks; :mod:`kimi.fork.layers` draws the package's import graph from them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

_DOTTED = re.compile(r"^kimi(\.[A-Za-z_]\w*)+$")


def module_file(package_root: Path, module: str) -> Path | None:
    """``kimi/x/y.py`` or ``kimi/x/y/__init__.py`` for ``kimi.x.y`` (``package_root`` holds ``kimi/``)."""
    base = package_root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _exists(package_root: Path, module: str) -> bool:
    """A module, a package, or a namespace package (a folder without ``__init__.py``)."""
    return module_file(package_root, module) is not None or package_root.joinpath(*module.split(".")).is_dir()


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """``id`` of every node inside an ``if TYPE_CHECKING:`` body of ``tree`` (imports there never run)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            inside.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return inside


def named_modules(package_root: Path, path: Path, type_checking: bool = True) -> set[str]:
    """The ``kimi`` modules the source at ``path`` names: ``import kimi.x``; ``from kimi.x import y`` (``kimi.x.y``
    where that is a module, else ``kimi.x``); string constants that are dotted paths of a ``kimi`` module or of a
    name in one (``"kimi.x.Class"`` names ``kimi.x``). A module's parent packages are not counted: any import of
    it runs them. With ``type_checking`` False, what an ``if TYPE_CHECKING:`` block names is left out.

    Raises:
        ValueError: a named module does not exist (the message names ``path``).
    """
    needed: set[str] = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = set() if type_checking else _type_checking_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            needed.update(a.name for a in node.names if a.name.split(".")[0] == "kimi")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "kimi":
            names = {f"{node.module}.{a.name}" for a in node.names}
            submodules = {name for name in names if _exists(package_root, name)}
            needed.update(submodules if submodules == names else submodules | {node.module})
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _DOTTED.match(node.value):
            value = node.value
            needed.add(value if _exists(package_root, value) else value.rsplit(".", 1)[0])
    missing = sorted(name for name in needed if not _exists(package_root, name))
    if missing:
        raise ValueError(f"{path}: names {', '.join(missing)}, not a module of kimi")
    return needed
