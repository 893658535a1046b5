"""Where the fork keeps things: the repository root, its lines, and ``.kimi/``.

Committed (ours):   ``kimi/lines/<line>/pin.json`` and ``kimi/lines/<line>/patches/``.
Git-ignored:        ``.kimi/cache/`` (downloaded releases and wheels),
                    ``.kimi/work/`` (a throw-away git repository holding the
                    upstream tree with one commit per patch),
                    ``.kimi/state.json`` (what the last sync laid at the root).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kimi.errors import KimiError

DEFAULT_LINE = "mainline"


@dataclass(frozen=True)
class Layout:
    """Paths of one fork checkout.

    Attributes:
        root: the repository root; the upstream tree is laid here.
        cache: downloaded artifacts, ``$KIMI_CACHE_DIR`` or ``.kimi/cache``.
    """

    root: Path
    cache: Path

    @classmethod
    def of(cls, root: Path | None = None) -> Layout:
        """The layout of the checkout that holds this ``kimi`` package (or ``root``)."""
        root = (root or Path(__file__).resolve().parents[2]).resolve()
        cache = os.environ.get("KIMI_CACHE_DIR")
        return cls(root=root, cache=Path(cache).resolve() if cache else root / ".kimi" / "cache")

    @property
    def own_line(self) -> str:
        """The line this checkout is for, which the commands' ``--line`` defaults to: ``NAME`` for a line's own
        checkout (:meth:`line_env` of the checkout three folders up; ``kimi/devenv.py``: a ``kimi demo`` or ``kimi
        setup`` that the line's tests start there lays NAME, not the mainline over it), else the mainline."""
        name = self.root.name
        outer = self.root.parents[2] if len(self.root.parents) > 2 else None
        own = outer is not None and Layout(outer, self.cache).line_env(name) == self.root
        return name if own and (self.lines / name / "pin.json").is_file() else DEFAULT_LINE

    def line_env(self, line: str) -> Path:
        """``.kimi/envs/<line>/``: the own checkout where ``line`` is laid and installed when this one is not for
        it (``kimi/devenv.py``)."""
        return self.private / "envs" / line

    @property
    def private(self) -> Path:
        """``.kimi/``: everything the tooling writes besides the laid tree."""
        return self.root / ".kimi"

    @property
    def work(self) -> Path:
        """The throw-away git repository: upstream commit, then one commit per patch."""
        return self.private / "work"

    @property
    def state_file(self) -> Path:
        return self.private / "state.json"

    @property
    def lines(self) -> Path:
        return self.root / "kimi" / "lines"

    def line_dir(self, line: str) -> Path:
        """``kimi/lines/<line>``; raises KimiError naming the known lines if absent."""
        path = self.lines / line
        if not (path / "pin.json").is_file():
            known = sorted(p.name for p in self.lines.iterdir() if (p / "pin.json").is_file())
            raise KimiError(
                f"unknown line {line!r}: no {path / 'pin.json'} (known lines: {', '.join(known) or 'none'})"
            )
        return path

    def patches_dir(self, line: str) -> Path:
        return self.line_dir(line) / "patches"
