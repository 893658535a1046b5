"""Progress and warning lines of the fork tooling: ``kimi: ...`` (or ``kimi COMMAND: ...``) on stderr.

Stdout stays for what a command reports (``--json`` output, tables); these
lines go to stderr, flushed at once so that they interleave with the output
of the subprocesses a command runs.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable


def say(msg: str, command: str | None = None) -> None:
    """Print ``kimi: MSG`` (``kimi COMMAND: MSG`` with ``command``) on stderr, flushed."""
    prefix = f"kimi {command}" if command else "kimi"
    print(f"{prefix}: {msg}", file=sys.stderr, flush=True)


def sayer(command: str) -> Callable[[str], None]:
    """:func:`say` for one command's lines: ``sayer("demo")("ready")`` prints ``kimi demo: ready``."""
    return functools.partial(say, command=command)
