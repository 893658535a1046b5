"""The layering of ``kimi`` (``kimi/fork/layers.py``), read from the code: no import loop, no import from a layer
up to a higher one, no hook importing another hook, every unit in a layer, nothing naming the lab (``lab/``, not
installed); and ``docs/architecture.md``'s generated table of it current (``kimi docs layers --check``).

The graph counts every import (lazy ones inside functions too) and dotted strings naming a module, as
``kimi install-into`` does, but not ``if TYPE_CHECKING:`` imports (they never run).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kimi.errors import KimiError
from kimi.fork import layer_docs
from kimi.fork.layers import (
    LAYERS,
    import_graph,
    lab_imports,
    lab_modules,
    layer_index,
    loops,
    unit,
    unit_graph,
    upward_arrows,
)
from kimi.fork.layout import Layout

ROOT = Path(__file__).resolve().parents[1]
GRAPH = import_graph(ROOT)


def test_every_unit_is_in_one_layer() -> None:
    units = [u for layer in LAYERS for u in layer.units]
    assert len(units) == len(set(units)), "a unit in two layers"
    assert not sorted({unit(m) for m in GRAPH} - set(units)), "units of kimi in no layer of kimi/fork/layers.py"


def test_no_import_loop_between_modules() -> None:
    assert loops(GRAPH) == []


def test_no_import_loop_between_units() -> None:
    assert loops(unit_graph(GRAPH)) == []


def test_no_import_runs_up_a_layer() -> None:
    assert upward_arrows(GRAPH) == []


def test_hooks_import_no_other_hook() -> None:
    hooks = [(source, target) for source, targets in GRAPH.items() for target in targets
             if source.startswith("kimi.hooks.") and target.startswith("kimi.hooks.")]
    assert hooks == []


def test_nothing_in_kimi_imports_the_lab() -> None:
    assert lab_modules(ROOT), "no lab found in lab/kimi_lab/"
    assert lab_imports(ROOT) == []


def test_the_lab_check_catches_an_import_and_a_dotted_name(tmp_path: Path) -> None:
    (tmp_path / "kimi" / "fork").mkdir(parents=True)
    (tmp_path / "kimi" / "__init__.py").write_text("")
    (tmp_path / "kimi" / "fork" / "__init__.py").write_text("")
    (tmp_path / "kimi" / "fork" / "a.py").write_text("def f():\n    from kimi_lab.bench import results\n")
    (tmp_path / "kimi" / "log.py").write_text("import kimi_lab.gpukit\nNAME = 'kimi_lab.bench.workers.program'\n")
    assert lab_imports(tmp_path) == [("kimi.fork.a", "kimi_lab.bench"), ("kimi.log", "kimi_lab.bench.workers.program"),
                                     ("kimi.log", "kimi_lab.gpukit")]


def test_the_checks_catch_a_loop_and_an_upward_arrow() -> None:
    graph = {"kimi.fork.a": {"kimi.fork.b"}, "kimi.fork.b": {"kimi.fork.a", "kimi.cli"}, "kimi.cli": set()}
    assert loops(graph) == [["kimi.fork.a", "kimi.fork.b"]]
    assert upward_arrows(graph) == [("kimi.fork.b", "kimi.cli")]
    with pytest.raises(KeyError, match="nowhere"):
        layer_index("kimi.nowhere.x")


def test_docs_layers_is_current() -> None:
    done = subprocess.run([sys.executable, "-m", "kimi", "docs", "layers", "--check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_docs_layers_check_catches_a_new_arrow(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "kimi", tmp_path / "kimi", ignore=shutil.ignore_patterns("__pycache__", "lines"))
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "architecture.md").write_text(f"# A\n\n{layer_docs.BEGIN}\n{layer_docs.END}\n\nafter\n")
    layout = Layout.of(tmp_path)
    layer_docs.write(layout)
    text = (tmp_path / "docs" / "architecture.md").read_text()
    assert text.startswith("# A\n\n") and text.endswith("\n\nafter\n") and "| floor | `kimi/fork/` |" in text
    assert layer_docs.check(layout)
    (tmp_path / "kimi" / "log.py").write_text("from kimi.cli import main\n")
    with pytest.raises(KimiError, match="not current .* `python3 -m kimi docs layers`"):
        layer_docs.check(layout)
    assert (tmp_path / "docs" / "architecture.md").read_text() == text  # check writes nothing
