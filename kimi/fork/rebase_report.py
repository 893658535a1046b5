"""The report of ``kimi rebase`` (``.kimi/rebase/report.md`` and ``report.json``): written by the rebase, read back
and added to by ``kimi rebase --probe`` (absorption candidates) and ``kimi upstream-tests`` (their summary)."""

from __future__ import annotations

from pathlib import Path

from kimi.errors import KimiError
from kimi.fork.candidates import Candidate, markdown, merged
from kimi.fork.fsutil import read_json_object, write_atomic, write_json_atomic
from kimi.fork.layout import Layout
from kimi.fork.upstream_tests.report import summary_markdown

#: What a rebase stopped at a conflict says to do next.
RESUME = "Resolve the conflict markers in `.kimi/rebase/repo`, then `kimi rebase --continue` (or `--abort`)."


def rebase_dir(layout: Layout) -> Path:
    """``.kimi/rebase``: the rebase's state, its work repository and its report."""
    return layout.private / "rebase"


def write_report(layout: Layout, report: dict) -> None:
    """``report.md`` (:func:`render`) and ``report.json`` of ``report``, in :func:`rebase_dir`."""
    write_atomic(rebase_dir(layout) / "report.md", render(report))
    write_json_atomic(rebase_dir(layout) / "report.json", report)


def last_report(layout: Layout, line: str) -> dict | None:
    """The last rebase report of ``line``, or None.

    Raises:
        KimiError: the report is damaged (names the fix).
    """
    try:
        report = read_json_object(rebase_dir(layout) / "report.json")
    except ValueError as exc:
        raise KimiError(f"{exc}: remove it, or run the rebase (`--dry-run`) again") from None
    return report if report and report.get("line") == line else None


def add_probe_candidates(layout: Layout, line: str, version: str, found: list[Candidate]) -> bool:
    """Put the probe's candidates (replacing an earlier probe's) into the report of the last rebase of ``line`` if
    it went onto ``version``, the release probed; returns whether it did.

    Raises:
        KimiError: the report is damaged.
    """
    report = last_report(layout, line)
    if report is None or report["to"] != version:
        return False
    report["candidates"] = merged(report.get("candidates", []), found, "probe")
    write_report(layout, report)
    return True


def add_upstream_tests(layout: Layout, line: str, summary: dict) -> bool:
    """Put the summary of a ``kimi upstream-tests`` run of ``line`` into the last rebase report of that line;
    returns whether there was one.

    Raises:
        KimiError: the report is damaged.
    """
    report = last_report(layout, line)
    if report is None:
        return False
    report["upstream_tests"] = summary
    write_report(layout, report)
    return True


def render(report: dict) -> str:
    """report.md from the report's JSON form."""
    rows = [f"# Rebase of `{report['line']}`: vLLM {report['from']} -> {report['to']}"
            + (" (dry run)" if report["dry_run"] else ""), "",
            f"Started {report['started']}; written {report['written']}; "
            + ("finished." if report["finished"] else "stopped at a conflict."), "",
            "| patch | outcome | files | conflict markers (line numbers) |", "|---|---|---|---|"]
    for o in report["patches"]:
        where = "; ".join(f"{f}: {', '.join(map(str, lines))}" for f, lines in o["conflicts"].items())
        outcome = o["outcome"]
        if outcome == "absorbed":
            outcome = f"absorbed in {report['to']}" + (
                f" (declared: absorbed in {o['declared']}; replay: {o['replay']})" if o.get("declared") else "")
        elif o.get("resolved"):
            outcome = "applied (conflict resolved)"
        elif outcome == "ported":
            outcome = f"ported (conflict resolved with `{o['port']}`)"
        rows.append(f"| {o['name']} | {outcome} | {', '.join(o['files'])} | {where} |")
    rows += markdown(report.get("candidates", []))
    declared = [o for o in report["patches"] if o.get("declared")]
    if declared:
        rows += ["", "## Declared absorbed", "",
                 ("Upstream fixed these its own way (the patch header's `Upstream: absorbed in ...`): a text merge "
                  "cannot see that, so each patch is dropped on its header's word. The hunks below are the patch's "
                  "changes the new release does not contain; run the tests against the new release to show that "
                  "upstream's fix covers the patch's symptom.")]
        for o in declared:
            rows += ["", f"### {o['name']} (absorbed in {o['declared']}; replay: {o['replay']})", "",
                     "Not in the new release:", *[f"- `{h}`" for h in o["remaining"] or ["(none)"]], "",
                     "Verify with:", *[f"- `{t}`" for t in o["verify"] or ["(no tests named)"]]]
    rows += ["", *summary_markdown(report.get("upstream_tests"))]
    if not report["finished"] and not report["dry_run"]:
        rows += ["", RESUME]
    return "\n".join(rows) + "\n"
