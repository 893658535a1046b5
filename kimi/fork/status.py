"""``kimi status``: each patch's state and the edits not yet refreshed.

Patch states, from the last sync and the patch files as they are now:

* ``applied``   - applied by the last sync, file unchanged since;
* ``fails``     - the last sync stopped here (file and hunk are given);
* ``absorbed``  - upstream already contains the change (sync skipped it);
* ``changed``   - the patch file was edited after the last sync (run ``kimi sync``);
* ``pending``   - not applied: it is new, or an earlier patch failed;
* ``removed``   - applied by the last sync but no longer in the series.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kimi.errors import KimiError
from kimi.fork.layout import Layout
from kimi.fork.patches import Patch, read_patch, validate
from kimi.fork.state import SyncState
from kimi.fork.tree import detect_edits, tracked_top_level
from kimi.fork.workrepo import WorkRepo

# Names the precompiled install and pytest create at the root.
BUILD_OUTPUTS = frozenset({".venv", "vllm.egg-info", "build", ".pytest_cache", ".ruff_cache", ".deps"})


@dataclass
class PatchStatus:
    name: str
    state: str
    detail: str = ""


@dataclass
class Status:
    """Everything ``kimi status`` reports; ``as_dict`` is its ``--json`` form."""

    line: str
    version: str
    patches: list[PatchStatus] = field(default_factory=list)
    modified: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """No edits to refresh and every patch applied or absorbed."""
        unrefreshed = self.modified or self.deleted or self.added or self.notes
        return not unrefreshed and all(p.state in ("applied", "absorbed") for p in self.patches)

    def as_dict(self) -> dict:
        return {
            "line": self.line, "version": self.version, "clean": self.clean,
            "patches": [vars(p) for p in self.patches],
            "edited": {"modified": self.modified, "deleted": self.deleted, "new": self.added},
            "notes": self.notes,
        }

    def render(self) -> str:
        rows = [f"line {self.line}: vllm {self.version}", "patches:"]
        rows += [f"  {p.state:<9} {p.name}" + (f"  ({p.detail})" if p.detail else "") for p in self.patches]
        if not self.patches:
            rows.append("  (none)")
        edited = ([f"  modified {p}" for p in self.modified] + [f"  deleted  {p}" for p in self.deleted]
                  + [f"  new      {p}" for p in self.added])
        rows.append("edited, not refreshed (`kimi refresh`):" if edited else "no edits to refresh")
        return "\n".join(rows + edited + [f"note: {n}" for n in self.notes])


def status(layout: Layout) -> Status:
    """Compute the status of the laid tree.

    Raises:
        KimiError: nothing is laid yet.
    """
    state = SyncState.laid(layout.state_file)
    result = Status(line=state.line, version=state.version)
    failed = state.failed or {}
    names = []
    for path in sorted(layout.patches_dir(state.line).glob("*.patch")):
        names.append(path.stem)
        try:
            patch = read_patch(path)
            validate(patch)
            problem = ""
        except KimiError as exc:
            patch = Patch(path=path, header={}, diff="")
            problem = str(exc).split(": ", 1)[-1]
        synced = state.series.get(patch.name)
        if synced is not None and synced != patch.digest:
            entry = PatchStatus(patch.name, "changed", "edited since the last sync: run `kimi sync`")
        elif patch.name in state.absorbed:
            entry = PatchStatus(patch.name, "absorbed", f"vllm {state.version} already contains it")
        elif patch.name in state.applied:
            entry = PatchStatus(patch.name, "applied")
        elif failed.get("patch") == patch.name:
            where = ", ".join(x for x in (failed.get("file"), failed.get("hunk")) if x)
            entry = PatchStatus(patch.name, "fails", where or failed.get("detail", ""))
        else:
            reason = "an earlier patch failed" if failed else "new since the last sync: run `kimi sync`"
            entry = PatchStatus(patch.name, "pending", reason)
        if problem:
            entry.detail = "; ".join(x for x in (entry.detail, f"header: {problem}") if x)
        result.patches.append(entry)
    result.patches += [PatchStatus(n, "removed", "no longer in the series: run `kimi sync`")
                       for n in state.applied if n not in names]
    if state.incomplete:
        result.notes.append("the last sync was interrupted: run `kimi sync` to finish it")
        return result
    edits = detect_edits(layout.root, state.manifest, WorkRepo(layout.work) if layout.work.is_dir() else None)
    result.modified, result.deleted, result.added = edits.modified, edits.deleted, edits.added
    laid_tops = {rel.split("/", 1)[0] for rel in state.manifest}
    known = laid_tops | tracked_top_level(layout.root) | BUILD_OUTPUTS
    strays = sorted(p.name for p in layout.root.iterdir() if p.name not in known)
    if strays:
        result.notes.append(f"neither the fork's nor laid, and ignored by git: {', '.join(strays)} "
                            "(if they are the fork's, add them to .gitignore's list of our names)")
    return result
