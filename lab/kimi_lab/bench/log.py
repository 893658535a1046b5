"""Progress lines of the benchmark scripts: ``NAME [HH:MM:SS] message`` on stdout, flushed (a device call
returns stdout; the lines interleave with the workers' output in the order they happen)."""

from __future__ import annotations

import time
from collections.abc import Callable


def logger(name: str) -> Callable[[str], None]:
    """A function printing ``NAME [HH:MM:SS] msg`` lines: ``logger("perf")("done")``."""

    def log(msg: str) -> None:
        print(f"{name} [{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    return log
