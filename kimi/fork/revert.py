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
            yield sorted(str(p.relative_to(root)) for p in kept)
        finally:
            for path, data in kept.items():
                if data is None:
                    path.unlink(missing_ok=True)
                else:
                    path.write_bytes(data)
