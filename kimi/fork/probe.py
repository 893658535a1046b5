"""``kimi rebase --probe``: which patches of the laid, installed line does the release no longer need?

A three-way merge cannot see that upstream fixed a patch's problem its own way (it reports a conflict, or
the patch still applies).  The tests a patch header names can: for each patch whose files are all under
``vllm/`` (build-time patches are not probed: without them the install itself changes), the patch's hunks
are taken out of the laid tree - the tree the editable install of ``.venv`` runs - its tests
(``Absorbed-check``, else the ``tests/...`` entries of ``Tests``) are run, and the files are put back
byte for byte (also on an error or Ctrl-C).  Where a patch's hunks do not come out alone because a later patch
changed their context, the later patches touching its files come out with it (first), and the note names them:
its tests then run without all of them.  Outcomes:

* ``needed``    - the tests fail without the patch: the fork still fixes something the release does not;
* ``candidate`` - they pass without it: a candidate for absorption (read the release's change, then mark the
  header ``Upstream: absorbed in X.Y.Z``; the next ``kimi rebase`` drops it);
* ``unknown``   - no test ran (none named, all skipped, or a collection error), or the patch was not probed.

Each run also records the tests with the patch in place (``with_patch``): a test that fails with the patch
says nothing about absorption.  The report is ``.kimi/rebase/probe.json`` and ``probe.md``; it carries the last
``kimi upstream-tests`` comparison of the line on the same release (upstream's tests, pristine against patched).
Each candidate, with its reason, also goes into the report of the rebase onto the release probed
(:func:`kimi.fork.rebase_report.add_probe_candidates`).
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kimi.errors import KimiError
from kimi.fork.candidates import passing_without
from kimi.fork.fsutil import read_json_object, write_atomic, write_json_atomic
from kimi.fork.layout import Layout
from kimi.fork.patches import Patch, load_series
from kimi.fork.pin import line_pin
from kimi.fork.revert import reverted
from kimi.fork.unidiff import HunkFailed
from kimi.fork.upstream_tests.report import load_summary, summary_markdown
from kimi.log import say

_COUNTS = re.compile(r"(\d+) (passed|failed|errors?|skipped)")
_TEST_PATH = re.compile(r"(?<![\w./-])tests/[\w./-]+\.py(?:::[\w\[\].-]+)*")


@dataclass
class ProbeResult:
    """One patch: ``outcome`` (``needed`` / ``candidate`` / ``unknown``), the tests, and pytest's counts with and
    without the patch (``{"passed": n, "failed": n, ...}``)."""

    name: str
    outcome: str
    tests: list[str]
    with_patch: dict[str, int]
    without_patch: dict[str, int]
    note: str = ""


def probe_tests(patch: Patch) -> list[str]:
    """The tests that probe ``patch``: the pytest paths (``tests/....py``, with any ``::`` node id) its
    ``Absorbed-check`` field names, else those of ``Tests``, in order, each once, whatever separates them (commas,
    semicolons, line breaks) or follows them (a note in parentheses)."""
    text = patch.header.get("Absorbed-check") or patch.header.get("Tests", "")
    return list(dict.fromkeys(_TEST_PATH.findall(text)))


def pytest_counts(output: str) -> dict[str, int]:
    """pytest's closing counts (``passed``, ``failed``, ``error``, ``skipped``) read from its output."""
    counts: dict[str, int] = {}
    for line in output.splitlines()[-5:]:
        for number, word in _COUNTS.findall(line):
            counts[word.rstrip("s") if word.startswith("error") else word] = int(number)
    return counts


def _run(python: Path, root: Path, tests: list[str], env: dict[str, str]) -> dict[str, int]:
    proc = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=root, env=env,
                          capture_output=True, text=True)
    return pytest_counts(proc.stdout + proc.stderr)


def _run_without(root: Path, series: list[Patch], patch: Patch, python: Path, tests: list[str], env: dict[str, str]
                 ) -> tuple[dict[str, int], list[str]]:
    """pytest's counts of ``tests`` with ``patch``'s hunks out of the laid tree under ``root``, and the names of
    the later patches taken out with it: none, or, where its hunks do not come out alone (a later patch of
    ``series`` changed their context), every later patch touching one of its files.

    Raises:
        KimiError: the hunks do not come out with the later patches either (or are not in the laid tree).
    """
    try:
        with reverted(root, [patch]):
            return _run(python, root, tests, env), []
    except HunkFailed:
        later = [p for p in series[series.index(patch) + 1:] if set(p.files()) & set(patch.files())]
        if not later:
            raise
    say(f"probe {patch.name}: its hunks come out only after {', '.join(p.name for p in later)}'s")
    with reverted(root, [patch, *later]):
        return _run(python, root, tests, env), [p.name for p in later]


