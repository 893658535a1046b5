"""``kimi upstream-tests`` (``kimi.fork.upstream_tests``): which upstream tests cover the series' files, their
JUnit outcomes, the pristine/patched comparison, and a run on a synthetic release whose own test the series breaks.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from conftest import UPSTREAM_FILES, Fork, make_sdist, speculative_patch
from kimi.errors import KimiError
from kimi.fork.layout import Layout
from kimi.fork.patches import Patch
from kimi.fork.upstream_tests.results import Outcome, compare, read_junit
from kimi.fork.upstream_tests.run import upstream_tests
from kimi.fork.upstream_tests.selection import module_of, select_tests, touched_modules

SPEC = "vllm/config/speculative.py"


def _patch(name: str, *files: str) -> Patch:
    diff = "".join(f"diff --git a/{f} b/{f}\n--- a/{f}\n+++ b/{f}\n" for f in files)
    return Patch(path=Path(f"{name}.patch"), header={}, diff=diff)


def test_touched_modules_are_the_series_vllm_python_files() -> None:
    series = [_patch("0001-a", "vllm/v1/sample/rejection_sampler.py", "setup.py"),
              _patch("0002-b", "vllm/v1/sample/rejection_sampler.py", "vllm/platforms/__init__.py")]
    assert touched_modules(series) == {"vllm.v1.sample.rejection_sampler": ["0001-a", "0002-b"],
                                       "vllm.platforms": ["0002-b"]}
    assert module_of("requirements/cpu.txt") is None and module_of("csrc/x.py") is None


def test_selection_by_import_or_name(tmp_path: Path) -> None:
    files = {
        "tests/v1/test_from_package.py": "from vllm.model_executor.models import deepseek_v2 as d\n",
        "tests/v1/test_import.py": "import vllm.v1.sample.rejection_sampler\n",
        "tests/v1/test_lazy.py": "def test_x():\n    from vllm.v1.sample.rejection_sampler import RejectionSampler\n",
        "tests/v1/test_mock.py": "PATCH = 'vllm.platforms.cpu.CpuPlatform.get_device_name'\n",
        "tests/v1/test_other.py": "from vllm.config import ModelConfig\nimport vllm\n",
        "tests/v1/test_broken.py": "def (:\n",
        "tests/v1/helpers.py": "import vllm.platforms.cpu\n",   # not a test file
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    touched = {m: ["p"] for m in ("vllm.model_executor.models.deepseek_v2", "vllm.v1.sample.rejection_sampler",
                                  "vllm.platforms.cpu")}
    assert select_tests(tmp_path, touched) == {
        "tests/v1/test_from_package.py": ["vllm.model_executor.models.deepseek_v2"],
        "tests/v1/test_import.py": ["vllm.v1.sample.rejection_sampler"],
        "tests/v1/test_lazy.py": ["vllm.v1.sample.rejection_sampler"],
        "tests/v1/test_mock.py": ["vllm.platforms.cpu"],
    }
    assert list(select_tests(tmp_path, touched, only=["tests/v1/test_l*.py", "tests/v1/test_mock"])) == \
        ["tests/v1/test_lazy.py", "tests/v1/test_mock.py"]


_JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.v1.test_s" name="test_ok[1]" file="tests/v1/test_s.py"/>
<testcase classname="tests.v1.test_s.TestGroup" name="test_bad" file="tests/v1/test_s.py">
  <failure message="AttributeError: no attribute 'aux_pipeline'&#10;second line">trace</failure></testcase>
<testcase classname="tests.v1.test_s" name="test_teardown" file="tests/v1/test_s.py"/>
<testcase classname="tests.v1.test_s" name="test_teardown" file="tests/v1/test_s.py">
  <error message="teardown failed">trace</error></testcase>
<testcase classname="tests.v1.test_s" name="test_gpu" file="tests/v1/test_s.py">
  <skipped message="needs CUDA"/></testcase>
</testsuite></testsuites>
"""


def test_junit_outcomes(tmp_path: Path) -> None:
    path = tmp_path / "r.xml"
    path.write_text(_JUNIT)
    assert read_junit(path, "tests/v1/test_s.py") == {
        "tests/v1/test_s.py::test_ok[1]": Outcome("passed"),
        "tests/v1/test_s.py::TestGroup::test_bad": Outcome("failed", "AttributeError: no attribute 'aux_pipeline'"),
        "tests/v1/test_s.py::test_teardown": Outcome("error", "teardown failed"),  # the worst of its two reports
        "tests/v1/test_s.py::test_gpu": Outcome("skipped"),
    }
    path.write_text("not xml")
    with pytest.raises(KimiError, match="not a JUnit XML report"):
        read_junit(path, "tests/v1/test_s.py")


def test_compare_sorts_each_test() -> None:
    passed, failed, error, skipped = Outcome("passed"), Outcome("failed", "x"), Outcome("error"), Outcome("skipped")
    pristine = {"a": passed, "b": passed, "c": failed, "d": failed, "e": passed, "f": skipped, "g": passed,
                "h": passed, "j": error}
    patched = {"a": failed, "b": error, "c": passed, "d": Outcome("failed", "x"), "e": passed, "f": passed,
               "h": skipped, "i": failed, "j": Outcome("failed", "AttributeError: Mock")}
    got = compare(pristine, patched)
    assert got.regressions == ["a", "b", "g"]           # g: missing from the patched run
    assert got.fixed == ["c"] and got.both_fail == ["d"] and got.fail_differently == ["j"]
    assert got.changed == ["f", "h", "i"] and got.same == 1


