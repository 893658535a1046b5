"""The ``kimi`` command line (also ``python -m kimi``): the parser built from one module per command
group (each with an ``add_commands`` hook and its ``cmd_*`` functions), and the dispatch.

Exit codes: 0 success, 1 a failure reported with its fix, 2 a usage error.
"""

from __future__ import annotations

import argparse
import signal
import sys

from kimi.cli import docs, drafter, env, fork, kernels, models, train, upstream
from kimi.errors import KimiError
from kimi.fork.layout import Layout

#: The command groups, in the order ``kimi --help`` lists their commands.
COMMAND_MODULES = (fork, env, upstream, drafter, models, kernels, train, docs)

EPILOG = """first steps on a fresh clone:
  python3 -m kimi demo       set up, vllm serve the shipped reference pair with EAGLE-3, show acceptance
  python3 -m kimi test       the test suite (sets up first if needed)
  python3 -m kimi setup      only lay vLLM, install the fork into .venv, smoke-run `vllm`

the fork's own CUDA kernels (nvcc; sm_90a Hopper, sm_100a Blackwell):
  kimi kernels build [--arch '9.0a;10.0a']    build the EAGLE-3 draft-head kernels
  kimi kernels check [--json]                 the built library and its cubins (cuobjdump)
  kimi kernels prepare [--fetch] [--from DIR] vLLM's CMake *_SRC_DIR sources into .kimi/sources; what is missing
  kimi kernels build-vllm [--subset fork|sm100|all] [--dry-run]
                                              vLLM's CUDA extensions from source, offline, jobs sized to memory

drafter training (each stage resumable; kimi train STAGE --help):
  kimi train regenerate|capture|vocab|train|export|report --work DIR --target TARGET
  kimi models train-pair     train a reference pair's drafter (models/pair is the shipped one)

onto an installed vLLM (GPU hosts):
  kimi install-into SITE_PACKAGES [--check | --uninstall]

drafters (EAGLE-3 checkpoints):
  kimi drafter inspect DIR --target TARGET [--json]
  kimi drafter convert SRC DST [--target TARGET]

developer loop (`kimi` is `python3 -m kimi`; the `kimi` script exists once .venv is active):
  kimi sync                  lay the pinned upstream release, patched, at the root
  (edit files under vllm/, csrc/, ...)
  kimi status                each patch (applied, fails, absorbed, changed, pending, removed)
                             and the edits not yet refreshed
  kimi refresh               turn the edits into patch files (--into NAME, --new SLUG)
  kimi sync --force          lay again from scratch, discarding edits not refreshed
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``kimi`` with all subcommands."""
    parser = argparse.ArgumentParser(
        prog="kimi", description="Fork tooling for EAGLE-3 on DeepSeek-V3 / Kimi-K2 targets in vLLM.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMAND_MODULES:
        module.add_commands(sub)
    return parser


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # clean up like Ctrl-C: temporary files go, nothing half-written
    try:
        return args.func(args, Layout.of())
    except KimiError as exc:
        print(f"kimi {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"kimi {args.command}: interrupted", file=sys.stderr)
        return 130
