"""Environments of `kimi setup` / `kimi test`: a line other than the default gets its own checkout."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import Fork
from kimi.devenv import (
    TOOLS,
    _build_requirements,
    _install_key,
    install_needed,
    line_layout,
    marker_text,
)
from kimi.errors import KimiError
from kimi.fork.layout import DEFAULT_LINE, Layout
from kimi.fork.state import SyncState


@pytest.fixture
def two_lines(fork: Fork) -> Layout:
    """The synthetic fork with a second line ``origin`` pinned like the mainline."""
    origin = fork.root / "kimi" / "lines" / "origin"
    (origin / "patches").mkdir(parents=True)
    shutil.copy2(fork.pin_path, origin / "pin.json")
    (fork.root / "tests").mkdir()
    (fork.root / "tests" / "test_a.py").write_text("def test_a():\n    pass\n")
    fork.commit("origin line")
    return Layout(root=fork.root, cache=fork.cache)


def test_default_line_stays_at_the_root(two_lines: Layout) -> None:
    assert line_layout(two_lines, "mainline") == two_lines
    with pytest.raises(KimiError, match="unknown line 'nope'"):
        line_layout(two_lines, "nope")


def test_other_line_gets_a_checkout_of_the_fork_files_refreshed_each_time(two_lines: Layout) -> None:
    env = line_layout(two_lines, "origin")
    assert env.root == two_lines.root / ".kimi" / "envs" / "origin" and env.cache == two_lines.cache
    assert (env.root / "kimi" / "lines" / "origin" / "pin.json").is_file()
    assert (env.root / "tests" / "test_a.py").is_file()
    tracked = subprocess.run(["git", "-C", str(env.root), "ls-files"], capture_output=True, text=True).stdout
    assert "tests/test_a.py" in tracked and "kimi/devenv.py" in tracked  # sync tells ours from upstream's by git
    (env.root / "vllm").mkdir()
    (env.root / "vllm" / "laid.py").write_text("# laid tree\n")
    (two_lines.root / "tests" / "test_a.py").unlink()
    (two_lines.root / "tests" / "test_b.py").write_text("def test_b():\n    pass\n")
    env = line_layout(two_lines, "origin")
    assert sorted(p.name for p in (env.root / "tests").iterdir()) == ["test_b.py"]
    assert (env.root / "vllm" / "laid.py").is_file()  # the laid tree is kept


def test_a_line_s_own_checkout_defaults_to_that_line(two_lines: Layout) -> None:
    """Commands run in ``.kimi/envs/L/`` take L where they are given no ``--line``: a ``kimi demo`` or ``kimi setup``
    that L's tests start there lays L.  (2026-12-07: the first whole ``kimi test --line v0.32`` run had its demo and
    training tests lay the mainline's 0.34.0 over ``.kimi/envs/v0.32``, and the tests after them failed.)"""
    origin = line_layout(two_lines, "origin")
    assert origin.own_line == "origin"
    assert line_layout(origin, "origin") == origin  # not a checkout of its own inside it
    assert two_lines.own_line == DEFAULT_LINE
    stray = Layout(root=two_lines.root / ".kimi" / "envs" / "nope", cache=two_lines.cache)
    assert stray.own_line == DEFAULT_LINE  # a folder there that is no line's


def test_install_key_names_the_checkout(tmp_path: Path) -> None:
    """A venv shared through --venv between two checkouts of one state must be reinstalled: its
    editable install points at the other checkout."""
    state = SyncState(line="origin", version="1.0.0", sdist_sha256="ab" * 32, series={"0001-x": "cd" * 32})
    keys = []
    for name in ("a", "b"):
        layout = Layout(root=tmp_path / name, cache=tmp_path / "cache")
        layout.private.mkdir(parents=True)
        state.save(layout.state_file)
        keys.append(_install_key(layout, "cpu"))
    assert keys[0] != keys[1]
    layout.state_file.write_text("{")
    with pytest.raises(KimiError, match="state"):
        _install_key(layout, "cpu")
    layout.state_file.unlink()
    with pytest.raises(KimiError, match="kimi sync"):
        _install_key(layout, "cpu")


