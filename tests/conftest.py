"""Shared fixtures: a throw-away fork checkout with a small synthetic upstream release.

``fork`` is a git repository holding a copy of this checkout's ``kimi``
package, ``.gitignore`` and ``README.md``, with a line ``mainline`` pinned to
a synthetic ``vllm-9.9.0.tar.gz`` kept in a ``--from`` folder.  Its commands
run as ``python -m kimi`` in a subprocess, as a user would run them.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from kimi.fork.checkout import commit_all
from kimi.fork.layout import DEFAULT_LINE, Layout
from kimi.fork.pin import load_pin

ROOT = Path(__file__).resolve().parents[1]
#: The pin of the line this checkout is for: the mainline's, but in a line's own checkout ``.kimi/envs/<line>/``
#: (``kimi test --line <line>``), whose ``kimi/`` is the mainline's copy and whose laid tree is the line's.
_LAYOUT = Layout.of(ROOT)
OWN_PIN = _LAYOUT.line_dir(_LAYOUT.own_line) / "pin.json"


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` imported as a module (its functions called in-process)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_bench", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


VERSION = "9.9.0"

# A miniature upstream release in the layout of vLLM's sdist.
UPSTREAM_FILES = {
    "vllm/__init__.py": "from vllm.version import __version__\n",
    "vllm/version.py": "__version__ = 'dev'\n",
    "vllm/_version.py": "__version__ = '9.9.0'\n",          # generated: upstream's .gitignore lists it
    "vllm/config/speculative.py": "".join(f"line {i}\n" for i in range(1, 41)),
    "vllm/entrypoints/cli/main.py": "def main():\n    return 0\n",
    "csrc/kernel.cu": "// kernel\n",
    "CMakeLists.txt": "project(vllm)\n",
    "setup.py": "print('setup')\n",
    "pyproject.toml": "[project]\nname = 'vllm'\n",
    "requirements/common.txt": "numpy\n",
    # a source file that an ignore rule of upstream's matches (0.34.0: mxfp4/rdna3_hip.py and `*_hip*`)
    "vllm/kernels/rdna3_hip.py": "pass\n",
    ".gitignore": "/vllm/_version.py\n*.so\n__pycache__/\nbuild/\n*_hip*\n",
    "README.md": "upstream readme\n",
    "tests/test_upstream.py": "def test_x():\n    pass\n",
    "docs/index.md": "docs\n",
    "benchmarks/bench.py": "pass\n",
    "examples/e.py": "pass\n",
    "PKG-INFO": "Name: vllm\n",
}


def make_sdist(dest: Path, version: str = VERSION, files: dict[str, str] | None = None) -> tuple[Path, str]:
    """Write ``vllm-<version>.tar.gz`` with ``files`` under ``vllm-<version>/``; returns (path, sha256)."""
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"vllm-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in sorted((files or UPSTREAM_FILES).items()):
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{version}/{rel}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def patch_text(name: str, path: str, old_line: str, new_line: str, start: int, context: list[str]) -> str:
    """A one-line-change patch file (header + git diff) replacing ``old_line`` at line ``start``."""
    before, after = context[:3], context[3:]
    body = [f" {c}" for c in before] + [f"-{old_line}", f"+{new_line}"] + [f" {c}" for c in after]
    n = len(before) + 1 + len(after)
    hunk_start = start - len(before)
    return (
        f"Subject: {name}\nWhat: changes {path}\nWhy: a test\nUpstream: fork-only\nForwarded: no\nTests: tests/\n\n"
        f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n"
        f"@@ -{hunk_start},{n} +{hunk_start},{n} @@\n" + "\n".join(body) + "\n"
    )


def speculative_patch(number: int, line_no: int, new: str, slug: str | None = None) -> tuple[str, str]:
    """(file name, text) of a patch changing ``line N`` of vllm/config/speculative.py."""
    context = [f"line {i}" for i in (line_no - 3, line_no - 2, line_no - 1, line_no + 1, line_no + 2, line_no + 3)]
    name = f"{number:04d}-{slug or f'change-line-{line_no}'}"
    return f"{name}.patch", patch_text(name, "vllm/config/speculative.py", f"line {line_no}", new, line_no, context)


@dataclass
class Fork:
    """A throw-away fork checkout (see module docstring)."""

    root: Path
    from_dir: Path
    cache: Path

    @property
    def pin_path(self) -> Path:
        return self.root / "kimi" / "lines" / "mainline" / "pin.json"

    @property
    def patches(self) -> Path:
        return self.root / "kimi" / "lines" / "mainline" / "patches"

    def kimi(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``python -m kimi ARGS`` in the checkout (unreachable index unless ``env`` says otherwise)."""
        full_env = {**os.environ, "KIMI_CACHE_DIR": str(self.cache), "KIMI_INDEX_URL": "http://127.0.0.1:9/simple",
                    "PYTHONPATH": str(self.root), **(env or {})}
        return subprocess.run([sys.executable, "-m", "kimi", *args], cwd=self.root, env=full_env,
                              capture_output=True, text=True, timeout=300)

    def sync(self, *args: str, **kw) -> subprocess.CompletedProcess[str]:
        return self.kimi("sync", "--from", str(self.from_dir), *args, **kw)

    def write_pin(self, sha256: str, version: str = VERSION) -> None:
        pin = {"line": "mainline", "version": version, "fork_release": 1, "torch": "2.11.0",
               "artifacts": {"sdist": {"project": "vllm", "file": f"vllm-{version}.tar.gz", "sha256": sha256}}}
        self.pin_path.write_text(json.dumps(pin, indent=2))

    def add_patch(self, filename: str, text: str) -> Path:
        path = self.patches / filename
        path.write_text(text)
        return path

    def git(self, *args: str) -> str:
        return subprocess.run(["git", "-C", str(self.root), *args], capture_output=True, text=True,
                              check=True).stdout

    def commit(self, message: str = "change") -> None:
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)


