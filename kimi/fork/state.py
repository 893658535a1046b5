"""``.kimi/state.json``: what the last ``kimi sync`` laid at the root."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kimi.errors import KimiError
from kimi.fork.fsutil import write_json_atomic


@dataclass
class SyncState:
    """The materialized tree's provenance.

    Attributes:
        line: the line synced (``mainline``).
        version: upstream release laid.
        sdist_sha256: digest of the release's sdist.
        series: patch name -> digest of the patch file when it was applied.
        applied: names of the patches applied, in order.
        absorbed: names of patches skipped because upstream already has them.
        failed: where sync stopped (``patch``, ``file``, ``hunk``, ``detail``) or None.
        manifest: laid path -> sha256 of the laid bytes.
        kept_ours: upstream top-level names not laid because the fork tracks them.
        incomplete: True while files are being laid; a sync interrupted then
            leaves it set, and the next sync lays again without calling the
            half-laid files edits.  ``manifest`` then covers old and new files.
    """

    line: str
    version: str
    sdist_sha256: str
    series: dict[str, str] = field(default_factory=dict)
    applied: list[str] = field(default_factory=list)
    absorbed: list[str] = field(default_factory=list)
    failed: dict[str, str] | None = None
    manifest: dict[str, str] = field(default_factory=dict)
    kept_ours: list[str] = field(default_factory=list)
    incomplete: bool = False

    @classmethod
    def load(cls, path: Path) -> SyncState | None:
        """The recorded state, or None before the first sync.

        Raises:
            KimiError: the file is damaged; the message names the way out.
        """
        if not path.is_file():
            return None
        try:
            raw = json.loads(path.read_text())
            state = cls(**raw)
            shapes = {"line": str, "version": str, "sdist_sha256": str, "series": dict, "applied": list,
                      "absorbed": list, "manifest": dict, "kept_ours": list, "incomplete": bool}
            bad = [k for k, kind in shapes.items() if not isinstance(getattr(state, k), kind)]
            if bad or not (state.failed is None or isinstance(state.failed, dict)):
                raise TypeError(f"fields of the wrong type: {', '.join(bad) or 'failed'}")
        except (ValueError, TypeError, UnicodeDecodeError) as exc:
            raise KimiError(
                f"{path} is damaged ({exc}); `kimi sync --force` lays the tree again and rewrites it"
            ) from None
        return state

    @classmethod
    def laid(cls, path: Path) -> SyncState:
        """The recorded state of a laid tree.

        Raises:
            KimiError: nothing is laid yet (naming ``kimi sync``), or the file is damaged (:meth:`load`).
        """
        state = cls.load(path)
        if state is None:
            raise KimiError("nothing is laid yet: run `kimi sync`")
        return state

    def save(self, path: Path) -> None:
        write_json_atomic(path, asdict(self))
