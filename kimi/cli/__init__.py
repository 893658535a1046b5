"""The ``kimi`` command line (also ``python -m kimi``): the parser built from one module per command
group (each with an ``add_commands`` hook and its ``cmd_*`` functions), and the dispatch.

Exit codes: 0 success, 1 a failure reported with its fix, 2 a usage error (a command run by an interpreter without
the fork's environment's packages, torch or safetensors for one, is one: :func:`outside_env`).
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
  kimi upstream-tests        upstream's own tests for the series' files, pristine against patched
                             (--list, --only GLOB ...)
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


def outside_env(module: str, layout: Layout) -> str:
    """The one-line error for a command that needs ``module`` (a package ``kimi setup`` installs into the fork's
    environment) run by an interpreter without it: where the environment is, how to make it and to enter it."""
    venv = layout.root / ".venv"
    return (f"{sys.executable} cannot import {module}, which this command needs: run it in the fork's environment "
            f"{venv} (`python3 -m kimi setup` makes it, `source {venv}/bin/activate` enters it)")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # clean up like Ctrl-C: temporary files go, nothing half-written
    layout = Layout.of()
    try:
        return args.func(args, layout)
    except KimiError as exc:
        print(f"kimi {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:
        module = (exc.name or "").partition(".")[0]
        if module in ("", "kimi"):  # not a package of the environment: a bug, shown as one
            raise
        print(f"kimi {args.command}: error: {outside_env(module, layout)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"kimi {args.command}: interrupted", file=sys.stderr)
        return 130
