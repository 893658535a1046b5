"""One kimi command at a time per checkout: an exclusive lock on ``.kimi/lock``."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from kimi.errors import KimiError


@contextlib.contextmanager
def exclusive(private: Path) -> Iterator[None]:
    """Hold ``private/lock`` for the duration; raise at once if another process holds it.

    Raises:
        KimiError: another kimi command (its pid is named) is working on this checkout.
    """
    private.mkdir(parents=True, exist_ok=True)
    with open(private / "lock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            raise KimiError(f"another kimi command (pid {holder}) is working on {private.parent}; "
                            "wait for it to finish") from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        try:
            yield
        finally:
            fh.seek(0)
            fh.truncate()
