"""``kimi setup`` and ``kimi test``: a working environment from a fresh clone.

``setup``: ``kimi sync``; a virtual environment (``.venv``); the pinned torch
and vLLM's build requirements; ``pip install --no-build-isolation -e .`` with
kernels borrowed from the pinned wheel, or none (``torch`` kernels: see
``kimi/fork/precompiled.py``), and the
fork's tools (:data:`TOOLS`: matplotlib, for the PNG charts); a smoke run of
``vllm``.  pip's downloads are cached under ``.kimi/cache/pip`` and its output
goes to ``.kimi/logs/`` (the tail is shown on failure).  An install is skipped
when the venv already holds this exact synced tree (a venv installed before
the tools were added gets just the tools).

``test``: ``setup`` without the smoke run, pytest into the venv, then pytest
on ``tests/``; pytest's "no tests collected" (exit 5) is a failure.

Lines other than the default one (``--line origin``) get an environment of
their own, so that both can be installed at once: a checkout of the fork's
own files at ``.kimi/envs/<line>/`` (copied from the working tree on every
call; the laid tree, ``.kimi/`` and the venv there are kept), where that line
is laid and installed into ``.kimi/envs/<line>/.venv`` (or ``--venv``);
downloads come from this checkout's cache.  ``kimi test --line L`` runs
pytest on ``tests/L/`` there.  The root keeps the default line.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import venv as venvlib
from pathlib import Path

from kimi.errors import KimiError
from kimi.fork.fsutil import write_atomic
from kimi.fork.kernels_mode import kernels_mode
from kimi.fork.layout import DEFAULT_LINE, Layout
from kimi.fork.pin import line_pin
from kimi.fork.state import SyncState
from kimi.fork.sync import sync
from kimi.log import say

PYTEST_NO_TESTS = 5

#: What tests import beyond the venv, installed by ``kimi test`` without dependencies (a plain install would
#: replace the venv's CPU torch with a CUDA one, docs/drafters.md): the ``speculators`` library and what it imports
#: that the venv lacks (tests/test_drafter_other_tools.py), and accelerate.
TEST_NO_DEPS = ("speculators==0.9.0", "hs-connectors==0.9.0", "datasets==5.1.0", "fsspec==2026.7.0",
                "multiprocess==0.70.19", "pandas==3.1.1", "pyarrow==26.0.1", "xxhash==4.1.0",
                # transformers loads an FP8 checkpoint only with accelerate (tests/test_quantize.py)
                "accelerate==1.15.0")

#: What the fork's own tools need beyond vLLM's requirements, installed into every venv ``kimi setup`` makes:
#: matplotlib draws the PNG charts of ``kimi train report`` and ``benchmarks/acceptance.py``.
TOOLS = ("matplotlib",)
#: What ``torch`` kernels (no compiled vLLM code) install beside the pin's torch: the package index's triton, whose
#: interpreter runs the kernels the torch-only CPU platform leaves to Triton (``kimi.cpu_platform``).
TORCH_MODE_EXTRAS = ("triton",)
_REPORT_VERSION = "import vllm, vllm.platforms as p; print(vllm.__version__, p.current_platform.device_type or 'none')"


def _step(msg: str) -> float:
    """Say ``msg`` (``kimi: ...``) and return the time, for the step's duration."""
    say(msg)
    return time.monotonic()


def _run_logged(cmd: list[str], log: Path, env: dict[str, str], cwd: Path) -> None:
    """Run ``cmd`` with its output in ``log``; on failure raise with the log's tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise KimiError(f"`{' '.join(cmd[:6])} ...` failed (exit {proc.returncode}); log: {log}\n{tail}")


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _own_entries(root: Path) -> list[str]:
    """Top-level names of the fork's own files: what git tracks or would track at ``root``."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, text=True, check=True).stdout
    return sorted({rel.split("/", 1)[0] for rel in listed.split("\0") if rel and (root / rel).exists()})


def line_layout(layout: Layout, line: str) -> Layout:
    """Where ``line`` is laid and installed: the root for the line it is for (:attr:`Layout.own_line`: the
    mainline, or the line whose own checkout it is), else ``.kimi/envs/<line>/``.

    A line's own checkout gets a fresh copy of the fork's own files (``kimi/``,
    ``tests/``, ...) from the working tree each time; its laid tree, its
    ``.kimi/`` and its venv stay.  It shares this checkout's download cache.

    Raises:
        KimiError: ``line`` has no pin (the message lists the known lines).
    """
    layout.line_dir(line)
    if line == layout.own_line:
        return layout
    dest = layout.line_env(line)
    dest.mkdir(parents=True, exist_ok=True)
    for name in _own_entries(layout.root):
        source, target = layout.root / name, dest / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, target)
    # sync tells the fork's files from upstream's by what git tracks there
    git = ["git", "-C", str(dest), "-c", "user.name=kimi", "-c", "user.email=kimi@localhost",
           "-c", "commit.gpgsign=false"]
    if not (dest / ".git").is_dir():
        subprocess.run(["git", "init", "-q", "-b", "main", str(dest)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "fork files"], check=True)
    return Layout(root=dest, cache=layout.cache)