def _judge(with_patch: dict[str, int], without: dict[str, int]) -> tuple[str, str]:
    if not without.get("passed") and not without.get("failed") and not without.get("error"):
        return "unknown", "no test ran"
    if without.get("failed") or without.get("error"):
        return "needed", ""
    if with_patch.get("failed") or with_patch.get("error"):
        return "unknown", "the tests fail with the patch too"
    return "candidate", "passes without the patch: upstream fixed the bug"


def probe(layout: Layout, python: Path, env: dict[str, str], names: list[str] | None = None) -> list[ProbeResult]:
    """Probe the patches of the laid line (all, or ``names``: full names or number prefixes).

    ``python`` is the interpreter of the environment the laid tree is installed in (``.venv``); ``env`` the
    environment for its pytest (``kimi test``'s).

    Raises:
        KimiError: a name matches no patch; a patch's hunks are not in the laid tree (sync first).
    """
    from kimi.fork.rebase_report import add_probe_candidates
    from kimi.fork.state import SyncState

    state = SyncState.load(layout.state_file)
    if state is None or state.failed:
        raise KimiError("the probe runs on a fully synced and installed line: `kimi sync`, then `kimi setup`")
    series = load_series(layout.patches_dir(state.line))
    chosen = [p for p in series if not names or any(p.name == n or p.name.startswith(n) for n in names)]
    if names and len(chosen) == 0:
        raise KimiError(f"no patch matches {', '.join(names)} (series: {', '.join(p.name for p in series)})")
    version = line_pin(layout, state.line).version
    results = []
    for patch in chosen:
        tests = probe_tests(patch)
        if any(not f.startswith("vllm/") for f in patch.files()):
            results.append(ProbeResult(patch.name, "unknown", tests, {}, {}, "not probed: build-time files"))
            continue
        if not tests:
            results.append(ProbeResult(patch.name, "unknown", tests, {}, {}, "no tests/ named in its header"))
            continue
        say(f"probe {patch.name}: {', '.join(tests)} with the patch, then without it on vllm {version}")
        with_patch = _run(python, layout.root, tests, env)
        without, also = _run_without(layout.root, series, patch, python, tests, env)
        outcome, note = _judge(with_patch, without)
        if also:
            note = "; ".join(filter(None, [note, f"taken out with {', '.join(also)} (later hunks on its context)"]))
        results.append(ProbeResult(patch.name, outcome, tests, with_patch, without, note))
        say(f"probe {patch.name}: {outcome}" + (f" ({note})" if note else ""))
    summary = load_summary(layout, state.line)
    _write_report(layout, {"line": state.line, "version": version, "written": time.strftime("%Y-%m-%d %H:%M:%S"),
                           "patches": [asdict(r) for r in results],
                           "upstream_tests": summary if summary and summary["version"] == version else None})
    found = [passing_without(r.name, r.tests, version) for r in results if r.outcome == "candidate"]
    if add_probe_candidates(layout, state.line, version, found):
        say(f"{len(found)} candidates put into the rebase report {layout.private / 'rebase' / 'report.md'}")
    return results


def _cell(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "-"


def _write_report(layout: Layout, report: dict) -> None:
    out = layout.private / "rebase"
    write_json_atomic(out / "probe.json", report)
    intro = (f"Written {report['written']}. Each patch's tests with the patch, then with its hunks taken out of the "
             "laid tree (`kimi rebase --probe`). A candidate's tests pass on the release without it: upstream fixed "
             "the bug its own way.")
    rows = [f"# Absorption probe of `{report['line']}` on vLLM {report['version']}", "", intro, "",
            "| patch | outcome | tests | with the patch | without it | note |", "|---|---|---|---|---|---|"]
    rows += [f"| {r['name']} | {r['outcome']} | {', '.join(r['tests']) or '-'} | {_cell(r['with_patch'])} | "
             f"{_cell(r['without_patch'])} | {r['note']} |" for r in report["patches"]]
    rows += ["", *summary_markdown(report["upstream_tests"])]
    write_atomic(out / "probe.md", "\n".join(rows) + "\n")


def add_upstream_tests(layout: Layout, line: str, summary: dict) -> bool:
    """Put the summary of a ``kimi upstream-tests`` run into the last probe report of ``line`` if it probed the
    same release; returns whether it did.

    Raises:
        KimiError: the probe report is damaged (names the fix).
    """
    try:
        report = read_json_object(layout.private / "rebase" / "probe.json")
    except ValueError as exc:
        raise KimiError(f"{exc}: run `kimi rebase --probe` again") from None
    if report is None or report.get("line") != line or report.get("version") != summary["version"]:
        return False
    report["upstream_tests"] = summary
    _write_report(layout, report)
    return True
