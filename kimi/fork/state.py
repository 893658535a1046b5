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

    @classmethod
    def load(cls, path: Path) -> SyncState | None:
        """The recorded state, or None before the first sync."""
        if not path.is_file():
            return None
        try:
            return cls(**json.loads(path.read_text()))
        except (json.JSONDecodeError, TypeError) as exc:
            raise KimiError(f"{path} is damaged ({exc}); run `kimi sync --force` to lay the tree again") from None

    def save(self, path: Path) -> None:
        write_json_atomic(path, asdict(self))
