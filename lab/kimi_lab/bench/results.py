"""Result files of the benchmarks: a JSON and a markdown file per run, each written atomically (a temporary file
renamed over the old one: a reader, or a call stopped by its time limit, never sees half a file).

Every result says how it was made: :func:`stamp` gives the command line and the date, :func:`header` opens
the markdown with them; the hardware and versions come from the run (``kimi_lab.bench.hardware``).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from kimi.fork.fsutil import write_atomic


def utc_now(fmt: str | None = None) -> str:
    """The date of a run in UTC: ISO 8601 to the second (``YYYY-MM-DDTHH:MM:SS+00:00``), or as ``fmt`` says
    (``strftime``)."""
    now = datetime.now(timezone.utc)
    return now.strftime(fmt) if fmt else now.isoformat(timespec="seconds")


def stamp(script: str, argv: list[str], python: str = "python3") -> dict[str, str]:
    """``{"command": "python3 SCRIPT ARGS...", "date": utc_now()}`` for a result (``script`` as the README
    spells it, e.g. ``benchmarks/gpu_e2e.py``)."""
    return {"command": " ".join([python, script, *argv]), "date": utc_now()}


def write_json(path: Path, obj) -> None:
    """``obj`` as indented JSON (keys in their order) with a final newline, atomically."""
    write_atomic(path, json.dumps(obj, indent=2) + "\n")


def write_lines(path: Path, lines: list[str]) -> None:
    """``lines`` joined by newlines with a final one (a markdown file), atomically."""
    write_atomic(path, "\n".join(lines) + "\n")


def header(title: str, command: str, date: str) -> list[str]:
    """The first lines of a result's markdown: ``# title``, then the command and the date as list items."""
    return [f"# {title}", "", f"- command: `{command}`", f"- date: {date}"]
