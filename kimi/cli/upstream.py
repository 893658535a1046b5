"""``kimi rebase`` and ``kimi install-into``: the fork against other upstream releases and installs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kimi.cli.options import add_force, add_from, add_line
from kimi.fork.layout import Layout

REBASE_USAGE = ("kimi rebase: error: give --to X.Y.Z [--dry-run] [--from DIR] [--ports DIR], --continue, --abort "
                "or --probe [PATCH ...]")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``rebase`` and ``install-into`` to the ``kimi`` subparsers."""
    p = sub.add_parser(
        "rebase", help="move the synced line to a new upstream release (three-way merges)",
        description="Import upstream release X.Y.Z and replay the patch series on it with git cherry-pick "
                    "(three-way merges). Patches upstream already contains are dropped; a conflict stops the "
                    "rebase with a report and markers in .kimi/rebase/repo (--continue / --abort). At the end the "
                    "pin and the patch files are rewritten; run `kimi sync` to lay the new release. A conflict "
                    "resolved by hand is kept in kimi/lines/LINE/ports/X.Y.Z/ and replayed by the next rebase onto "
                    "X.Y.Z. After `kimi setup` of the new release, --probe runs each patch's tests without the patch "
                    "and names the candidates for absorption. Reports: .kimi/rebase/report.md and report.json "
                    "(probe.md, probe.json).")
    action = p.add_mutually_exclusive_group()
    action.add_argument("--to", metavar="X.Y.Z", help="the upstream release to move to")
    action.add_argument("--continue", dest="resume", action="store_true", help="go on after resolving a conflict")
    action.add_argument("--abort", action="store_true", help="drop the rebase in progress")
    action.add_argument("--probe", nargs="*", metavar="PATCH", default=None,
                        help="on the laid, installed line: each patch's tests with and without the patch "
                             "(all patches, or the ones named)")
    p.add_argument("--dry-run", action="store_true",
                   help="write only the report (conflicts are recorded, not stopped at)")
    add_from(p, "folder holding the new release's files, for sites without a package index")
    p.add_argument("--ports", type=Path, default=None, metavar="DIR",
                   help="kept conflict resolutions to replay (default: kimi/lines/LINE/ports/X.Y.Z where it exists)")
    p.set_defaults(func=cmd_rebase)

    p = sub.add_parser(
        "install-into", help="apply the patch series to a pip-installed vLLM of the pinned release",
        description="Put the fork onto an installed vLLM (site-packages, or a `pip install --target` folder): the "
                    "line's patches are applied to the installed vllm/ files (hunks for build-time files such as "
                    "setup.py and requirements/ are skipped and named), vllm/_version.py says the fork's version "
                    "(<release>+kimi.<n>.cuda), and the kimi package is copied beside vllm/. The release's files "
                    "are kept in SITE/.kimi-fork/ so that a second run is a no-op, a run after the series changed "
                    "updates the files, and --uninstall restores the release. Exit status of --check: 0 installed "
                    "and current, 3 not (yet) installed or outdated, 1 a patch does not apply.")
    p.add_argument("site", type=Path, help="folder holding the installed vllm/ and vllm-X.Y.Z.dist-info")
    add_line(p, "line whose series to apply")
    action = p.add_mutually_exclusive_group()
    action.add_argument("--check", "--dry-run", dest="check", action="store_true",
                        help="report what would be done and whether the fork is installed; change nothing")
    action.add_argument("--uninstall", action="store_true", help="restore the release's files, remove kimi/")
    add_force(p, "patch installed files even where they differ from the release's RECORD digests")
    p.set_defaults(func=cmd_install_into)


def cmd_rebase(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi rebase``: start (``--to``), continue or abort a rebase; exit 2 for a combination it cannot do."""
    from kimi.fork.rebase import rebase, rebase_abort, rebase_continue

    if not (args.to or args.resume or args.abort or args.probe is not None) or (
            (args.dry_run or args.from_dir or args.ports) and not args.to):
        print(REBASE_USAGE, file=sys.stderr)
        return 2
    if args.probe is not None:
        from kimi.devenv import installed_python, suite_env
        from kimi.fork.probe import probe

        results = probe(layout, installed_python(layout), suite_env(layout), args.probe)
        for r in results:
            print(f"{r.name}: {r.outcome}" + (f" ({r.note})" if r.note else ""))
        print(f"report: {layout.private / 'rebase' / 'probe.md'}")
        return 0
    if args.abort:
        rebase_abort(layout)
    elif args.resume:
        rebase_continue(layout)
    else:
        rebase(layout, args.to, dry_run=args.dry_run, from_dir=args.from_dir, ports=args.ports)
    return 0


def cmd_install_into(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi install-into SITE``: its exit status (see the command's description)."""
    from kimi.fork.install_into import install_into

    return install_into(args.site, args.line, check=args.check, force=args.force, uninstall=args.uninstall,
                        layout=layout)
