"""The upstream-tests report (``.kimi/upstream-tests/report.json`` and ``report.md``) and its summary, the part
the rebase and probe reports carry."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from kimi.errors import KimiError
from kimi.fork.fsutil import read_json_object, write_atomic, write_json_atomic
from kimi.fork.layout import Layout
from kimi.fork.upstream_tests.results import Comparison, Outcome

TITLE = "## Upstream's tests, pristine against patched"


def report_dir(layout: Layout) -> Path:
    """``.kimi/upstream-tests/``: the unpacked tests, the runs' JUnit files, the report."""
    return layout.private / "upstream-tests"


def _suspects(test: str, selected: dict[str, list[str]], touched: dict[str, list[str]]) -> list[str]:
    """The patches changing a module the test's file names: where a regression comes from."""
    modules = selected.get(test.split("::", 1)[0], [])
    return sorted({p for m in modules for p in touched.get(m, [])})


def write_report(layout: Layout, line: str, version: str, selected: dict[str, list[str]],
                 touched: dict[str, list[str]], runs: dict[str, dict[str, dict]],
                 outcomes: dict[str, dict[str, Outcome]], comparison: Comparison) -> dict:
    """Write report.json and report.md; returns the summary (:func:`summary_markdown` renders it).

    ``runs``: ``pristine`` / ``patched`` -> test file -> ``{"counts", "seconds", "note"}``; ``outcomes``: the same
    two keys -> test id -> :class:`Outcome`.
    """
    pristine, patched = outcomes["pristine"], outcomes["patched"]
    written = time.strftime("%Y-%m-%d %H:%M:%S")
    regressions = [{"test": t, "pristine": pristine[t].outcome, "patched": patched.get(t, Outcome("missing")).outcome,
                    "message": patched.get(t, Outcome("missing")).message,
                    "patches": _suspects(t, selected, touched)} for t in comparison.regressions]
    out = report_dir(layout)
    summary = {"line": line, "version": version, "written": written, "files": len(selected),
               "tests": len(pristine.keys() | patched.keys()), "regressions": regressions,
               "fixed": len(comparison.fixed),
               "fail_differently": _differences(comparison, outcomes, selected, touched),
               "both_fail": len(comparison.both_fail),
               "changed": len(comparison.changed), "same": comparison.same,
               "report": (out / "report.md").relative_to(layout.root).as_posix()}
    write_json_atomic(out / "report.json", {
        "summary": summary, "selected": selected, "touched": touched, "runs": runs,
        "comparison": asdict(comparison),
        "outcomes": {run: {t: asdict(o) for t, o in found.items()} for run, found in outcomes.items()}})
    rows = [f"# Upstream's tests of `{line}` on vLLM {version}", "", *summary_markdown(summary)[2:]]
    rows += ["", "## Per file", "", "| test file | modules of the series it names | pristine | patched |",
             "|---|---|---|---|"]
    rows += [f"| {f} | {', '.join(selected[f])} | {_cell(runs['pristine'].get(f))} | {_cell(runs['patched'].get(f))} |"
             for f in selected]
    for title, tests in (("Fixed by the series (fail pristine, pass patched)", comparison.fixed),
                         ("Failing in both, differently (each message below)", comparison.fail_differently),
                         ("Failing in both", comparison.both_fail),
                         ("Changed otherwise (skipped or missing on one side)", comparison.changed)):
        if tests:
            rows += ["", f"## {title}", "", *[f"- `{t}`: pristine {_said(pristine, t)}; patched {_said(patched, t)}"
                                              for t in tests]]
    write_atomic(out / "report.md", "\n".join(rows) + "\n")
    return summary


def _said(outcomes: dict[str, Outcome], test: str) -> str:
    found = outcomes.get(test, Outcome("missing"))
    return found.outcome + (f" ({found.message})" if found.message else "")


def _differences(comparison: Comparison, outcomes: dict[str, dict[str, Outcome]], selected: dict[str, list[str]],
                 touched: dict[str, list[str]]) -> list[dict]:
    """The tests failing in both runs with different messages, grouped by the pair of messages (first test named):
    ``{"tests": n, "example", "pristine", "patched", "patches"}``, most tests first."""
    groups: dict[tuple[str, str], list[str]] = {}
    for test in comparison.fail_differently:
        key = (outcomes["pristine"][test].message, outcomes["patched"][test].message)
        groups.setdefault(key, []).append(test)
    return [{"tests": len(tests), "example": tests[0], "pristine": before, "patched": after,
             "patches": _suspects(tests[0], selected, touched)}
            for (before, after), tests in sorted(groups.items(), key=lambda item: -len(item[1]))]


def _cell(run: dict | None) -> str:
    if run is None:
        return "-"
    counts = ", ".join(f"{n} {k}" for k, n in sorted(run["counts"].items())) or "no tests"
    return f"{counts} ({run['seconds']:.0f} s)" + (f"; {run['note']}" if run["note"] else "")


def load_summary(layout: Layout, line: str) -> dict | None:
    """The summary of the last ``kimi upstream-tests`` run of ``line`` at ``layout``; None if there is none.

    Raises:
        KimiError: the report is damaged (names the command that writes it again).
    """
    try:
        report = read_json_object(report_dir(layout) / "report.json")
    except ValueError as exc:
        raise KimiError(f"{exc}: run `kimi upstream-tests` again") from None
    summary = (report or {}).get("summary")
    return summary if summary and summary.get("line") == line else None


def summary_markdown(summary: dict | None) -> list[str]:
    """The report section: counts and each regression with its message and the patches that may cause it."""
    if summary is None:
        return [TITLE, "", ("Not run for this line and release: `python3 -m kimi upstream-tests` runs upstream's "
                            "tests for the files the series changes, on the pristine release and on the patched tree.")]
    differently = summary.get("fail_differently", [])  # absent from a report of an earlier kimi
    rows = [TITLE, "",
            (f"vLLM {summary['version']}, written {summary['written']} (`kimi upstream-tests`; details: "
             f"`{summary['report']}`): {summary['files']} test files, {summary['tests']} tests; "
             f"**{len(summary['regressions'])} regressions** (pass pristine, fail patched), {summary['fixed']} fixed "
             f"by the series, {sum(g['tests'] for g in differently)} failing in both differently, "
             f"{summary['both_fail']} failing in both alike, {summary['changed']} changed otherwise, "
             f"{summary['same']} alike.")]
    if differently:
        rows += ["", ("Failing in both, with different messages (the series changed how they fail: a regression "
                      "where the pristine failure is the machine's):"), "",
                 "| tests | for example | pristine | patched | patches changing what it imports |",
                 "|---|---|---|---|---|"]
        rows += [f"| {g['tests']} | `{g['example']}` | {_cell_text(g['pristine'])} | {_cell_text(g['patched'])} | "
                 f"{', '.join(g.get('patches', []))} |" for g in differently]
    if summary["regressions"]:
        rows += ["", "| regression | patched | message | patches changing what it imports |", "|---|---|---|---|"]
        rows += [f"| `{r['test']}` | {r['patched']} | {_cell_text(r['message'])} | {', '.join(r['patches'])} |"
                 for r in summary["regressions"]]
    return rows


def _cell_text(text: str) -> str:
    """``text`` safe in a markdown table cell."""
    return text.replace("|", "/")
