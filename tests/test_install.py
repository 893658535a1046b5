"""The precompiled install made by `kimi setup` / `kimi test`, checked from inside it.

The interpreter running these tests is the one `kimi test` installed the fork
into: vLLM must import from the patched tree at the root, say it is the fork,
run kernels borrowed from the pinned wheel, and answer `vllm --help`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import OWN_PIN, ROOT
from kimi.fork.checkout import fresh_copy
from kimi.fork.kernels_mode import kernels_mode
from kimi.fork.layout import Layout
from kimi.fork.pin import load_pin

pytestmark = pytest.mark.install
PIN = load_pin(OWN_PIN)
BIN = Path(sys.executable).parent


def test_vllm_is_the_patched_tree_with_the_fork_version() -> None:
    import vllm

    assert Path(vllm.__file__).resolve() == (ROOT / "vllm" / "__init__.py").resolve()
    assert vllm.__version__ == f"{PIN.fork_version}.{kernels_mode()}"
    assert vllm.__version__.startswith(f"{PIN.version}+kimi.")


@pytest.mark.skipif(kernels_mode() != "cpu", reason="the CPU wheel's kernels are used only without CUDA")
def test_cpu_kernels_come_from_the_pinned_wheel_and_run() -> None:
    import torch
    import vllm._custom_ops  # noqa: F401  (loads vllm._C through the CPU platform)
    from vllm.platforms import current_platform

    assert current_platform.device_type == "cpu"
    wheel = Layout.of(ROOT).cache / PIN.artifact("cpu_wheel").file
    with zipfile.ZipFile(wheel) as zf:
        for lib in ("vllm/_C.abi3.so", "vllm/_C_AVX512.abi3.so", "vllm/_C_AVX2.abi3.so"):
            laid = hashlib.sha256((ROOT / lib).read_bytes()).hexdigest()
            assert laid == hashlib.sha256(zf.read(lib)).hexdigest(), lib
    x = torch.randn(4, 256, dtype=torch.float32)
    weight = torch.rand(256, dtype=torch.float32) + 0.5
    out = torch.empty_like(x)
    torch.ops._C.rms_norm(out, x, weight, 1e-6)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_vllm_and_kimi_commands() -> None:
    for cmd in (["vllm", "--help"], ["vllm", "serve", "--help"], ["kimi", "--help"]):
        result = subprocess.run([str(BIN / cmd[0]), *cmd[1:]], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, (cmd, result.stderr[-2000:])
    version = subprocess.run([str(BIN / "vllm"), "--version"], capture_output=True, text=True, timeout=300)
    assert version.stdout.strip().endswith(f"{PIN.fork_version}.{kernels_mode()}")


def test_install_leaves_git_status_clean() -> None:
    laid_and_built = ["vllm", "csrc", "cmake", "CMakeLists.txt", "setup.py", "pyproject.toml", "requirements",
                      ".venv", ".kimi", "vllm.egg-info", "build"]
    status = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", *laid_and_built],
                            capture_output=True, text=True, check=True)
    assert status.stdout == ""
    assert subprocess.run(["git", "-C", str(ROOT), "ls-files", "vllm", "csrc"], capture_output=True,
                          text=True, check=True).stdout == ""


def test_fresh_clone_syncs_offline_from_the_cache(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    fresh_copy(ROOT, clone)
    env = {**os.environ, "KIMI_CACHE_DIR": str(Layout.of(ROOT).cache), "KIMI_INDEX_URL": "http://127.0.0.1:9/simple"}
    result = subprocess.run([sys.executable, "-m", "kimi", "sync"], cwd=clone, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "cached, sha256 ok" in result.stderr
    for laid in ("vllm/__init__.py", "csrc", "CMakeLists.txt", "setup.py", "pyproject.toml", "requirements"):
        assert (clone / laid).exists(), laid
    git = shutil.which("git")
    assert subprocess.run([git, "-C", str(clone), "status", "--porcelain"], capture_output=True,
                          text=True).stdout == ""
    assert subprocess.run([git, "-C", str(clone), "ls-files", "vllm", "csrc"], capture_output=True,
                          text=True).stdout == ""
