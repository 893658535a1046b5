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
from pathlib import Path

from kimi.fork.imports import module_file, named_modules


def build_time_hooks(package_root: Path) -> frozenset[str]:
    """:data:`kimi.hooks.BUILD_TIME` as ``kimi/hooks/__init__.py`` under ``package_root`` writes it: read, not
    imported (the hooks sit above the fork tooling, ``kimi/fork/layers.py``); empty where it names none."""
    tree = ast.parse((package_root / "kimi" / "hooks" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "BUILD_TIME" for t in node.targets):
            return frozenset(n.value for n in ast.walk(node.value)
                             if isinstance(n, ast.Constant) and isinstance(n.value, str))
    return frozenset()


def runtime_modules(package_root: Path) -> list[str]:
    """Dotted names of the runtime part of the ``kimi`` package under ``package_root`` (the folder that holds
    ``kimi/``), sorted; packages are included as their own names (``kimi``, ``kimi.hooks``, ...).

    Raises:
        ValueError: a runtime module names a ``kimi`` module that does not exist.
    """
    hooks = package_root / "kimi" / "hooks"
    build_time = build_time_hooks(package_root)
    todo = [f"kimi.hooks.{p.stem}" for p in sorted(hooks.glob("*.py"))
            if p.stem != "__init__" and p.stem not in build_time]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo.extend(".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1))
        path = module_file(package_root, module)
        if path is not None:  # None: a namespace package, nothing to read
            todo.extend(named_modules(package_root, path))
    return sorted(seen)


def runtime_files(package_root: Path) -> list[str]:
    """Paths relative to ``package_root`` of :func:`runtime_modules`' source files (``kimi/...``), sorted."""
    files = (module_file(package_root, m) for m in runtime_modules(package_root))
    return sorted(f.relative_to(package_root).as_posix() for f in files if f is not None)
