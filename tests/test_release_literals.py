"""No release number written in ``kimi/*.py``: the lines define them (``kimi/lines/<line>/pin.json``, whose format
``kimi/fork/pin.py`` describes), and messages take the release from the line that is laid or installed
(``kimi.fork.release.upstream_release``).

A release literal is a release some line pins, or any ``vLLM X.Y.Z``. Tests may write releases.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from kimi.fork.release import upstream_release

ROOT = Path(__file__).resolve().parents[1]
KIMI = ROOT / "kimi"
#: Where releases are defined.
DEFINITIONS = (KIMI / "lines", KIMI / "fork" / "pin.py")
#: Version numbers of other packages that equal a pinned release.
OTHER_PACKAGES = ('"torchvision": "0.26.0"',)


def release_pattern(lines: Path) -> re.Pattern[str]:
    """A release some line under ``lines`` pins (not inside a longer version or a requirement), or ``vLLM X.Y.Z``."""
    pinned = sorted(json.loads(p.read_text())["version"] for p in lines.glob("*/pin.json"))
    alternatives = [rf"(?<![\w.=<>~-]){re.escape(v)}(?![\w.])" for v in pinned] + [r"\bvLLM \d+\.\d+\.\d+"]
    return re.compile("|".join(alternatives))


def release_literals(package: Path, pattern: re.Pattern[str]) -> list[str]:
    """``path:line: text`` of each line of ``package``'s Python files outside :data:`DEFINITIONS` that writes a
    release."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if any(path == d or d in path.parents for d in DEFINITIONS):
            continue
        for number, text in enumerate(path.read_text().splitlines(), 1):
            cleaned = text
            for other in OTHER_PACKAGES:
                cleaned = cleaned.replace(other, "")
            if pattern.search(cleaned):
                found.append(f"{path.relative_to(ROOT)}:{number}: {text.strip()}")
    return found


def test_no_release_literal_in_kimi() -> None:
    assert release_literals(KIMI, release_pattern(KIMI / "lines")) == []


def test_the_pattern_finds_releases_and_leaves_other_versions(tmp_path: Path) -> None:
    pattern = release_pattern(KIMI / "lines")
    assert pattern.search("vLLM 0.32.0's runner") and pattern.search('raise X(f"needs 0.34.0")')
    assert pattern.search("vLLM 9.9.9 does")
    assert not pattern.search('"multiprocess==0.70.19"') and not pattern.search("vllm-0.34.0-cp38.whl")
    assert not pattern.search("the v0.32 line") and not pattern.search("10.34.0.1")


def test_the_release_comes_from_an_installed_or_laid_line() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", upstream_release())