_UPSTREAM_TEST = """
import importlib.util
from pathlib import Path

TEXT = Path(importlib.util.find_spec("vllm.config.speculative").origin).read_text()


def test_line_10_as_upstream_has_it():
    assert "line 10\\n" in TEXT


def test_line_20():
    assert "line 20\\n" in TEXT


def test_wants_line_30_patched():
    assert "line 30 patched" in TEXT


def test_fails_either_way():
    assert TEXT.count("patched") == 5
"""


_HANGS = """
import time

NAMED = "vllm.config.speculative"


def test_hangs():
    time.sleep(60)
"""


def test_patched_against_pristine_on_a_synthetic_release(fork: Fork, monkeypatch: pytest.MonkeyPatch) -> None:
    """The release's own test of line 10 passes pristine and fails patched (a regression, blamed on the patches that
    change the module); the test of line 30 is fixed by the series; the laid tree is back afterwards.  A file that
    hangs past --timeout is one error per run; edits not refreshed are refused."""
    files = {**UPSTREAM_FILES, "tests/config/test_speculative.py": _UPSTREAM_TEST,
             "tests/config/test_unrelated.py": "def test_y():\n    pass\n", "tests/config/test_hangs.py": _HANGS}
    _, sha = make_sdist(fork.from_dir, files=files)
    fork.write_pin(sha)
    fork.add_patch(*speculative_patch(1, 10, "line 10 patched"))
    fork.add_patch(*speculative_patch(2, 30, "line 30 patched"))
    fork.commit("two patches, upstream tests")
    assert fork.sync().returncode == 0
    laid = (fork.root / SPEC).read_bytes()
    monkeypatch.setenv("PYTHONPATH", str(fork.root))
    layout = Layout(root=fork.root, cache=fork.cache)  # the sync left the sdist in the cache
    with pytest.raises(KimiError, match="no upstream test of vllm 9.9.0 .* matches tests/nowhere"):
        upstream_tests(layout, Path(sys.executable), only=["tests/nowhere"])
    summary = upstream_tests(layout, Path(sys.executable), only=["tests/config/test_speculative.py"])
    assert (fork.root / SPEC).read_bytes() == laid
    test = "tests/config/test_speculative.py::test_line_10_as_upstream_has_it"
    assert [r["test"] for r in summary["regressions"]] == [test]
    assert summary["regressions"][0]["patches"] == ["0001-change-line-10", "0002-change-line-30"]
    assert (summary["files"], summary["tests"], summary["fixed"], summary["same"]) == (1, 4, 1, 1)
    assert [(g["tests"], g["example"], g["patches"]) for g in summary["fail_differently"]] == \
        [(1, "tests/config/test_speculative.py::test_fails_either_way", ["0001-change-line-10", "0002-change-line-30"])]
    assert "assert 0 == 5" in summary["fail_differently"][0]["pristine"]
    assert "assert 2 == 5" in summary["fail_differently"][0]["patched"]
    report = json.loads((fork.root / ".kimi" / "upstream-tests" / "report.json").read_text())
    assert report["outcomes"]["pristine"][test] == {"outcome": "passed", "message": ""}
    assert report["outcomes"]["patched"][test]["outcome"] == "failed"
    md = (fork.root / ".kimi" / "upstream-tests" / "report.md").read_text()
    assert "**1 regressions**" in md and f"| `{test}` | failed |" in md
    assert "1 failing in both differently" in md
    hung = upstream_tests(layout, Path(sys.executable), only=["tests/config/test_hangs.py"], timeout=3)
    assert (hung["tests"], hung["both_fail"], hung["regressions"]) == (1, 1, [])  # one error per run, alike
    assert "stopped after 3 s" in (fork.root / ".kimi" / "upstream-tests" / "report.md").read_text()
    (fork.root / SPEC).write_text("edited\n")
    with pytest.raises(KimiError, match="edits that are not in the patch series"):
        upstream_tests(layout, Path(sys.executable), only=["tests/config/test_speculative.py"])


def test_cli_lists_the_choice(fork: Fork) -> None:
    files = {**UPSTREAM_FILES, "tests/config/test_speculative.py": _UPSTREAM_TEST}
    _, sha = make_sdist(fork.from_dir, files=files)
    fork.write_pin(sha)
    fork.add_patch(*speculative_patch(1, 10, "line 10 patched"))
    fork.commit("one patch")
    assert fork.sync().returncode == 0
    listed = fork.kimi("upstream-tests", "--list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout == "tests/config/test_speculative.py: vllm.config.speculative\n"
    bad = fork.kimi("upstream-tests", "--timeout", "0")
    assert bad.returncode == 2 and "must be a positive integer" in bad.stderr


def test_a_library_the_venv_lacks_is_stood_in_so_modules_importing_it_load(tmp_path: Path) -> None:
    """Upstream's PP aux-states tests import vLLM's MiniMax-M3 processor, which imports torchvision at load; without
    the stand-in both runs were collection errors ("No module named 'torchvision'")."""
    import subprocess

    from kimi.fork.upstream_tests import standins

    module = tmp_path / "uses_vision.py"
    module.write_text("from torchvision.transforms import InterpolationMode\n"
                      "import torchvision.transforms.functional as F\n"
                      "RESAMPLE = InterpolationMode.BICUBIC\n")
    fake_python = tmp_path / "python"
    fake_python.write_text(f"#!/bin/sh\nexec {sys.executable} -S -c 'import sys; sys.exit(1)'\n")
    fake_python.chmod(0o755)
    assert standins.needed(fake_python) == ["torchvision"], "an interpreter that cannot import it needs it"
    env = {"PYTHONPATH": f"{standins.FOLDER}{os.pathsep}{tmp_path}", "PATH": os.environ["PATH"]}
    loaded = subprocess.run([sys.executable, "-c", "import uses_vision; print(uses_vision.RESAMPLE.__name__)"],
                            env=env, capture_output=True, text=True)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "InterpolationMode.BICUBIC", loaded.stderr