def _build_requirements(layout: Layout, mode: str) -> Path:
    """vLLM's build requirements for ``mode``: ``requirements/build/<mode>.txt`` (0.2x), else
    ``requirements/<mode>-build.txt`` / ``requirements/build.txt`` (0.16 - 0.18). ``torch`` mode takes the
    CPU list without its torch lines (a copy in ``.kimi/``): the pin's torch is installed beside it.

    Raises:
        KimiError: none of them is in the laid tree.
    """
    kind = "cpu" if mode == "torch" else mode
    names = [f"build/{kind}.txt", f"{kind}-build.txt"] + (["build.txt"] if kind == "cuda" else [])
    found = next((layout.root / "requirements" / n for n in names if (layout.root / "requirements" / n).is_file()),
                 None)
    if found is None:
        raise KimiError(f"no build requirements for {kind} in {layout.root / 'requirements'} "
                        f"(looked for {', '.join(names)})")
    return found if mode != "torch" else _without_torch(found, layout.private / "build-requirements-torch.txt")


def _torch_mode_requirements(layout: Layout) -> Path | None:
    """What a ``torch`` install serves with beyond ``common.txt`` (which ``VLLM_TARGET_DEVICE=empty`` alone reads):
    the CPU target's runtime list, ``requirements/cpu.txt``, without its torch lines and its ``-r`` includes (a copy
    in ``.kimi/``). It brings numba, which vLLM's N-gram drafter and the Kimi-K2.5 image processor without
    torchvision (``KimiK25FusedVisionProcessor``) need. None where the laid tree has no such file."""
    found = layout.root / "requirements" / "cpu.txt"
    return _without_torch(found, layout.private / "runtime-requirements-torch.txt") if found.is_file() else None


def _requirement_lines(path: Path | None) -> list[str]:
    """The requirement lines of ``path`` (none without comments and blank lines)."""
    lines = path.read_text().splitlines() if path else []
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def _without_torch(found: Path, copy: Path) -> Path:
    """``found`` written to ``copy`` without its torch lines (the pin's torch is installed instead) and without
    ``-r`` includes, which name files beside ``found``."""
    kept = [line for line in found.read_text().splitlines() if not re.match(r"\s*(torch\b|-r\s)", line)]
    write_atomic(copy, "\n".join(kept) + "\n")
    return copy


def _install_key(layout: Layout, mode: str) -> str:
    """Identifies an install: the synced state (release, series, line), the kernels mode, the checkout
    (an editable install points at one; a venv given with --venv may have served another) and, in ``torch``
    mode, what is installed beside vLLM's own requirements."""
    state = SyncState.laid(layout.state_file)
    extras = [*TORCH_MODE_EXTRAS, *_requirement_lines(_torch_mode_requirements(layout))] if mode == "torch" else []
    ident = json.dumps([state.sdist_sha256, state.series, state.line, mode, str(layout.root.resolve()),
                        *([extras] if extras else [])], sort_keys=True)
    return hashlib.sha256(ident.encode()).hexdigest()


def line_kernels(layout: Layout, line: str, kernels: str = "auto") -> str:
    """The kernels mode ``kernels`` (``auto``, or a mode of :mod:`kimi.fork.kernels_mode`) comes to for
    ``line``, whose pin says whether a CPU wheel can lend kernels.

    Raises:
        KimiError: the line has no pin, or ``kernels`` is not a mode.
    """
    return kernels_mode(kernels, line_pin(layout, line))


def marker_text(key: str) -> str:
    """The venv's ``.kimi-install`` marker: the install key (:func:`_install_key`), then the tools installed."""
    return f"{key}\ntools: {' '.join(TOOLS)}\n"


def install_needed(marker: str | None, key: str) -> str | None:
    """What a venv with ``marker`` (its ``.kimi-install`` text; None: no venv or no marker) lacks for ``key``.

    Returns:
        "all" (sync'd tree not installed there), "tools" (installed by an older kimi without :data:`TOOLS`),
        or None (nothing).
    """
    lines = (marker or "").splitlines()
    if lines[:1] != [key]:
        return "all"
    return None if lines[1:2] == marker_text(key).splitlines()[1:2] else "tools"


