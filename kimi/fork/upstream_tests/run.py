"""Run upstream's tests for the files the series changes, on the patched tree and on the pristine release.

The line's pinned sdist holds upstream's ``tests/``; they are unpacked with its ``pyproject.toml`` (pytest's
markers) into ``.kimi/upstream-tests/<version>/`` and run from there, each chosen file in its own pytest (a crash
or a hang costs one file), with the interpreter of the environment the laid tree is installed in.  The patched
run uses the laid tree as it is; the pristine run takes the series' ``vllm/`` hunks out of the laid files
(:func:`kimi.fork.revert.reverted`, as the probe does for one patch) and puts them back afterwards: nothing is
reinstalled.

The runs are on CPU: ``TRITON_INTERPRET=1`` (unless the environment says otherwise) lets Triton's interpreter run
the kernels upstream's tests call directly (without it, vLLM's launcher finds no compiled kernel and every such
test fails alike in both runs).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from kimi.errors import KimiError
from kimi.fork.artifacts import obtain
from kimi.fork.fsutil import write_atomic
from kimi.fork.layout import Layout
from kimi.fork.patches import load_series
from kimi.fork.pin import line_pin
from kimi.fork.probe import pytest_counts
from kimi.fork.revert import reverted
from kimi.fork.state import SyncState
from kimi.fork.sync import check_no_unrefreshed_edits
from kimi.fork.tree import extract_sdist
from kimi.fork.upstream_tests import standins
from kimi.fork.upstream_tests.report import report_dir, write_report
from kimi.fork.upstream_tests.results import Outcome, compare, read_junit
from kimi.fork.upstream_tests.selection import select_tests, touched_modules
from kimi.log import say

RUNS = ("patched", "pristine")


def unpack_tests(layout: Layout, line: str, from_dir: Path | None = None) -> Path:
    """``.kimi/upstream-tests/<version>/`` holding the line's release's ``tests/`` and ``pyproject.toml``
    (unpacked once per sdist; ``from_dir`` as ``kimi sync --from``); returns the folder.

    Raises:
        KimiError: the pinned sdist cannot be obtained (cache, ``from_dir``, package index).
    """
    pin = line_pin(layout, line)
    artifact = pin.artifacts["sdist"]
    dest = report_dir(layout) / pin.version
    stamp = dest / ".sdist-sha256"
    if stamp.is_file() and stamp.read_text() == artifact.sha256:
        return dest
    sdist = obtain(artifact, layout.cache, from_dir)
    say(f"unpacking upstream's tests from {sdist.name} into {dest}")
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    extract_sdist(sdist, dest, only=frozenset({"tests", "pyproject.toml"}))
    write_atomic(stamp, artifact.sha256)
    return dest


def _run_file(python: Path, where: Path, test_file: str, junit: Path, timeout: int,
              env: dict[str, str]) -> tuple[dict[str, Outcome], dict]:
    """One test file in its own pytest: (test id -> outcome, ``{"counts", "seconds", "note"}``).  A file that
    hangs or dies before pytest writes its report counts as one ``error`` under ``FILE::<run>``."""
    junit.unlink(missing_ok=True)
    cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", "pyproject.toml", "--rootdir", ".",
           "-o", "junit_family=xunit1", f"--junitxml={junit}", test_file]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=where, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc = None
    seconds = time.monotonic() - start
    if proc is None or not junit.is_file():
        if proc is None:
            note = f"stopped after {timeout} s"
        else:
            tail = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()][-1:] or ["no output"]
            note = f"no report (exit {proc.returncode}): {tail[0][:200]}"
        return {f"{test_file}::<run>": Outcome("error", note)}, {"counts": {}, "seconds": seconds, "note": note}
    output = proc.stdout + proc.stderr
    return read_junit(junit, test_file), {"counts": pytest_counts(output), "seconds": seconds, "note": ""}


def _run_all(python: Path, where: Path, files: list[str], run: str, timeout: int,
             env: dict[str, str]) -> tuple[dict[str, Outcome], dict[str, dict]]:
    outcomes: dict[str, Outcome] = {}
    records = {}
    for i, test_file in enumerate(files, 1):
        junit = where / "junit" / run / (test_file.replace("/", "__") + ".xml")
        junit.parent.mkdir(parents=True, exist_ok=True)
        found, record = _run_file(python, where, test_file, junit, timeout, env)
        outcomes.update(found)
        records[test_file] = record
        counts = ", ".join(f"{n} {k}" for k, n in sorted(record["counts"].items())) or record["note"]
        say(f"[{run} {i}/{len(files)}] {test_file}: {counts} ({record['seconds']:.0f} s)")
    return outcomes, records


def _check_pytest(python: Path) -> None:
    """Raises KimiError (naming the install) when ``python`` has no pytest."""
    if subprocess.run([str(python), "-c", "import pytest"], capture_output=True).returncode != 0:
        raise KimiError(f"{python} has no pytest: `{python} -m pip install pytest tblib` (upstream's conftest "
                        "imports tblib too), or run `kimi test` once, which installs pytest")


def upstream_tests(layout: Layout, python: Path | None, only: list[str] | None = None, timeout: int = 600,
                   list_only: bool = False, from_dir: Path | None = None) -> dict:
    """Choose upstream's tests for the series' files (``only``: globs or path prefixes narrowing the choice) and,
    unless ``list_only``, run them patched and pristine and write the report; returns the summary (with
    ``list_only``: ``{"selected": {test file: modules}}``).  ``python``: the interpreter of the environment the laid
    tree is installed in (None with ``list_only``).  The line's last rebase report, and its probe report of the same
    release, get the summary.

    Raises:
        KimiError: the line is not synced, or the laid tree has edits not refreshed; no upstream test matches.
    """
    from kimi.fork import probe, rebase_report

    state = SyncState.load(layout.state_file)
    if state is None or state.failed:
        raise KimiError("upstream's tests run on a fully synced and installed line: `kimi sync`, then `kimi setup`")
    series = load_series(layout.patches_dir(state.line))
    version = line_pin(layout, state.line).version
    where = unpack_tests(layout, state.line, from_dir)
    touched = touched_modules(series)
    selected = select_tests(where, touched, only)
    if not selected:
        raise KimiError(f"no upstream test of vllm {version} names a module the series changes"
                        + (f" and matches {', '.join(only)}: check the paths (relative to the sdist, "
                           f"tests/...; `--list` without --only shows the choice)" if only else ""))
    if list_only:
        return {"selected": selected}
    check_no_unrefreshed_edits(layout, state)  # the patched run is the series, nothing else
    if python is None:
        raise KimiError("upstream_tests: an interpreter is needed to run the tests")
    _check_pytest(python)
    say(f"{len(selected)} upstream test files of vllm {version} name the {len(touched)} modules the series changes; "
        f"each runs patched, then pristine (up to {timeout} s a file)")
    env = {"TRITON_INTERPRET": "1", **os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    missing = standins.needed(python)
    if missing:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(standins.FOLDER), env.get("PYTHONPATH")) if p)
        say(f"{', '.join(missing)}: not importable by {python}; a stand-in ({standins.FOLDER}) lets test modules "
            "that import it at load be collected, alike patched and pristine")
    files = list(selected)
    patched, patched_runs = _run_all(python, where, files, "patched", timeout, env)
    with reverted(layout.root, series) as swapped:
        say(f"pristine: {len(swapped)} files of vllm/ as vllm {version} has them (put back afterwards)")
        pristine, pristine_runs = _run_all(python, where, files, "pristine", timeout, env)
    outcomes = {"pristine": pristine, "patched": patched}
    summary = write_report(layout, state.line, version, selected, touched,
                           {"pristine": pristine_runs, "patched": patched_runs}, outcomes, compare(pristine, patched))
    for name, owner in (("rebase", rebase_report), ("probe", probe)):
        if owner.add_upstream_tests(layout, state.line, summary):
            say(f"added to the {name} report in {layout.private / 'rebase'}")
    return summary
