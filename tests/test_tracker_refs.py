"""No tracker reference and no dated figure in ``kimi/*.py``: code, help texts and docstrings say what the code does;
issues and measurements live in the tracker and in ``benchmarks/results/`` (linked from ``docs/``)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KIMI = ROOT / "kimi"
#: ``issue O``, ``issue 23`` (an upstream ``vllm#123`` names a public report and stays); a date ``YYYY-MM-DD``.
TRACKER_OR_DATE = re.compile(r"\b[Ii]ssue (?:[A-Z]\b|\d+)|\b20\d\d-[01]\d-[0-3]\d\b")


def tracker_refs(package: Path) -> list[str]:
    """``path:line: text`` of each line of ``package``'s Python files (patch series aside) that names a tracker issue
    or a date."""
    return [f"{path.relative_to(ROOT)}:{number}: {text.strip()}"
            for path in sorted(package.rglob("*.py")) if "lines" not in path.relative_to(package).parts[:1]
            for number, text in enumerate(path.read_text().splitlines(), 1) if TRACKER_OR_DATE.search(text)]


def test_no_tracker_reference_or_date_in_kimi() -> None:
    assert tracker_refs(KIMI) == []


def test_the_pattern() -> None:
    assert TRACKER_OR_DATE.search("gates (issue O)") and TRACKER_OR_DATE.search("see issue 23")
    assert TRACKER_OR_DATE.search("shipped before 2026-12-04")
    assert not TRACKER_OR_DATE.search("vllm#45985") and not TRACKER_OR_DATE.search("vllm issues 50170")
    assert not TRACKER_OR_DATE.search("an issue Of the day")