def ensure_env(layout: Layout, line: str, venv: Path | None, kernels: str,
               from_dir: Path | None = None) -> Path:
    """Sync and install the fork into ``venv``; returns the venv's python.

    Raises:
        KimiError: sync fails, or a pip step fails (the message holds the log's tail).
    """
    return _ensure_env_at(line_layout(layout, line), line, venv, kernels, from_dir)


def _ensure_env_at(layout: Layout, line: str, venv: Path | None, kernels: str, from_dir: Path | None) -> Path:
    """``ensure_env`` in the checkout ``line_layout`` chose."""
    venv = (venv or layout.root / ".venv").resolve()
    sync(layout, line, from_dir=from_dir)
    pin = line_pin(layout, line)
    mode = line_kernels(layout, line, kernels)
    marker = venv / ".kimi-install"
    key = _install_key(layout, mode)
    python = _python(venv)
    env = {**os.environ, "KIMI_KERNELS": mode, "KIMI_CACHE_DIR": str(layout.cache),
           "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", str(layout.cache / "pip")),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    logs = layout.private / "logs"
    todo = install_needed(marker.read_text() if python.exists() and marker.is_file() else None, key)
    if todo == "tools":
        _step(f"installing the fork's tools into {venv}: {', '.join(TOOLS)} (log: {logs / 'pip-tools.log'})")
        _run_logged([str(python), "-m", "pip", "install", *TOOLS], logs / "pip-tools.log", env, layout.root)
        marker.write_text(marker_text(key))
    if todo != "all":
        _step(f"{venv} already holds this tree ({mode} kernels)")
        return python
    if not python.exists():
        _step(f"creating {venv}")
        venvlib.EnvBuilder(with_pip=True, symlinks=True).create(venv)
    if from_dir is not None:
        env["KIMI_FROM"] = str(from_dir)
    build_reqs = _build_requirements(layout, mode)
    t0 = _step(f"[1/2] installing torch {pin.torch} and vLLM's build requirements (log: {logs / 'pip-build.log'})")
    runtime_reqs = _torch_mode_requirements(layout) if mode == "torch" else None
    _run_logged([str(python), "-m", "pip", "install", f"torch=={pin.torch}", "-r", str(build_reqs),
                 *(["-r", str(runtime_reqs)] if runtime_reqs else []), *TORCH_MODE_EXTRAS * (mode == "torch")],
                logs / "pip-build.log", env, layout.root)
    t1 = _step(f"      done in {time.monotonic() - t0:.0f} s")
    kernels_note = "no compiled kernels (torch only)" if mode == "torch" else f"precompiled {mode} kernels"
    _step(f"[2/2] pip install -e . with {kernels_note}, and {', '.join(TOOLS)} "
          f"(log: {logs / 'pip-install.log'})")
    _run_logged([str(python), "-m", "pip", "install", "--no-build-isolation", "-e", ".", *TOOLS],
                logs / "pip-install.log", env, layout.root)
    _step(f"      done in {time.monotonic() - t1:.0f} s")
    marker.write_text(marker_text(key))
    return python


