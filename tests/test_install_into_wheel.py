"""``kimi install-into`` on the Python files of the pinned upstream CUDA wheel (what the GPU host installs).

Uses the wheel from the download cache (``.kimi/cache`` or ``KIMI_CACHE_DIR``,
where ``kimi setup --kernels cuda`` or the tests of the CUDA install put it);
without it the test is skipped unless KIMI_HEAVY=1, which downloads it (304 MB).
Only ``*.py`` files and the dist-info are unpacked (~40 MB): that is all the
series touches.
"""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT
from kimi.fork import unidiff
from kimi.fork.artifacts import obtain
from kimi.fork.layout import Layout
from kimi.fork.patches import load_series
from kimi.fork.pin import load_pin

LINE = ROOT / "kimi" / "lines" / "mainline"


@pytest.fixture(scope="module")
def wheel() -> Path:
    pin = load_pin(LINE / "pin.json")
    artifact = pin.artifact("cuda_wheel")
    cache = Layout.of(ROOT).cache
    if not (cache / artifact.file).is_file() and os.environ.get("KIMI_HEAVY") != "1":
        pytest.skip(f"{artifact.file} is not in {cache}; set KIMI_HEAVY=1 to download it (304 MB)")
    return obtain(artifact, cache, quiet=True)


def _unpack_python_files(wheel: Path, site: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(".py") or ".dist-info/" in n]
        zf.extractall(site, members=names)
        return {n: zf.read(n) for n in names}


def _kimi(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kimi", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_the_mainline_series_goes_onto_the_installed_cuda_wheel(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    release = _unpack_python_files(wheel, site)
    pin = load_pin(LINE / "pin.json")

    result = _kimi("install-into", str(site))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(not installed)" in result.stdout
    for build_file in ("setup.py", "pyproject.toml", "requirements/cpu.txt"):
        assert build_file in result.stdout  # named as skipped
    read = "import runpy, sys; print(runpy.run_path(sys.argv[1])['__version__'])"
    version = subprocess.run([sys.executable, "-c", read, str(site / "vllm/_version.py")],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version == f"{pin.fork_version}.cuda"

    changed = set()
    for patch in load_series(LINE / "patches"):
        for fd in unidiff.parse(patch.diff):
            if not fd.path.startswith("vllm/"):
                continue
            changed.add(fd.path)
            text = (site / fd.path).read_text()
            for hunk in fd.hunks:
                assert "".join(hunk.new) in text, f"{patch.name}: {fd.path} {hunk.header} not in the installed file"
            py_compile.compile(str(site / fd.path), cfile=str(tmp_path / "c.pyc"), doraise=True)
    assert changed, "the series changes no installed file"
    for rel, data in release.items():
        if rel not in changed and rel != "vllm/_version.py":
            assert (site / rel).read_bytes() == data, f"{rel} changed but no patch touches it"
    assert (site / "kimi" / "hooks" / "eagle3_drafter_checks.py").is_file()  # patch 0004 imports it

    again = _kimi("install-into", str(site))
    assert again.returncode == 0 and "nothing to do" in again.stderr
    assert _kimi("install-into", str(site), "--check").returncode == 0

    assert _kimi("install-into", str(site), "--uninstall").returncode == 0
    assert all((site / rel).read_bytes() == data for rel, data in release.items())
    assert not (site / "kimi").exists() and not (site / ".kimi-fork").exists()
