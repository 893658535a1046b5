"""``kimi rebase --probe`` (``kimi.fork.probe``): each patch's tests with the patch and without its hunks.

A synthetic line with two patches of ``vllm/config/speculative.py``: the first one's test fails without it
(``needed``), the second one's test passes without it (upstream "fixed it its own way": ``candidate``). The
laid tree is back byte for byte afterwards, and a build-time patch is not probed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from conftest import UPSTREAM_FILES, Fork, make_sdist, patch_text, speculative_patch
from kimi.fork.layout import Layout
from kimi.fork.patches import Patch
from kimi.fork.probe import add_upstream_tests, probe, probe_tests, pytest_counts

SPEC = "vllm/config/speculative.py"

_TESTS = """
from pathlib import Path

TEXT = (Path(__file__).parents[1] / "vllm" / "config" / "speculative.py").read_text()


def test_needed():
    assert "line 10 patched" in TEXT


def test_fixed_upstream():
    assert "line 30" in TEXT  # holds with the patch ("line 30 patched") and without it
"""


def _with_check(text: str, test: str) -> str:
    return text.replace("Tests: tests/\n", f"Tests: tests/probe_t.py::{test}\n")


def _laid(fork: Fork, message: str) -> tuple[bytes, dict[str, str]]:
    """Commit the patches added with the probe's test module, sync; returns the laid file's bytes and the probe's
    pytest environment."""
    (fork.root / "tests").mkdir()
    (fork.root / "tests" / "probe_t.py").write_text(_TESTS)
    fork.commit(message)
    assert fork.sync().returncode == 0, "sync"
    return (fork.root / SPEC).read_bytes(), {**os.environ, "PYTHONPATH": str(fork.root)}


def test_probe_tells_needed_from_candidate_and_restores_the_tree(fork: Fork) -> None:
    name, text = speculative_patch(1, 10, "line 10 patched")
    fork.add_patch(name, _with_check(text, "test_needed"))
    name, text = speculative_patch(2, 30, "line 30 patched")
    fork.add_patch(name, _with_check(text, "test_fixed_upstream"))
    fork.add_patch("0003-build.patch", patch_text("0003-build", "setup.py", "print('setup')", "print('fork')", 1, []))
    laid, env = _laid(fork, "three patches")
    results = {r.name: r for r in probe(Layout.of(fork.root), Path(sys.executable), env)}
    assert results["0001-change-line-10"].outcome == "needed"
    assert results["0001-change-line-10"].with_patch == {"passed": 1}
    assert results["0001-change-line-10"].without_patch == {"failed": 1}
    assert results["0002-change-line-30"].outcome == "candidate"
    assert results["0003-build"].outcome == "unknown" and "build-time" in results["0003-build"].note
    assert (fork.root / SPEC).read_bytes() == laid
    report = (fork.root / ".kimi" / "rebase" / "probe.md").read_text()
    assert "| 0002-change-line-30 | candidate | tests/probe_t.py::test_fixed_upstream | 1 passed | 1 passed |" in report


def test_a_patch_a_later_one_builds_on_comes_out_with_it(fork: Fork) -> None:
    """0001 changes line 10 and 0002 line 12, its hunk's context holding 0001's line: 0001's hunk does not come out
    of the laid tree alone, so the probe takes 0002 out first, runs 0001's test without both and says so; the tree is
    back byte for byte afterwards."""
    name, text = speculative_patch(1, 10, "line 10 patched")
    fork.add_patch(name, _with_check(text, "test_needed"))
    context = ["line 9", "line 10 patched", "line 11", "line 13", "line 14", "line 15"]
    fork.add_patch("0002-build-on-line-10.patch",
                   patch_text("0002-build-on-line-10", SPEC, "line 12", "line 12 patched", 12, context))
    laid, env = _laid(fork, "two patches, the second on the first's context")
    (result,) = probe(Layout.of(fork.root), Path(sys.executable), env, ["0001"])
    assert result.outcome == "needed" and result.without_patch == {"failed": 1}, result
    assert "taken out with 0002-build-on-line-10" in result.note, result
    assert (fork.root / SPEC).read_bytes() == laid


def test_the_tests_a_header_names_are_read_whatever_separates_them() -> None:
    """Semicolons and notes in parentheses (0015, 0019, 0021, 0022's headers) once made one bogus path of two, which
    pytest could not find: the probe said "no test ran"."""
    tests = ("tests/patches/test_a.py (the CPU part; the GPU one: benchmarks/x.py); "
             "tests/test_parallel.py::test_tp2[ray-2], tests/patches/test_a.py\n  benchmarks/robustness.py (lone)")
    patch = Patch(Path("0001-x.patch"), {"Tests": tests}, "")
    assert probe_tests(patch) == ["tests/patches/test_a.py", "tests/test_parallel.py::test_tp2[ray-2]"]
    checked = Patch(Path("0001-x.patch"), {"Tests": tests, "Absorbed-check": "tests/patches/test_b.py"}, "")
    assert probe_tests(checked) == ["tests/patches/test_b.py"]


def test_pytest_counts_reads_the_closing_line() -> None:
    assert pytest_counts("...\n2 failed, 3 passed, 1 skipped, 1 error in 2.1s\n") == \
        {"failed": 2, "passed": 3, "skipped": 1, "error": 1}
    assert pytest_counts("no tests ran in 0.01s") == {}


def test_probe_candidates_go_into_the_rebase_report(fork: Fork) -> None:
    """After a rebase onto 9.9.1, the sync and the probe there: the patch whose test passes without it is in the
    rebase report as a candidate, with its reason and tests."""
    name, text = speculative_patch(1, 10, "line 10 patched")
    fork.add_patch(name, _with_check(text, "test_needed"))
    name, text = speculative_patch(2, 30, "line 30 patched")
    fork.add_patch(name, _with_check(text, "test_fixed_upstream"))
    _, env = _laid(fork, "two patches")
    upstream = "".join(f"new {i}\n" for i in range(3)) + "".join(f"line {i}\n" for i in range(1, 41))
    make_sdist(fork.from_dir, "9.9.1", {**UPSTREAM_FILES, SPEC: upstream})
    moved = fork.kimi("rebase", "--to", "9.9.1", "--from", str(fork.from_dir))
    assert moved.returncode == 0, moved.stderr
    fork.commit("on 9.9.1")
    assert fork.sync().returncode == 0, "sync 9.9.1"
    probe(Layout.of(fork.root), Path(sys.executable), env)
    report = json.loads((fork.root / ".kimi" / "rebase" / "report.json").read_text())
    assert report["candidates"] == [
        {"name": "0002-change-line-30", "by": "probe",
         "reason": "its tests pass on vllm 9.9.1 without the patch: upstream fixed the bug",
         "evidence": ["tests/probe_t.py::test_fixed_upstream"]}]
    assert "| 0002-change-line-30 | probe | its tests pass on vllm 9.9.1" in \
        (fork.root / ".kimi" / "rebase" / "report.md").read_text()
    summary = {"line": "mainline", "version": "9.9.1", "written": "now", "files": 1, "tests": 1, "fixed": 0,
               "regressions": [], "fail_differently": [], "both_fail": 0, "changed": 0, "same": 1, "report": "r.md"}
    assert not add_upstream_tests(Layout.of(fork.root), "mainline", {**summary, "version": "9.9.0"})
    assert add_upstream_tests(Layout.of(fork.root), "mainline", summary)  # upstream's tests on the release probed
    said = "vLLM 9.9.1, written now (`kimi upstream-tests`; details: `r.md`): 1 test files, 1 tests; **0 regressions**"
    assert said in (fork.root / ".kimi" / "rebase" / "probe.md").read_text()
