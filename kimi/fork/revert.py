"""Take patches' hunks out of the laid tree for a while, then put every file back byte for byte.

``kimi rebase --probe`` runs a patch's tests without that one patch; ``kimi upstream-tests`` runs upstream's
tests on the pristine release (the whole series' ``vllm/`` hunks out).  Both run the editable install of the
laid tree, so taking hunks out of the laid files is all it takes: nothing is reinstalled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from kimi.fork import unidiff
from kimi.fork.fsutil import decode, encode
from kimi.fork.lock import exclusive
from kimi.fork.patches import Patch


def under_vllm(path: str) -> bool:
    """True for a file of the ``vllm/`` package (what the editable install imports)."""
    return path.startswith("vllm/")


@contextmanager
def reverted(root: Path, patches: list[Patch], keep: Callable[[str], bool] = under_vllm) -> Iterator[list[str]]:
    """Inside the block the laid files under ``root`` are as they were before ``patches`` (series order; undone
    last first), for the files ``keep`` accepts.  Yields the relative paths changed.  On leaving - also on an
    error or Ctrl-C - every file is back byte for byte (a file a patch created is removed meanwhile).  The
    checkout's lock is held meanwhile, so no sync, refresh or rebase sees the tree half-patched.

    Raises:
        KimiError: a patch's hunks are not in the laid tree (unrefreshed edits: `kimi status`; or sync first);
            another kimi command holds the checkout's lock.
    """
    kept: dict[Path, bytes | None] = {}
    with exclusive(root / ".kimi"):
        try:
            _undo(root, patches, keep, kept)
            yield sorted(str(p.relative_to(root)) for p in kept)
        finally:
            for path, data in kept.items():
                if data is None:
                    path.unlink(missing_ok=True)
                else:
                    path.write_bytes(data)


def _undo(root: Path, patches: list[Patch], keep: Callable[[str], bool], kept: dict[Path, bytes | None]) -> None:
    """Take ``patches``' hunks (series order; undone last first) out of the files under ``root`` that ``keep``
    accepts, recording each file's bytes before its first change in ``kept`` (None: the file did not exist)."""
    for patch in reversed(patches):
        for fd in unidiff.parse(patch.diff, where=str(patch.path)):
            if not keep(fd.path):
                continue
            path = root / fd.path
            current = path.read_bytes() if path.exists() else None
            kept.setdefault(path, current)
            text = unidiff.apply(None if current is None else decode(current), fd, reverse=True)
            if text is None:
                path.unlink()
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(encode(text))


def reverted_copy(root: Path, dest: Path, patches: list[Patch]) -> list[str]:
    """A copy of the laid ``vllm/`` package under ``root`` at ``dest/vllm`` (replaced if there; no ``__pycache__``)
    with ``patches``' ``vllm/`` hunks taken out: the release as it was before them, beside the laid tree, which is
    not touched (an engine may run from it meanwhile). Returns the relative paths changed in the copy.

    Raises:
        KimiError: a patch's hunks are not in the laid tree (unrefreshed edits: `kimi status`; or sync first).
    """
    import shutil

    target = dest / "vllm"
    if target.exists():
        shutil.rmtree(target)
    kept: dict[Path, bytes | None] = {}
    with exclusive(root / ".kimi"):  # no sync or refresh meanwhile: the copy is of one laid tree
        shutil.copytree(root / "vllm", target, ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
    _undo(dest, patches, under_vllm, kept)
    return sorted(str(p.relative_to(dest)) for p in kept)
