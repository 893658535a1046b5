"""``kimi refresh``: turn edits made in the laid tree back into the patch series.

Each edited file goes to the one patch that already touches it; git folds the
edit into that patch's commit (``commit --fixup`` + ``rebase --autosquash``)
so later patches are replayed on top.  ``--into NAME`` sends every edit to
one patch; ``--new SLUG`` starts a new patch at the end of the series, with a
header whose TODO fields must be filled in before the next sync.  Files that
no patch touches, or that several touch, need one of the two.

Afterwards every patch file is rewritten from its commit (headers kept) and
the recorded state matches the root again.
"""

from __future__ import annotations

import re
import shutil
import sys

from kimi.errors import KimiError
from kimi.fork.fsutil import read_exact, sha256_file
from kimi.fork.layout import Layout
from kimi.fork.lock import exclusive
from kimi.fork.patches import read_patch, render, template_header, write_patch
from kimi.fork.state import SyncState
from kimi.fork.sync import check_series_in_step
from kimi.fork.tree import Edits, detect_edits
from kimi.fork.workrepo import UPSTREAM_TAG, WorkRepo

_SLUG = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def _resolve(name: str, known: list[str]) -> str:
    """A patch name from a full name or its unique prefix (``0002`` or ``0002-foo``)."""
    name = name.removesuffix(".patch")
    hits = [k for k in known if k == name or k.startswith(name)]
    if len(hits) != 1:
        raise KimiError(f"--into {name!r} matches {len(hits)} patches (series: {', '.join(known) or 'empty'})")
    return hits[0]


def _targets(edits: Edits, repo: WorkRepo, series: list[str], into: str | None,
             new: str | None) -> dict[str, list[str]]:
    """Patch name -> edited paths it receives."""
    paths = edits.paths()
    if new is not None:
        if not _SLUG.match(new):
            raise KimiError(f"--new {new!r}: use a lowercase slug such as 'draft-head-argmax'")
        number = max((int(n[:4]) for n in series), default=0) + 1
        return {f"{number:04d}-{new}": paths}
    if into is not None:
        return {_resolve(into, series): paths}
    owners: dict[str, list[str]] = {}
    for name, commit in repo.patch_commits():
        for path in repo.files_touched(commit):
            owners.setdefault(path, []).append(name)
    targets: dict[str, list[str]] = {}
    problems = []
    for path in paths:
        found = owners.get(path, [])
        if len(found) == 1:
            targets.setdefault(found[0], []).append(path)
        else:
            problems.append(f"  {path}: " + (f"touched by {', '.join(found)}" if found else "in no patch"))
    if problems:
        raise KimiError(
            "cannot tell which patch these edits belong to:\n" + "\n".join(problems)
            + "\nuse `kimi refresh --into NAME` (an existing patch) or `kimi refresh --new SLUG` (a new patch)"
        )
    return targets


def refresh(layout: Layout, into: str | None = None, new: str | None = None) -> list[str]:
    """Fold the root's edits into the series; returns the names of the patch files written.

    Either everything happens or nothing: on any error the work repository
    is put back as it was and no patch file is written.

    Raises:
        KimiError: nothing is laid yet, the patch files changed since the
            last sync, a patch header cannot be read, the owner of an edit is
            ambiguous, or folding an edit conflicts with a later patch.
    """
    with exclusive(layout.private):
        state = SyncState.load(layout.state_file)
        if state is None or not layout.work.is_dir() or state.incomplete:
            raise KimiError("nothing is laid yet, or the last sync was interrupted: run `kimi sync` first")
        repo = WorkRepo(layout.work)
        edits = detect_edits(layout.root, state.manifest, repo)
        if not edits:
            print("kimi: nothing to refresh: the laid tree matches the series", file=sys.stderr)
            return []
        patches_dir = layout.patches_dir(state.line)
        check_series_in_step(repo, state, patches_dir, "refresh")
        headers = {p.stem: read_patch(p).header for p in sorted(patches_dir.glob("*.patch"))}
        targets = _targets(edits, repo, sorted(headers), into, new)
        start = repo.head()
        try:
            diffs = _fold(layout, repo, edits, targets)
        except BaseException:
            repo.git("rebase", "--abort", check=False)
            repo.git("reset", "-q", "--hard", start)
            raise
        written = []
        for name, diff in diffs:
            path = patches_dir / f"{name}.patch"
            header = headers.get(name) or template_header(name[5:].replace("-", " "))
            if not path.is_file() or read_exact(path) != render(header, diff):
                write_patch(path, header, diff)
                written.append(path.name)
            state.series[name] = sha256_file(path)
            if name not in state.applied:
                state.applied.append(name)
        for rel in edits.modified + edits.added:
            state.manifest[rel] = sha256_file(layout.root / rel)
        for rel in edits.deleted:
            state.manifest.pop(rel, None)
        if state.failed and state.failed["patch"] in state.applied:
            state.failed = None
        state.save(layout.state_file)
    for name in written:
        print(f"kimi: wrote {patches_dir.relative_to(layout.root) / name}", file=sys.stderr)
    return written


def _fold(layout: Layout, repo: WorkRepo, edits: Edits, targets: dict[str, list[str]]) -> list[tuple[str, str]]:
    """Commit the edits into the work repository; returns (patch name, diff) for every patch commit."""
    committed = dict(repo.patch_commits())
    for rel in edits.modified + edits.added:
        (layout.work / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(layout.root / rel, layout.work / rel)
    for rel in edits.deleted:
        (layout.work / rel).unlink(missing_ok=True)
    fixups = False
    for name, paths in targets.items():
        repo.git("add", "-A", "-f", "--", *paths)
        if name in committed:
            repo.git("commit", "-q", "--no-verify", f"--fixup={committed[name]}")
            fixups = True
        else:
            repo.git("commit", "-q", "--no-verify", "-m", name)
    if fixups:
        proc = repo.git("rebase", "-q", "-i", "--autosquash", UPSTREAM_TAG, check=False,
                        env={"GIT_SEQUENCE_EDITOR": "true", "GIT_EDITOR": "true"})
        if proc.returncode != 0:
            raise KimiError(
                "folding the edits into their patches conflicts with a later patch; nothing was changed\n"
                f"  git: {proc.stdout.strip() or proc.stderr.strip()}\n"
                "  put the edits in a new patch instead: `kimi refresh --new SLUG`"
            )
    return [(name, repo.commit_diff(commit)) for name, commit in repo.patch_commits()]
