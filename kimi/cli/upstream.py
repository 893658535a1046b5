"""``kimi rebase``, ``kimi upstream-tests`` and ``kimi install-into``: the fork against other upstream releases,
upstream's own tests and installs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kimi.cli.options import add_force, add_from, add_json, add_line, positive_int
from kimi.fork.layout import Layout

REBASE_USAGE = ("kimi rebase: error: give --to X.Y.Z [--dry-run] [--from DIR] [--ports DIR], --continue, --abort "
                "or --probe [PATCH ...]")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``rebase``, ``upstream-tests`` and ``install-into`` to the ``kimi`` subparsers."""
    p = sub.add_parser(
        "rebase", help="move the synced line to a new upstream release (three-way merges)",
        description="Import upstream release X.Y.Z and replay the patch series on it with git cherry-pick "
                    "(three-way merges). Patches upstream already contains are dropped; a conflict stops the "
                    "rebase with a report and markers in .kimi/rebase/repo (--continue / --abort). At the end the "
                    "pin and the patch files are rewritten; run `kimi sync` to lay the new release. A conflict "
                    "resolved by hand is kept in kimi/lines/LINE/ports/X.Y.Z/ and replayed by the next rebase onto "
                    "X.Y.Z. After `kimi setup` of the new release, --probe runs each patch's tests without the patch "
                    "and names the candidates for absorption. Patches that change files the new release deleted, and "
                    "(after --probe) patches whose tests pass without them, are listed in the report as candidates "
                    "for dropping, with the reason; the last `kimi upstream-tests` comparison is part of the report. "
                    "Reports: .kimi/rebase/report.md and report.json (probe.md, probe.json).")
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
        "upstream-tests", help="upstream's own tests for the files the series changes, pristine against patched",
        description="Run the tests of the line's release (from its sdist) that import or name a vllm/ module the "
                    "patch series changes, each file in its own pytest, on the laid, installed tree as it is "
                    "(patched) and with the series' vllm/ hunks taken out (pristine; the files are put back "
                    "afterwards), and compare per test: a test that passes pristine and fails patched is a "
                    "regression. Report: .kimi/upstream-tests/report.md and report.json; the summary also goes into "
                    "the line's last rebase report and into the probe report of the same release.")
    add_line(p, "line whose laid, installed tree to test")
    p.add_argument("--only", nargs="+", metavar="GLOB", default=None,
                   help="run only the chosen test files matching these globs or path prefixes (tests/v1/sample/...)")
    p.add_argument("--list", dest="list_only", action="store_true",
                   help="print the chosen test files and the modules of the series each names; run nothing")
    p.add_argument("--timeout", type=positive_int, default=600, metavar="S",
                   help="seconds one test file may run before it counts as an error (default: %(default)s)")
    add_json(p, "print the summary (with --list: the choice) as JSON")
    add_from(p, "folder holding the pinned sdist (upstream's tests come from it), for sites without a package index")
    p.set_defaults(func=cmd_upstream_tests)

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


def cmd_upstream_tests(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi upstream-tests``: exit 0 when no test passes pristine and fails patched, 1 when one does."""
    from kimi.devenv import installed_python, line_layout
    from kimi.fork.upstream_tests.run import upstream_tests

    layout = line_layout(layout, args.line)
    python = None if args.list_only else installed_python(layout)
    result = upstream_tests(layout, python, args.only, args.timeout, args.list_only, args.from_dir)
    if args.json:
        print(json.dumps(result, indent=2))
    elif args.list_only:
        for test_file, modules in result["selected"].items():
            print(f"{test_file}: {', '.join(modules)}")
    else:
        for r in result["regressions"]:
            print(f"regression: {r['test']} ({r['patched']}: {r['message']}; patches: {', '.join(r['patches'])})")
        print(f"{result['tests']} tests in {result['files']} files: {len(result['regressions'])} regressions, "
              f"{result['fixed']} fixed, {sum(g['tests'] for g in result['fail_differently'])} failing in both "
              f"differently, {result['both_fail']} alike; report: {result['report']}")
    return 1 if result.get("regressions") else 0


def cmd_install_into(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi install-into SITE``: its exit status (see the command's description)."""
    from kimi.fork.install_into import install_into

    return install_into(args.site, args.line, check=args.check, force=args.force, uninstall=args.uninstall,
                        layout=layout)
