"""``kimi sync``, ``kimi status``, ``kimi refresh``: the developer loop on the laid upstream tree."""

from __future__ import annotations

import argparse
import json

from kimi.cli.options import add_force, add_from, add_json, add_line
from kimi.fork.layout import Layout


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``sync``, ``status`` and ``refresh`` to the ``kimi`` subparsers."""
    p = sub.add_parser("sync", help="lay the pinned upstream release, patched, at the repository root",
                       description="Obtain the pinned sdist (cache, --from DIR, or the package index), verify "
                                   "its sha256, lay it at the root and apply the patch series. Idempotent.")
    add_line(p, "line to lay")
    add_from(p)
    add_force(p, "lay again, discarding edits not refreshed")
    p.set_defaults(func=cmd_sync)

    p = sub.add_parser("status", help="each patch (applied, fails, absorbed, ...) and the edits not refreshed",
                       description="Report each patch of the synced line - applied, fails (with file and "
                                   "hunk), absorbed (upstream has it), changed (patch file edited since the last "
                                   "sync), pending (not applied yet), removed (gone from the series) - and the "
                                   "files edited in the laid tree but not yet refreshed into patches.")
    add_json(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("refresh", help="turn edits in the laid tree into patch files",
                       description="Fold each edited file into the patch that touches it (git rebase "
                                   "--autosquash in .kimi/work), then rewrite the patch files.")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--into", metavar="NAME", help="put every edit into this patch (name or number)")
    group.add_argument("--new", metavar="SLUG", help="put every edit into a new patch NNNN-SLUG.patch")
    p.set_defaults(func=cmd_refresh)


def cmd_sync(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi sync``: lay the line's pinned release, patched (:func:`kimi.fork.sync.sync`)."""
    from kimi.fork.sync import sync

    sync(layout, args.line, from_dir=args.from_dir, force=args.force)
    return 0


def cmd_status(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi status``: each patch's state and the edits not refreshed."""
    from kimi.fork.status import status

    result = status(layout)
    print(json.dumps(result.as_dict(), indent=2) if args.json else result.render())
    return 0


def cmd_refresh(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi refresh``: fold the laid tree's edits into patch files."""
    from kimi.fork.refresh import refresh

    refresh(layout, into=args.into, new=args.new)
    return 0
