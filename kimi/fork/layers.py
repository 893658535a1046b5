"""The layers of the ``kimi`` package and its import graph, read from the code (nothing is imported).

A unit is a top-level module or package of ``kimi``, named by its path in ``kimi/`` (``fork`` for ``kimi.fork``,
``devenv`` for ``kimi.devenv``, ``__init__`` for the package itself). :data:`LAYERS` puts every unit in one layer,
lowest first: a module may import from its own layer and the ones below, never from one above, and no import runs
in a loop (between modules, or between units). ``tests/test_layering.py`` holds the package to it;
``kimi docs layers`` writes the table into ``docs/architecture.md``.

The measurement lab is no layer of ``kimi``: it is the package :data:`LAB` in the folder :data:`LAB_DIR` beside
``kimi/``, which ``pyproject.toml`` does not install. It imports ``kimi``; nothing in ``kimi`` names it
(:func:`lab_imports`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from kimi.fork.imports import named_modules


@dataclass(frozen=True)
class Layer:
    """One layer: its name, what it holds, and its units."""

    name: str
    what: str
    units: tuple[str, ...]


#: The layers, lowest first.
LAYERS = (
    Layer("floor", "what everything shares: errors, logging, the fork's paths, pins, files and tooling",
          ("errors", "log", "fork")),
    Layer("features", "what a patched vLLM runs, a package per feature",
          ("cpu_mla", "cpu_platform", "cpu_quantization", "spec", "drafter", "kernels", "origin")),
    Layer("tools", "reference models, engine runs, training", ("models", "e2e", "train")),
    Layer("commands", "the kimi command and the environments it makes",
          ("devenv", "demo", "cli", "__main__", "__init__")),
    Layer("hooks", "where vLLM calls in (its patched modules, setup.py, the kimi script): each hook adapts the "
                   "call to a feature; nothing imports a hook", ("hooks",)),
)


#: The lab's package and the folder (beside ``kimi/``) that holds it and nothing else importable.
LAB = "kimi_lab"
LAB_DIR = "lab"

_LAB_DOTTED = re.compile(rf"^{LAB}(\.[A-Za-z_]\w*)+$")


def unit(module: str) -> str:
    """The unit of ``module``: ``x`` for ``kimi.x.y.z``, ``__init__`` for ``kimi``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_index(module: str) -> int:
    """The position in :data:`LAYERS` of ``module``'s unit.

    Raises:
        KeyError: the unit is in no layer.
    """
    found = [i for i, layer in enumerate(LAYERS) if unit(module) in layer.units]
    if not found:
        raise KeyError(f"{unit(module)} is in no layer of kimi.fork.layers.LAYERS")
    return found[0]


def modules(package_root: Path) -> dict[str, Path]:
    """Dotted name to source file of every module of ``kimi`` under ``package_root`` (the folder holding
    ``kimi/``); a package is named by its ``__init__.py``. The lines' folders (patches, pins) hold no module."""
    out = {}
    for path in sorted((package_root / "kimi").rglob("*.py")):
        parts = path.relative_to(package_root).with_suffix("").parts
        if parts[:2] == ("kimi", "lines"):
            continue
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def lab_modules(package_root: Path) -> dict[str, Path]:
    """Dotted name to source file of every module of the lab (:data:`LAB` under ``package_root / LAB_DIR``)."""
    base = package_root / LAB_DIR
    out = {}
    for path in sorted((base / LAB).rglob("*.py")):
        parts = path.relative_to(base).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def lab_imports(package_root: Path) -> list[tuple[str, str]]:
    """``(module, name)`` for every place a module of ``kimi`` names the lab, sorted: ``import kimi_lab...``,
    ``from kimi_lab... import``, or a string that is a dotted path into it. ``if TYPE_CHECKING:`` imports count too:
    the installed package has no lab to find."""
    found = set()
    for name, path in modules(package_root).items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found.update((name, a.name) for a in node.names if a.name.split(".")[0] == LAB)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == LAB:
                found.add((name, node.module))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _LAB_DOTTED.match(node.value):
                found.add((name, node.value))
    return sorted(found)


def import_graph(package_root: Path) -> dict[str, set[str]]:
    """Each module of ``kimi`` to the other ``kimi`` modules it names (:func:`kimi.fork.imports.named_modules`),
    its own parent packages and its ``if TYPE_CHECKING:`` imports left out (they run on any import of it, and
    never, respectively)."""
    files = modules(package_root)
    graph = {}
    for name, path in files.items():
        named = set()
        for other in named_modules(package_root, path, type_checking=False):
            while other not in files and "." in other:  # a namespace package: its nearest module-holding parent
                other = other.rsplit(".", 1)[0]
            named.add(other)
        graph[name] = {other for other in named if other != name and not name.startswith(other + ".")}
    return graph


def unit_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` between units: an arrow where a module of one names a module of another."""
    out: dict[str, set[str]] = {}
    for source, targets in graph.items():
        out.setdefault(unit(source), set()).update(unit(t) for t in targets if unit(t) != unit(source))
    return out


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of ``graph`` with more than one node (each sorted), sorted: every import
    loop is inside one (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph.get(succ, ())))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    part = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        part.append(member)
                        if member == node:
                            break
                    if len(part) > 1:
                        found.append(sorted(part))
    return sorted(found)


def upward_arrows(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports of ``graph`` from a module to one of a higher layer, sorted.

    Raises:
        KeyError: a module's unit is in no layer.
    """
    return sorted((source, target) for source, targets in graph.items() for target in targets
                  if layer_index(target) > layer_index(source))
