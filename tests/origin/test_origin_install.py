"""The origin line's install (`python3 -m kimi test --line origin`): its vLLM (0.16.0) with the series, on CPU.

Patch 0001 (precompiled build) and 0002 (CPU torch from the package index) are what this install
needs; the mainline's CLI-help patch is not carried: with the CPU kernels the version says `cpu`,
vLLM picks its CPU platform, and `vllm --help` works without it (checked here).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT
from kimi.fork.layout import Layout
from kimi.fork.pin import load_pin

pytestmark = [pytest.mark.install, pytest.mark.line("origin")]
PIN = load_pin(ROOT / "kimi" / "lines" / "origin" / "pin.json")
BIN = Path(sys.executable).parent


def test_vllm_is_the_laid_origin_tree() -> None:
    import torch
    import vllm

    assert Path(vllm.__file__).resolve() == (ROOT / "vllm" / "__init__.py").resolve()
    assert vllm.__version__ == f"{PIN.fork_version}.cpu"
    assert torch.__version__.split("+")[0] == PIN.torch


def test_cpu_kernels_come_from_the_pinned_wheel_and_run() -> None:
    import torch
    import vllm._custom_ops  # noqa: F401  (loads vllm._C through the CPU platform)
    from vllm.platforms import current_platform

    assert current_platform.device_type == "cpu"
    wheel = Layout.of(ROOT).cache / PIN.artifact("cpu_wheel").file
    with zipfile.ZipFile(wheel) as zf:
        libs = [n for n in zf.namelist() if n.startswith("vllm/") and n.count("/") == 1 and n.endswith(".so")]
        assert "vllm/_C.abi3.so" in libs
        for lib in libs:
            assert hashlib.sha256((ROOT / lib).read_bytes()).hexdigest() == hashlib.sha256(zf.read(lib)).hexdigest()
    x = torch.randn(4, 256)
    weight = torch.rand(256) + 0.5
    out = torch.empty_like(x)
    torch.ops._C.rms_norm(out, x, weight, 1e-6)
    torch.testing.assert_close(out, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight)


def test_vllm_help_and_version_without_the_cli_patch() -> None:
    for cmd in (["vllm", "--help"], ["vllm", "serve", "--help"]):
        result = subprocess.run([str(BIN / cmd[0]), *cmd[1:]], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, (cmd, result.stderr[-2000:])
    version = subprocess.run([str(BIN / "vllm"), "--version"], capture_output=True, text=True, timeout=300)
    assert version.stdout.strip().endswith(f"{PIN.fork_version}.cpu")