def test_build_requirements_under_each_release_layout(tmp_path: Path) -> None:
    layout = Layout(root=tmp_path, cache=tmp_path / "cache")
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "cpu-build.txt").write_text("torch==2.10.0\n")  # 0.16 - 0.18
    assert _build_requirements(layout, "cpu") == tmp_path / "requirements" / "cpu-build.txt"
    (tmp_path / "requirements" / "build").mkdir()
    (tmp_path / "requirements" / "build" / "cpu.txt").write_text("torch==2.11.0\n")  # 0.2x
    assert _build_requirements(layout, "cpu") == tmp_path / "requirements" / "build" / "cpu.txt"
    with pytest.raises(KimiError, match="no build requirements for cuda"):
        _build_requirements(layout, "cuda")


def test_torch_kernels_take_the_cpu_build_list_without_its_torch(tmp_path: Path) -> None:
    """0.34.0's list pins torch==2.14.0+cpu, which the index lacks; torch mode installs the pin's torch beside."""
    layout = Layout(root=tmp_path, cache=tmp_path / "cache")
    (tmp_path / "requirements" / "build").mkdir(parents=True)
    (tmp_path / "requirements" / "build" / "cpu.txt").write_text(
        'cmake>=3.26.1\ntorch==2.14.0+cpu; platform_machine == "x86_64"\n  torch==2.14.0; sys_platform == "darwin"\n'
        "torchvision-extra\nwheel\n")
    kept = _build_requirements(layout, "torch").read_text().splitlines()
    assert kept == ["cmake>=3.26.1", "torchvision-extra", "wheel"]


@pytest.mark.parametrize(("artifacts", "driver", "want"), [
    ({"sdist", "cuda_wheel", "cpu_wheel"}, False, "cpu"), ({"sdist", "cuda_wheel"}, False, "torch"),
    ({"sdist", "cuda_wheel"}, True, "cuda"),
])
def test_auto_kernels_by_driver_and_pinned_wheels(monkeypatch, artifacts, driver, want) -> None:
    from types import SimpleNamespace

    import kimi.fork.kernels_mode as build

    monkeypatch.setattr(build, "cuda_present", lambda: driver)
    monkeypatch.delenv("KIMI_KERNELS", raising=False)
    assert build.kernels_mode("auto", SimpleNamespace(artifacts=dict.fromkeys(artifacts))) == want
    assert build.kernels_mode("torch", SimpleNamespace(artifacts=dict.fromkeys(artifacts))) == "torch"


def test_install_marker_asks_for_the_tools_alone_in_an_older_venv() -> None:
    """A venv installed by a kimi without TOOLS (marker: the key alone) gets the tools, not a reinstall."""
    key = "ab" * 32
    assert "matplotlib" in TOOLS
    assert install_needed(None, key) == "all"
    assert install_needed("cd" * 32 + "\n", key) == "all"
    assert install_needed(key + "\n", key) == "tools"
    assert install_needed(key + "\ntools: pytest\n", key) == "tools"
    assert install_needed(marker_text(key), key) is None


def test_fast_runs_the_tests_that_need_no_install_with_this_python(fork: Fork) -> None:
    """`kimi test --fast`: no setup step, this interpreter, tests marked install/line/gpu/build left out."""
    (fork.root / "pytest.ini").write_text("[pytest]\nmarkers =\n    install\n    gpu\n    build\n    line(name)\n")
    tests = fork.root / "tests"
    tests.mkdir()
    (tests / "test_a.py").write_text(
        "import pytest\n\n\ndef test_plain():\n    pass\n\n\n"
        + "".join(f"@pytest.mark.{m}\ndef test_{m.split('(')[0]}():\n    raise AssertionError('ran')\n\n\n"
                  for m in ("install", "line('origin')", "gpu", "build")))
    ran = fork.kimi("test", "--fast", "--", "-q", "-p", "no:cacheprovider")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "1 passed, 4 deselected" in ran.stdout
    assert not (fork.root / ".venv").exists()  # no setup step
    (tests / "test_a.py").write_text("import pytest\n\n\n@pytest.mark.install\ndef test_i():\n    pass\n")
    none = fork.kimi("test", "--fast", "--", "-p", "no:cacheprovider")
    assert none.returncode == 1 and "pytest collected no tests" in none.stderr


