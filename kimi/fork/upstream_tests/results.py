"""Per-test outcomes of a pytest run (its JUnit XML) and the comparison of two runs, pristine and patched.

An outcome is ``passed``, ``failed``, ``error``, ``skipped`` or ``missing`` (the test did not run in that
run).  A test that passes on the pristine release and fails (or errors, or is missing) on the patched tree is a
**regression**: the fork broke what upstream's own test checks.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from kimi.errors import KimiError

BAD = ("failed", "error", "missing")
_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


@dataclass(frozen=True)
class Outcome:
    """One test's outcome and, for a failure or error, the first line of its message."""

    outcome: str
    message: str = ""


def read_junit(path: Path, test_file: str) -> dict[str, Outcome]:
    """Test id (``tests/x/test_y.py::TestC::test_z[p]``) -> outcome, from the JUnit XML pytest wrote for
    ``test_file``.  A test reported twice (a teardown error after a pass) keeps its worst outcome.

    Raises:
        KimiError: the file is not JUnit XML.
    """
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as exc:
        raise KimiError(f"{path}: not a JUnit XML report ({exc})") from None
    module = test_file.removesuffix(".py").replace("/", ".")
    found: dict[str, Outcome] = {}
    for case in root.iter("testcase"):
        classname = case.get("classname", "")
        inner = classname[len(module) + 1:] if classname.startswith(module + ".") else ""
        test_id = "::".join(p for p in (test_file, inner.replace(".", "::"), case.get("name", "")) if p)
        outcome = Outcome("passed")
        for child in case:
            kind = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(child.tag)
            if kind is not None:
                first = (child.get("message") or child.text or "").strip().splitlines()
                outcome = Outcome(kind, first[0][:300] if first and kind != "skipped" else "")
        if test_id not in found or _RANK[outcome.outcome] > _RANK[found[test_id].outcome]:
            found[test_id] = outcome
    return found


@dataclass
class Comparison:
    """Two runs side by side: ``regressions`` (pass pristine, fail patched), ``fixed`` (the reverse),
    ``fail_differently`` (fail in both with different messages: the series changed how the test fails, which hides a
    regression where the pristine run fails for a reason of its own, such as the machine), ``both_fail`` (alike),
    ``changed`` (any other difference: skipped on one side, missing from one) and ``same`` (how many tests passed
    or skipped alike)."""

    regressions: list[str] = field(default_factory=list)
    fixed: list[str] = field(default_factory=list)
    fail_differently: list[str] = field(default_factory=list)
    both_fail: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    same: int = 0


def compare(pristine: dict[str, Outcome], patched: dict[str, Outcome]) -> Comparison:
    """Sort every test of either run (see :class:`Comparison`), each list in test-id order."""
    result = Comparison()
    for test in sorted(pristine.keys() | patched.keys()):
        old, new = pristine.get(test, Outcome("missing")), patched.get(test, Outcome("missing"))
        before, after = old.outcome, new.outcome
        if before == "passed" and after in BAD:
            result.regressions.append(test)
        elif before in ("failed", "error") and after == "passed":
            result.fixed.append(test)
        elif before in BAD and after in BAD and "missing" not in (before, after):
            (result.both_fail if old.message == new.message else result.fail_differently).append(test)
        elif before == after:
            result.same += 1
        else:
            result.changed.append(test)
    return result
