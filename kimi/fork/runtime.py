"""The runtime part of ``kimi``: what a patched vLLM imports while it serves.

The mainline's patches import ``kimi.hooks.<module>`` only (``kimi/hooks/__init__.py``).  The runtime part
is every hook module that runs inside vLLM (not :data:`kimi.hooks.BUILD_TIME`) and, transitively, every
``kimi`` module they name: in an ``import`` / ``from ... import`` statement anywhere in the module (the
hooks import lazily, inside functions), or as a dotted path in a string constant (vLLM resolves attention
backends from such strings: ``"kimi.cpu_mla.backend.CpuMLABackend"``).  Each module's parent packages
come with it (their ``__init__.py`` runs on import).  ``kimi install-into`` copies this set and no more.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

_DOTTED = re.compile(r"^kimi(\.[A-Za-z_]\w*)+$")


def _module_file(package_root: Path, module: str) -> Path | None:
    """``kimi/x/y.py`` or ``kimi/x/y/__init__.py`` for ``kimi.x.y`` (``package_root`` holds ``kimi/``)."""
    base = package_root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _exists(package_root: Path, module: str) -> bool:
    """A module, a package, or a namespace package (a folder without ``__init__.py``)."""
    return _module_file(package_root, module) is not None or package_root.joinpath(*module.split(".")).is_dir()


def _named_modules(package_root: Path, path: Path) -> set[str]:
    """The ``kimi`` modules the source at ``path`` names: ``import kimi.x``; ``from kimi.x import y`` (``kimi.x``,
    and ``kimi.x.y`` where that is a module); string constants that are dotted paths of a ``kimi`` module or
    of a name in one (``"kimi.x.Class"`` names ``kimi.x``).

    Raises:
        ValueError: a named module does not exist (the message names ``path``).
    """
    needed: set[str] = set()
    optional: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            needed.update(a.name for a in node.names if a.name.split(".")[0] == "kimi")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "kimi":
            needed.add(node.module)
            optional.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _DOTTED.match(node.value):
            value = node.value
            needed.add(value if _exists(package_root, value) else value.rsplit(".", 1)[0])
    missing = sorted(name for name in needed if not _exists(package_root, name))
    if missing:
        raise ValueError(f"{path}: names {', '.join(missing)}, not a module of kimi")
    return needed | {name for name in optional if _exists(package_root, name)}


def runtime_modules(package_root: Path) -> list[str]:
    """Dotted names of the runtime part of the ``kimi`` package under ``package_root`` (the folder that holds
    ``kimi/``), sorted; packages are included as their own names (``kimi``, ``kimi.hooks``, ...).

    Raises:
        ValueError: a runtime module names a ``kimi`` module that does not exist.
    """
    from kimi.hooks import BUILD_TIME

    hooks = package_root / "kimi" / "hooks"
    todo = ["kimi.hooks"] + [f"kimi.hooks.{p.stem}" for p in sorted(hooks.glob("*.py"))
                             if p.stem != "__init__" and p.stem not in BUILD_TIME]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo.extend(".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1))
        path = _module_file(package_root, module)
        if path is not None:  # None: a namespace package, nothing to read
            todo.extend(_named_modules(package_root, path))
    return sorted(seen)


def runtime_files(package_root: Path) -> list[str]:
    """Paths relative to ``package_root`` of :func:`runtime_modules`' source files (``kimi/...``), sorted."""
    files = (_module_file(package_root, m) for m in runtime_modules(package_root))
    return sorted(f.relative_to(package_root).as_posix() for f in files if f is not None)