def test_torch_kernels_install_the_cpu_runtime_list_without_torch(tmp_path: Path) -> None:
    """VLLM_TARGET_DEVICE=empty reads common.txt alone; the torch-only platform serves with the CPU target's runtime
    list (numba: the N-gram drafter, Kimi-K2.5's image processor without torchvision), torch and includes left out.
    The install key follows that list, so a venv made before it changed is installed again."""
    from kimi.devenv import _torch_mode_requirements

    layout = Layout(root=tmp_path, cache=tmp_path / "cache")
    layout.private.mkdir(parents=True)
    SyncState(line="mainline", version="1.0.0", sdist_sha256="ab" * 32).save(layout.state_file)
    assert _torch_mode_requirements(layout) is None
    (tmp_path / "requirements").mkdir()
    cpu = tmp_path / "requirements" / "cpu.txt"
    cpu.write_text('-r common.txt\nnumba == 0.65.0 # N-gram\ntorch==2.14.0+cpu; platform_machine == "x86_64"\n')
    assert _torch_mode_requirements(layout).read_text().splitlines() == ["numba == 0.65.0 # N-gram"]
    before = _install_key(layout, "torch")
    assert _install_key(layout, "cpu") != before
    cpu.write_text("-r common.txt\nnumba == 0.66.0\n")
    assert _install_key(layout, "torch") != before


def test_the_suite_runs_on_one_worker_per_cpu_unless_told(monkeypatch) -> None:
    """`kimi test` spreads the suite over the CPUs (at most MAX_TEST_WORKERS), not when tests are named, when pytest's
    own -n or -p no:xdist is given, or on one CPU."""
    from kimi import devenv

    monkeypatch.setattr(devenv.os, "sched_getaffinity", lambda _pid: {0, 1})
    assert devenv.test_workers(["-q", "--durations=40"], []) == 2
    assert devenv.test_workers(["-n", "0"], []) == devenv.test_workers(["-n3"], []) == 0
    assert devenv.test_workers(["-p", "no:xdist"], []) == 0
    assert devenv.test_workers([], ["tests/test_devenv.py"]) == 0
    monkeypatch.setattr(devenv.os, "sched_getaffinity", lambda _pid: set(range(64)))
    assert devenv.test_workers([], []) == devenv.MAX_TEST_WORKERS
    monkeypatch.setattr(devenv.os, "sched_getaffinity", lambda _pid: {0})
    assert devenv.test_workers([], []) == 0


def test_files_marked_long_are_handed_out_first_in_their_own_order() -> None:
    """xdist's loadfile hands files out in collection order: the long ones first, the rest as collected."""
    import pytest

    from conftest import long_files_first

    class Item:
        def __init__(self, name: str, long: bool) -> None:
            self.name, self.long = name, long

        def get_closest_marker(self, marker: str):
            return pytest.mark.long_file if marker == "long_file" and self.long else None

    items = [Item("a::1", False), Item("b::1", True), Item("a::2", False), Item("c::1", True), Item("b::2", True)]
    long_files_first(items)
    assert [i.name for i in items] == ["b::1", "c::1", "b::2", "a::1", "a::2"]

    ini = (Path(__file__).resolve().parents[1] / "pytest.ini").read_text()
    assert "long_file:" in ini  # declared, so --strict-markers and -m long_file know it

