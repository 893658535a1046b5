"""``kimi sync``: lay the pinned upstream release, patched, at the repository root.

Steps: read the pin and the series (validating every header); refuse if the
laid tree holds edits not refreshed into the series; obtain the sdist and
verify its sha256 (on a mismatch nothing is touched); unpack it into a new
work repository and apply the series there, one commit per patch; swap the
work repository in; copy the result to the root.

A patch that upstream already contains is skipped and reported as absorbed.
A patch that does not apply stops the series: the root is laid at the last
good state (upstream plus the patches before it) and the error names the
patch, the file and the hunk, with the commands to resume or reset.

One kimi command runs at a time per checkout (``.kimi/lock``).  While files
are copied the state says so (``incomplete``): an interrupted sync is
finished by the next one instead of being mistaken for edits.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from kimi.errors import KimiError
from kimi.fork.artifacts import obtain
from kimi.fork.fsutil import read_exact, sha256_file
from kimi.fork.layout import Layout
from kimi.fork.lock import exclusive
from kimi.fork.patches import load_series, split
from kimi.fork.pin import line_pin
from kimi.fork.state import SyncState
from kimi.fork.tree import detect_edits, extract_sdist, lay, ours
from kimi.fork.workrepo import WorkRepo
from kimi.log import say


def check_no_unrefreshed_edits(layout: Layout, state: SyncState) -> None:
    """Raise if the laid tree differs from what the last sync laid (the edits would be lost)."""
    repo = WorkRepo(layout.work) if layout.work.is_dir() else None
    edits = detect_edits(layout.root, state.manifest, repo)
    if edits:
        raise KimiError(
            "the laid tree has edits that are not in the patch series:\n"
            f"{edits.summary()}\n"
            "keep them with `kimi refresh` (see `kimi refresh --help`), or discard them with `kimi sync --force`"
        )


def check_series_in_step(repo: WorkRepo, state: SyncState, patches_dir: Path, command: str) -> None:
    """Refuse when the patch files differ from what the last sync applied (``command`` works from the
    applied commits, so it would overwrite or ignore them).

    Header edits are fine (refresh keeps headers); a changed diff, a removed
    patch or a new patch file need `kimi sync` first.
    """
    files = {p.stem: p for p in patches_dir.glob("*.patch")}
    committed = dict(repo.patch_commits())
    problems = [f"  {name}: removed since the last sync" for name in committed if name not in files]
    for name, path in sorted(files.items()):
        if name in committed:
            if not repo.same_change(split(read_exact(path))[1], committed[name]):
                problems.append(f"  {name}: its diff was edited since the last sync")
        elif not state.failed and name not in state.absorbed:
            problems.append(f"  {name}: new since the last sync")
    if problems:
        raise KimiError(
            f"the patch files changed since the last sync, and {command} works from what that sync applied:\n"
            + "\n".join(problems)
            + "\nrun `kimi sync` first (it refuses while the tree has edits: keep a copy of them, or undo "
              "the patch-file change)"
        )


def _previous_state(layout: Layout, force: bool) -> SyncState | None:
    try:
        return SyncState.load(layout.state_file)
    except KimiError as exc:
        if not force:
            raise
        say(f"warning: {exc}; laying from scratch")
        return None


def sync(layout: Layout, line: str, from_dir: Path | None = None, force: bool = False) -> SyncState:
    """Materialize ``line`` at ``layout.root``; see the module docstring.

    Returns:
        The new state (also written to ``.kimi/state.json``).

    Raises:
        KimiError: unknown line, invalid pin or patch header, unrefreshed
            edits (without ``force``), sha256 mismatch, unreachable index
            with no cache, something in the way of the tree, another kimi
            command running, or a patch that does not apply.
    """
    with exclusive(layout.private):
        return _sync(layout, line, from_dir, force)


def _sync(layout: Layout, line: str, from_dir: Path | None, force: bool) -> SyncState:
    pin = line_pin(layout, line)
    series = load_series(layout.patches_dir(line))
    digests = {p.name: p.digest for p in series}
    sdist_artifact = pin.artifact("sdist")
    state = _previous_state(layout, force)
    if state is not None and state.incomplete:
        say("finishing an interrupted sync")
    elif state is not None and not force:
        check_no_unrefreshed_edits(layout, state)
        if (state.line, state.sdist_sha256, state.series, state.failed) == (
            line, sdist_artifact.sha256, digests, None
        ) and layout.work.is_dir():
            say(f"up to date: vllm {pin.version} + {len(state.applied)} patches ({line})")
            return state

    sdist = obtain(sdist_artifact, layout.cache, from_dir)
    staging = layout.private / "work.new"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    say(f"unpacking {sdist.name}")
    extract_sdist(sdist, staging)
    repo = WorkRepo.create(staging, f"vllm {pin.version} (upstream sdist {sdist_artifact.sha256[:12]})")

    applied, absorbed, failure = [], [], None
    for patch in series:
        failure = repo.apply(patch)
        if failure is None:
            applied.append(patch.name)
            continue
        if repo.contains(patch):
            absorbed.append(patch.name)
            say(f"{patch.name}: absorbed - vllm {pin.version} already contains this change; "
                 "remove the patch from the series")
            failure = None
            continue
        break
    say(f"applied {len(applied)} of {len(series)} patches" + (f", {len(absorbed)} absorbed" if absorbed else ""))

    upstream_files = repo.tracked_files()
    kept = ours(layout.root, upstream_files)
    files = [rel for rel in upstream_files if rel.split("/", 1)[0] not in kept]
    laid_digests = {rel: sha256_file(staging / rel) for rel in files}
    previous = state.manifest if state is not None else {}
    new_state = SyncState(
        line=line, version=pin.version, sdist_sha256=sdist_artifact.sha256,
        series={name: digests[name] for name in applied + absorbed}, applied=applied, absorbed=absorbed,
        failed=None if failure is None else {
            "patch": failure.patch, "file": failure.file, "hunk": failure.hunk, "detail": failure.detail},
        manifest={**previous, **laid_digests}, kept_ours=sorted({r.split("/", 1)[0] for r in upstream_files} & kept),
        incomplete=True,
    )
    shutil.rmtree(layout.work, ignore_errors=True)
    staging.rename(layout.work)
    new_state.save(layout.state_file)
    lay(layout.work, files, layout.root, kept, previous, laid_digests, overwrite=force)
    new_state.manifest, new_state.incomplete = laid_digests, False
    new_state.save(layout.state_file)
    say(f"laid {len(files)} files at {layout.root} (kept ours: {', '.join(new_state.kept_ours) or 'none'})")
    _warn_unignored(layout.root, laid_digests)
    if failure is not None:
        good = " + ".join([f"vllm {pin.version}", *applied])
        patch_file = layout.patches_dir(line) / f"{failure.patch}.patch"
        raise KimiError(
            f"{failure.describe()}\n"
            f"  the tree is left at the last good state: {good}\n"
            f"  to resume: fix {patch_file} and run `kimi sync`, or make its change in the tree by hand "
            f"and run `kimi refresh --into {failure.patch}`\n"
            f"  to reset: restore the patch (`git checkout -- {patch_file.relative_to(layout.root)}`) "
            "and run `kimi sync`"
        )
    return new_state


def _warn_unignored(root: Path, manifest: dict[str, str]) -> None:
    """Warn about laid top-level names that git would show as untracked (``.gitignore`` lacks them)."""
    tops = sorted({rel.split("/", 1)[0] for rel in manifest})
    proc = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", *tops],
                          capture_output=True, text=True)
    shown = [line[3:] for line in proc.stdout.splitlines()]
    if shown:
        say("warning: laid paths not ignored by .gitignore (add them): " + ", ".join(shown[:10]))
