"""benchmarks/gpu_call.sh, the device command: parts stashed call by call, the kit installed once complete.

The light tests use a fake kit and stop before installing. The rehearsal of the three real calls (the kit
built by benchmarks/gpu_kit.sh in .kimi/gpu-kit, installed with a Python 3.12 like the GPU host's, the fork
put on it with `kimi install-into`) runs with KIMI_HEAVY=1 when the kit and a python3.12 are there.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "gpu_call.sh"


def _call(repo: Path, tmp: Path, n: int, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "OUT": str(tmp / f"out{n}"), "KIMI_KIT_STASH": str(tmp / "stash"),
            "KIMI_SITE": str(tmp / "site"), "KIMI_UPSTREAM_SITE": str(tmp / "upstream"), "KIMI_GPU_STEPS": "install",
            **env}
    return subprocess.run(["bash", str(repo / "benchmarks" / "gpu_call.sh")], cwd=repo, env=full,
                          capture_output=True, text=True, timeout=900)


def _repo_with(tmp: Path, files: dict[str, Path]) -> Path:
    repo = tmp / "repo"
    (repo / "benchmarks").mkdir(parents=True, exist_ok=True)
    shutil.copy2(SCRIPT, repo / "benchmarks" / "gpu_call.sh")
    kit = repo / ".kimi" / "gpu-kit"
    shutil.rmtree(kit, ignore_errors=True)
    kit.mkdir(parents=True)
    for name, src in files.items():
        os.link(src, kit / name) if src.stat().st_dev == kit.stat().st_dev else shutil.copy2(src, kit / name)
    return repo


def _fake_kit(tmp: Path) -> dict[str, Path]:
    kit = tmp / "kit"
    kit.mkdir()
    parts = [b"a" * 100, b"b" * 100, b"c" * 10]
    for i, data in enumerate(parts):
        (kit / f"part{i:02d}").write_bytes(data)
    (kit / "SHA256").write_text(hashlib.sha256(b"".join(parts)).hexdigest() + "\n")
    (kit / "PARTS.sha256").write_text("".join(f"{hashlib.sha256(d).hexdigest()}  part{i:02d}\n"
                                              for i, d in enumerate(parts)))
    return {p.name: p for p in kit.iterdir()}


def test_parts_are_stashed_call_by_call_and_missing_or_corrupt_ones_named(tmp_path: Path) -> None:
    kit = _fake_kit(tmp_path)
    meta = {k: v for k, v in kit.items() if not k.startswith("part")}
    first = _call(_repo_with(tmp_path, {"part00": kit["part00"], **meta}), tmp_path, 0)
    assert first.returncode == 0, first.stderr
    assert "still needed part01 part02" in first.stdout
    assert json.loads((tmp_path / "out0" / "gpu_call.json").read_text())["steps"][0]["step"] == "stash"
    (tmp_path / "stash" / "part00").write_bytes(b"x")  # damaged in the stash
    second = _call(_repo_with(tmp_path, {"part01": kit["part01"], **meta}), tmp_path, 1)
    assert "corrupt parts removed: part00" in second.stdout and "still needed part02 part00" in second.stdout
    assert not (tmp_path / "site").exists()


@pytest.mark.skipif(os.environ.get("KIMI_HEAVY") != "1", reason="heavy: installs the real kit (~600 MB); "
                    "set KIMI_HEAVY=1 after `bash benchmarks/gpu_kit.sh`")
def test_rehearsal_of_the_three_device_calls_with_the_real_kit(tmp_path: Path) -> None:
    kit_dir = ROOT / ".kimi" / "gpu-kit"
    pyenv = sorted(Path.home().glob(".pyenv/versions/3.12*/bin/python3.12"))
    python = (pyenv[-1] if pyenv else None) or shutil.which("python3.12")
    if not (kit_dir / "SHA256").is_file() or not python:
        pytest.skip("needs .kimi/gpu-kit (bash benchmarks/gpu_kit.sh) and a python3.12")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    shutil.rmtree(clone / "kimi")
    shutil.copytree(ROOT / "kimi", clone / "kimi", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(SCRIPT, clone / "benchmarks" / "gpu_call.sh")
    meta = {n: kit_dir / n for n in ("SHA256", "PARTS.sha256") if (kit_dir / n).is_file()}
    parts = sorted(p for p in kit_dir.glob("part*"))
    for n, part in enumerate(parts):
        kit = clone / ".kimi" / "gpu-kit"
        shutil.rmtree(kit, ignore_errors=True)
        kit.mkdir(parents=True)
        for name, src in {part.name: part, **meta}.items():
            os.link(src, kit / name)
        result = _call(clone, tmp_path, n, KIMI_PYTHON=str(python))
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "vllm/_version.py says 0.26.0+kimi.1.cuda" in result.stdout, result.stdout[-3000:]
    assert (tmp_path / "site" / "kimi" / "drafter" / "serving.py").is_file()
    upstream = (tmp_path / "upstream" / "vllm" / "_version.py").read_text()  # pristine copy for perf_vs_upstream
    assert "0.26.0" in upstream and "+kimi" not in upstream
    again = _call(clone, tmp_path, 9, KIMI_PYTHON=str(python))
    assert "kit already installed" in again.stdout and "nothing to do" in again.stderr + again.stdout
    # a caller's command runs after the set-up, with the two sites exported (what perf_vs_upstream.py needs);
    # the set-up imports vllm first, which needs torch (the GPU host has it system-wide, the kit does not)
    if subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode != 0:
        pytest.skip(f"the kit installed and the upstream copy checked; the command step needs torch for {python}")
    shown = "import os; print('SITES', os.environ['KIMI_SITE'], os.environ['KIMI_UPSTREAM_SITE'])"
    full = {**os.environ, "OUT": str(tmp_path / "out10"), "KIMI_KIT_STASH": str(tmp_path / "stash"),
            "KIMI_SITE": str(tmp_path / "site"), "KIMI_UPSTREAM_SITE": str(tmp_path / "upstream"),
            "KIMI_PYTHON": str(python)}
    command = subprocess.run(["bash", "benchmarks/gpu_call.sh", str(python), "-c", shown], cwd=clone, env=full,
                             capture_output=True, text=True, timeout=900)
    assert f"SITES {tmp_path / 'site'} {tmp_path / 'upstream'}" in command.stdout, command.stdout[-3000:]
    steps = [s["step"] for s in json.loads((tmp_path / "out10" / "gpu_call.json").read_text())["steps"]]
    assert steps[-1] == "command" and "gpu_e2e" not in steps


def test_perf_two_gpus_runs_each_model_on_its_gpu_and_cpu_half(tmp_path: Path) -> None:
    """benchmarks/perf_two_gpus.sh with a fake python that records each run: the slice on GPU 1 and the second
    half of the CPUs, the pair on GPU 0 and the first half with --parallel-start, then the shallow slice on
    GPU 0 with the time left; the caller's arguments reach every run; gpu_call.sh's logs folder ends in the
    archive."""
    fake = tmp_path / "python"
    record = tmp_path / "runs.txt"
    fake.write_text(f"#!/usr/bin/env bash\necho \"$CUDA_VISIBLE_DEVICES $(taskset -pc $$ | sed 's/.*: //') $*\" "
                    f">> {record}\necho 'perf [00:00:00] fake run'\n")
    fake.chmod(0o755)
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    (out / "logs" / "kit-install.log").write_text("kit\n")
    env = {**os.environ, "R": str(out), "KIMI_PYTHON": str(fake), "KIMI_SITE": "/s", "KIMI_UPSTREAM_SITE": "/u",
           "KIMI_BUDGET_S": "500", "PERF_SCRATCH": str(tmp_path / "scratch")}
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "perf_two_gpus.sh"), "--rounds", "3"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = sorted(record.read_text().splitlines())  # the slice runs alongside: order by GPU, then kind
    cpus = int(subprocess.run(["nproc"], capture_output=True, text=True).stdout)
    half = max(1, cpus // 2)
    first, second = set(range(half)), set(range(half, cpus)) if cpus > 1 else {0}

    def pinned(line: str) -> tuple[str, set[int]]:  # (GPU, CPUs) of a recorded run; taskset -pc prints 0-3,5
        gpu, cpu_list = line.split()[:2]
        ranges = [part.split("-") for part in cpu_list.split(",")]
        return gpu, {c for r in ranges for c in range(int(r[0]), int(r[-1]) + 1)}

    pair = next(line for line in lines if "--models pair" in line)
    slice_ = next(line for line in lines if "--models kimi_slice" in line and "nospec_shallow" not in line)
    shallow = next(line for line in lines if "nospec_shallow" in line)
    assert pinned(pair) == ("0", first) and "--parallel-start" in pair
    assert pinned(slice_) == ("1", second) and "kimi_slice/check_k3" in slice_
    assert pinned(shallow) == ("0", first) and "--budget-s" in shallow
    assert all("--rounds 3" in line and "--upstream-site /u --fork-site /s" in line for line in (pair, slice_, shallow))
    assert not (out / "logs").exists()
    listed = subprocess.run(["tar", "tzf", str(out / "logs.tgz")], capture_output=True, text=True).stdout
    assert "kit-install.log" in listed
