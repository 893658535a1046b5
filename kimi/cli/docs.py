"""``kimi docs patches`` and ``kimi docs layers``: the generated documentation under docs/."""

from __future__ import annotations

import argparse

from kimi.cli.options import add_group, add_line
from kimi.fork.layout import Layout


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``docs`` and its subcommands to the ``kimi`` subparsers."""
    cmds = add_group(sub, "docs", "write the generated documentation (docs/)")
    p = cmds.add_parser(
        "patches", help="docs/patches.md from the patch headers of the line's series",
        description="Write docs/patches.md (docs/patches-LINE.md for a line other than the default) from the "
                    "headers of the line's patch series: each patch's subject, What, Why, Upstream, Forwarded, "
                    "Tests and the upstream lines its diff changes, and the series' total. With --check, write "
                    "nothing and exit 1 when the file is not current.")
    p.add_argument("--check", action="store_true", help="only check that the file is current (exit 1 if not)")
    add_line(p, "line whose series to describe")
    p.set_defaults(func=cmd_patches)
    p = cmds.add_parser(
        "layers", help="the layers of kimi/ and the imports between them, in docs/architecture.md",
        description="Write the generated part of docs/architecture.md: each unit of kimi/ (a top-level module or "
                    "package) with its layer, its lines and the units it imports, read from the code "
                    "(kimi/fork/layers.py), and the lines of the installed package and of its runtime part. With "
                    "--check, write nothing and exit 1 when the part is not current.")
    p.add_argument("--check", action="store_true", help="only check that the part is current (exit 1 if not)")
    p.set_defaults(func=cmd_layers)


def cmd_patches(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi docs patches [--check]``."""
    from kimi.fork import patch_docs

    if args.check:
        print(f"{patch_docs.check(layout, args.line).relative_to(layout.root)} is current")
    else:
        print(f"wrote {patch_docs.write(layout, args.line).relative_to(layout.root)}")
    return 0


def cmd_layers(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi docs layers [--check]``."""
    from kimi.fork import layer_docs

    if args.check:
        print(f"{layer_docs.check(layout).relative_to(layout.root)}: the layers are current")
    else:
        print(f"wrote the layers into {layer_docs.write(layout).relative_to(layout.root)}")
    return 0