def installed_line() -> str | None:
    """The line whose fork version the installed vllm distribution carries (``0.16.0+kimi.1.cpu`` ->
    ``origin``); None without an installed vllm (the laid tree alone is importable but not installed)
    or for a vllm that is no line's."""
    import importlib.metadata

    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None
    for pin_path in sorted((ROOT / "kimi" / "lines").glob("*/pin.json")):
        pin = load_pin(pin_path)
        if version.startswith(f"{pin.fork_version}."):
            return pin.line
    return None


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _skip_reason(line: str, installed: str | None) -> str:
    if installed is None:
        return f"the {line} line's vLLM is not installed here: run `python3 -m kimi test --line {line}`"
    return (f"for the {line} line; the vLLM installed here is the {installed} line's "
            f"(`python3 -m kimi test --line {line}`)")


def _suite_line(installed: str | None, required: str | None) -> str:
    """The line an install test without a ``line`` marker belongs to: the line being tested or installed when it
    has no test folder of its own (``tests/<line>/``, as the origin line has) - the v0.26 line runs the mainline's
    suite - else the default line."""
    for line in (required, installed):
        if line and not (ROOT / "tests" / line).is_dir():
            return line
    return DEFAULT_LINE


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip GPU tests without CUDA, ``build`` tests unless KIMI_TEST_BUILD=1, and install tests of a
    line whose vLLM is not the one installed.

    An ``install`` test belongs to the lines named by its ``line(NAME, ...)`` marker, else to the default
    line.  Under `kimi test --line NAME` (KIMI_TEST_INSTALLED=1, KIMI_TEST_LINE=NAME) a missing or
    other install of that line's tests is a failure, not a skip.  Files marked ``long_file`` go first.
    """
    required = os.environ.get("KIMI_TEST_LINE", DEFAULT_LINE) if os.environ.get("KIMI_TEST_INSTALLED") == "1" \
        else None
    no_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    no_build = pytest.mark.skip(reason="runs vLLM's CMake configure/compile (minutes, GBs of memory): "
                                       "set KIMI_TEST_BUILD=1")
    build_ok = os.environ.get("KIMI_TEST_BUILD") == "1"
    installed = installed_line()
    gpu_ok = any("gpu" in item.keywords for item in items) and _cuda_available()
    for item in items:
        marker = item.get_closest_marker("line")
        lines = marker.args if marker else (_suite_line(installed, required),)
        if ("install" in item.keywords or marker) and installed not in lines and required not in lines:
            item.add_marker(pytest.mark.skip(reason=_skip_reason(lines[0], installed)))
        if "gpu" in item.keywords and not gpu_ok:
            item.add_marker(no_gpu)
        if "build" in item.keywords and not build_ok:
            item.add_marker(no_build)
    long_files_first(items)


def long_files_first(items: list[pytest.Item]) -> None:
    """Put the items of files marked ``long_file`` first, each file's order kept (a stable sort): pytest-xdist's
    ``--dist loadfile`` hands files to its workers in this order, so a file of minutes taken up last would run on
    one worker while the others stand idle."""
    items.sort(key=lambda item: item.get_closest_marker("long_file") is None)


@pytest.fixture
def fork(tmp_path: Path) -> Fork:
    """A fork checkout whose mainline pins the synthetic release, with an empty series."""
    root = tmp_path / "fork"
    shutil.copytree(ROOT / "kimi", root / "kimi", ignore=shutil.ignore_patterns("__pycache__", "lines"))
    shutil.copy2(ROOT / ".gitignore", root / ".gitignore")
    (root / "README.md").write_text("our readme\n")
    (root / "kimi" / "lines" / "mainline" / "patches").mkdir(parents=True)
    from_dir = tmp_path / "from"
    _, sha = make_sdist(from_dir)
    result = Fork(root=root, from_dir=from_dir, cache=tmp_path / "cache")
    result.write_pin(sha)
    commit_all(root)
    for key, value in (("user.name", "test"), ("user.email", "test@localhost"), ("commit.gpgsign", "false")):
        subprocess.run(["git", "-C", str(root), "config", key, value], check=True)
    return result


@pytest.fixture(scope="session")
def trained_pair() -> Path:
    """The shipped reference pair (``ROOT/models/pair``), checked against its MANIFEST's sha256s: the folder
    ``kimi demo`` serves and the tests of the pair read. Nothing is trained."""
    from kimi.models import SHIPPED_PAIR
    from kimi.models.shipped import check_pair

    check_pair(SHIPPED_PAIR)
    return SHIPPED_PAIR
