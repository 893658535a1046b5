"""Candidates for dropping a patch on a new release, each with its reason.

Two kinds of evidence, found by the tools, not by hand:

* ``rebase`` - upstream deleted files the patch changes (``kimi rebase`` compares the old release's files with the
  new one's): a patch whose every file is gone patches code the release no longer has; one with some files gone
  needs those hunks dropped or moved;
* ``probe`` - the patch's tests pass on the release without the patch (``kimi rebase --probe``): upstream fixed the
  bug its own way.

A candidate is not dropped automatically: read the release's change, then mark the header
``Upstream: absorbed in X.Y.Z - <how>`` (the next ``kimi rebase`` drops it) or port the patch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    """One patch the new release may no longer need: ``by`` (``rebase`` / ``probe``), ``reason`` (one sentence)
    and ``evidence`` (the deleted files, or the tests that pass without the patch)."""

    name: str
    by: str
    reason: str
    evidence: tuple[str, ...]

    def as_dict(self) -> dict:
        """The JSON form (``evidence`` as a list)."""
        return {"name": self.name, "by": self.by, "reason": self.reason, "evidence": list(self.evidence)}


def deleted_targets(patches: list[tuple[str, list[str]]], old_files: set[str], new_files: set[str],
                    version: str) -> list[Candidate]:
    """The patches (name, files it changes) that change files of the old release the new release ``version`` no
    longer has (``old_files`` / ``new_files``: every path of each release); files a patch creates do not count."""
    found = []
    for name, files in patches:
        gone = sorted(f for f in files if f in old_files and f not in new_files)
        if not gone:
            continue
        share = ("every file it changes" if len(gone) == len(files)
                 else f"{len(gone)} of the {len(files)} files it changes")
        found.append(Candidate(name, "rebase", f"vllm {version} deleted {share}", tuple(gone)))
    return found


def passing_without(name: str, tests: list[str], version: str) -> Candidate:
    """The probe's candidate: ``tests`` (``name``'s own) pass on vllm ``version`` without the patch."""
    return Candidate(name, "probe", f"its tests pass on vllm {version} without the patch: upstream fixed the bug",
                     tuple(tests))


def merged(current: list[dict], new: list[Candidate], by: str) -> list[dict]:
    """``current`` (a report's candidates, JSON form) with those found ``by`` one tool replaced by ``new``, in
    patch order."""
    kept = [c for c in current if c["by"] != by] + [c.as_dict() for c in new]
    return sorted(kept, key=lambda c: (c["name"], c["by"]))


def markdown(candidates: list[dict]) -> list[str]:
    """The report section naming each candidate with its reason and evidence (empty without candidates)."""
    if not candidates:
        return []
    rows = ["", "## Candidates for dropping", "",
            ("Found by the tools: `rebase` (upstream deleted files the patch changes) and `probe` (the patch's tests "
             "pass on the release without it). Read the release's change, then mark the header "
             "`Upstream: absorbed in X.Y.Z - <how>` or port the patch."), "",
            "| patch | found by | reason | evidence |", "|---|---|---|---|"]
    rows += [f"| {c['name']} | {c['by']} | {c['reason']} | {', '.join(f'`{e}`' for e in c['evidence'])} |"
             for c in candidates]
    return rows