def smoke(venv: Path) -> None:
    """``import vllm`` (version, platform), ``vllm --version`` and ``vllm serve --help``.

    Raises:
        KimiError: any of them fails.
    """
    python, vllm = _python(venv), venv / "bin" / "vllm"
    checks = [
        ("import vllm", [str(python), "-c", _REPORT_VERSION]),
        ("vllm --version", [str(vllm), "--version"]),
        ("vllm serve --help", [str(vllm), "serve", "--help"]),
    ]
    for name, cmd in checks:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise KimiError(f"smoke check `{name}` failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        first = proc.stdout.strip().splitlines()[-1] if name != "vllm serve --help" else \
            f"{len(proc.stdout.splitlines())} lines of help"
        _step(f"smoke: {name}: {first}")


def setup(layout: Layout, line: str, venv: Path | None = None, kernels: str = "auto",
          from_dir: Path | None = None) -> None:
    """The README's first command: sync, install, smoke-run (see the module docstring)."""
    python = ensure_env(layout, line, venv, kernels, from_dir)
    smoke(python.parent.parent)
    _step(f"ready: activate with `source {python.parent / 'activate'}`")


def suite_env(layout: Layout, line: str = DEFAULT_LINE, kernels: str = "auto") -> dict[str, str]:
    """The environment pytest runs in for ``kimi test`` of ``line`` installed at ``layout``."""
    mode = line_kernels(layout, line, kernels)
    return {**os.environ, "KIMI_TEST_INSTALLED": "1", "KIMI_TEST_LINE": line, "KIMI_KERNELS": mode,
            "KIMI_CACHE_DIR": str(layout.cache)}


def installed_python(layout: Layout) -> Path:
    """The interpreter of the venv ``kimi setup`` made at ``layout`` (``ROOT/.venv``).

    Raises:
        KimiError: there is none yet (names ``kimi setup``).
    """
    python = _python(layout.root / ".venv")
    if not python.is_file():
        raise KimiError(f"{python} does not exist: run `kimi setup` first")
    return python


#: The most pytest workers ``kimi test`` starts: each may hold a vLLM engine (a few GB) while it runs.
MAX_TEST_WORKERS = 4


def test_workers(pytest_args: list[str], named: list[str]) -> int:
    """How many pytest-xdist workers ``kimi test`` runs the suite with: one per CPU this process may use, at most
    :data:`MAX_TEST_WORKERS`; 0 (no xdist) on one CPU, when tests are named, or when ``pytest_args`` choose
    (``-n``/``--numprocesses``, ``-p no:xdist``). Most of the suite's time is single-threaded Python (engines of
    tiny models, the Triton interpreter), so workers on otherwise idle cores shorten it nearly in proportion."""
    chosen = any(a in ("-n", "--numprocesses", "no:xdist") or a.startswith(("-n", "--numprocesses="))
                 for a in pytest_args)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 0 if chosen or named or cpus < 2 else min(cpus, MAX_TEST_WORKERS)


def run_tests(layout: Layout, line: str, venv: Path | None = None, kernels: str = "auto",
              pytest_args: list[str] | None = None) -> int:
    """The README's test command; returns pytest's exit status (5, no tests, becomes 1)."""
    layout = line_layout(layout, line)
    python = _ensure_env_at(layout, line, venv, kernels, None)
    pip_env = {**os.environ, "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", str(layout.cache / "pip"))}
    _run_logged([str(python), "-m", "pip", "install", "pytest", "pytest-xdist"],
                layout.private / "logs" / "pip-pytest.log", pip_env, layout.root)
    _run_logged([str(python), "-m", "pip", "install", "--no-deps", *TEST_NO_DEPS],
                layout.private / "logs" / "pip-test-extras.log", pip_env, layout.root)
    # a line with a test folder of its own (the origin line) runs it; the others (v0.26) the mainline's suite
    tests = f"tests/{line}" if (layout.root / "tests" / line).is_dir() else "tests"
    named = [a for a in pytest_args or [] if a.startswith("tests/")]  # tests named: run just those
    _step(f"running pytest on {', '.join(named) if named else tests + '/'}"
          + ("" if line == DEFAULT_LINE else f" in {layout.root}"))
    env = suite_env(layout, line, kernels)
    workers = test_workers(pytest_args or [], named)
    if workers:
        _step(f"{workers} pytest workers (pytest-xdist, one test file each at a time; `-- -n 0` runs in one process)")
    code = subprocess.run([str(python), "-m", "pytest", *([] if named else [tests]),
                           *(["-n", str(workers), "--dist", "loadfile"] if workers else []), *(pytest_args or [])],
                          cwd=layout.root, env=env).returncode
    if code == PYTEST_NO_TESTS:
        print("kimi test: error: pytest collected no tests", file=sys.stderr)
        return 1
    return code


#: The tests `kimi test --fast` runs: those that need no install of the fork (``install``, ``line``), no GPU and
#: no CMake build; they import only the ``kimi`` package, so this interpreter runs them without a setup step.
FAST_MARKERS = "not install and not line and not gpu and not build"


def run_fast_tests(layout: Layout, pytest_args: list[str] | None = None) -> int:
    """``kimi test --fast``: pytest ``-m FAST_MARKERS`` on ``tests/`` with this interpreter, no setup (seconds).

    Returns pytest's exit status (5, no tests, becomes 1).

    Raises:
        KimiError: this interpreter has no pytest (names the install command).
    """
    import importlib.util

    if importlib.util.find_spec("pytest") is None:
        raise KimiError(f"--fast runs pytest with {sys.executable}, which has none: "
                        f"`{sys.executable} -m pip install pytest` (or `kimi test` without --fast)")
    named = [a for a in pytest_args or [] if a.startswith("tests/")]  # tests named: run just those
    _step(f"running pytest -m '{FAST_MARKERS}' on {', '.join(named) or 'tests/'} with {sys.executable}")
    code = subprocess.run([sys.executable, "-m", "pytest", "-m", FAST_MARKERS, *([] if named else ["tests"]),
                           *(pytest_args or [])], cwd=layout.root).returncode
    if code == PYTEST_NO_TESTS:
        print("kimi test: error: pytest collected no tests", file=sys.stderr)
        return 1
    return code
