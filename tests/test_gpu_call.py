"""benchmarks/gpu_call.sh, the device command, and lab/kimi_lab/gpukit.py, the kit's chunks and manifest.

The light tests build a small fake kit with kimi_lab.pack (fake wheels: a torch that imports only with the
carried NCCL on LD_LIBRARY_PATH, as torch 2.13 on the host; a vllm tree; a payload folder), carry its chunks
call by call into a copy of the repository and run gpu_call.sh with KIMI_KIT_STASH/KIMI_SITE in tmp folders:
bad chunks refused by name, the missing list, the cold-restart message, the install only once complete, the
total sha256 check. The rehearsal of the real calls (the kit built by benchmarks/gpu_kit.sh in
.kimi/gpu-kit-VERSION, installed with a Python 3.12 like the GPU host's, the fork put on it with
`kimi install-into`) runs with KIMI_HEAVY=1 when the kit and a python3.12 are there.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT
from kimi_lab.kit.base import MANIFEST, KitError, MiB
from kimi_lab.kit.plan import default_chunk_mib, tree_bytes
from kimi_lab.kit.requirements import host_broken, host_pins, host_pins_report
from kimi_lab.kit.stream import pack, rechunk
from kimi_lab.kit.wheels import (
    exact_pins,
    kit_line,
    kit_torch,
    line_requires,
    requirement_specs,
    torch_stack,
    wheel_requires,
)

SCRIPT = ROOT / "benchmarks" / "gpu_call.sh"
GPUKIT = ROOT / "lab" / "kimi_lab" / "gpukit.py"
KIT = ".kimi/gpu-kit-0.32.0"

TORCH_INIT = """\
import os
__version__ = "2.13.0+cu130"
_nccl = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "nvidia", "nccl", "lib")
if _nccl not in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
    raise ImportError("libtorch_cuda.so: undefined symbol: ncclCommResume")


class version:
    cuda = "13.0"


class cuda:
    @staticmethod
    def is_available():
        return True

    @staticmethod
    def get_device_name(i=0):
        return "NVIDIA H200"

    class nccl:
        @staticmethod
        def version():
            return (2, 29, 7)
"""


def _wheel(folder: Path, name: str, version: str, files: dict[str, str], requires: tuple[str, ...] = ()) -> Path:
    """A minimal wheel pip installs offline."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    meta = "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
        name, version, "".join(f"Requires-Dist: {r}\n" for r in requires))
    entries = {**files, f"{info}/METADATA": meta,
               f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    with zipfile.ZipFile(path, "w") as z:
        for rel, text in entries.items():
            z.writestr(rel, text)
        z.writestr(f"{info}/RECORD", "".join(f"{rel},,\n" for rel in [*entries, f"{info}/RECORD"]))
    return path


def _vllm_tree_xz(path: Path, requires: tuple[str, ...]) -> Path:
    files = {"vllm/__init__.py": "from vllm._version import __version__\n",
             "vllm/_version.py": "__version__ = '0.32.0'\n",
             "vllm-0.32.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n"
                                               + "".join(f"Requires-Dist: {r}\n" for r in requires)}
    with tarfile.open(path, "w:xz") as tar:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _fake_kit(tmp: Path, *, nccl: bool = True, chunk_bytes: int = 4096) -> Path:
    """A kit of three or more chunks in tmp/kit (the layout gpu_kit.sh writes)."""
    src = tmp / "src"
    wheels = src / "wheels"
    _wheel(wheels, "torch", "2.13.0", {"torch/__init__.py": TORCH_INIT})
    if nccl:
        _wheel(wheels, "nvidia_nccl_cu13", "2.29.7", {"nvidia/nccl/lib/libnccl.so.2": "nccl 2.29.7\n"})
    _wheel(wheels, "tinydep", "1.0", {"tinydep.py": "X = 1\n" + "# padding\n" * 600})
    _vllm_tree_xz(src / "vllm.tar.xz", ("torch==2.13.0", "tinydep>=1.0", "kimi-fake-missing>=1.0"))
    pair = src / "pair"
    pair.mkdir()
    (pair / "config.json").write_text(json.dumps({"model_type": "llama"}) + "\n")
    man = pack(tmp / "kit", chunk_bytes / MiB, [("vllm.tar.xz", src / "vllm.tar.xz"), ("wheels", wheels)],
                      [(".kimi/models/pair", pair)], {"version": "0.32.0", "torch": "2.13.0", "skip": []})
    assert len(man["chunks"]) >= 3
    return tmp / "kit"


def _repo(tmp: Path, kit: Path, carry: list[str], manifest: bool = True) -> Path:
    """tmp/repo as a device call lays it: the scripts, lab/kimi_lab/gpukit.py and kit/, the carried kit files."""
    repo = tmp / "repo"
    (repo / "benchmarks").mkdir(parents=True, exist_ok=True)
    (repo / "lab" / "kimi_lab").mkdir(parents=True, exist_ok=True)
    shutil.copy2(SCRIPT, repo / "benchmarks" / "gpu_call.sh")
    shutil.copy2(GPUKIT, repo / "lab" / "kimi_lab" / "gpukit.py")
    shutil.copy2(GPUKIT.parent / "__init__.py", repo / "lab" / "kimi_lab" / "__init__.py")
    shutil.copytree(GPUKIT.parent / "kit", repo / "lab" / "kimi_lab" / "kit", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    dest = repo / KIT
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in [*carry, *([MANIFEST] if manifest else [])]:
        shutil.copy2(kit / name, dest / name)
    return repo


def _call(repo: Path, tmp: Path, n: int, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "OUT": str(tmp / f"out{n}"), "KIMI_KIT_STASH": str(tmp / "stash"),
            "KIMI_SITE": str(tmp / "site"), "KIMI_UPSTREAM_SITE": str(tmp / "upstream"),
            "KIMI_PAYLOAD_ROOT": str(tmp / "payload"), "KIMI_PYTHON": sys.executable,
            "KIMI_KIT_PYTHON": sys.executable, "KIMI_GPU_STEPS": "kit", **env}
    full.pop("LD_LIBRARY_PATH", None)
    return subprocess.run(["bash", str(repo / "benchmarks" / "gpu_call.sh"), *args], cwd=repo, env=full,
                          capture_output=True, text=True, timeout=900)


def _names(kit: Path) -> list[str]:
    return [c["name"] for c in json.loads((kit / MANIFEST).read_text())["chunks"]]


def _steps(tmp: Path, n: int) -> list[str]:
    return [s["step"] for s in json.loads((tmp / f"out{n}" / "gpu_call.json").read_text())["steps"]]


# -- lab/kimi_lab/gpukit.py ------------------------------------------------------------------------------------------

def test_pack_writes_one_stream_cut_into_chunks_with_a_manifest(tmp_path: Path) -> None:
    kit = _fake_kit(tmp_path)
    man = json.loads((kit / MANIFEST).read_text())
    data = b"".join((kit / c["name"]).read_bytes() for c in man["chunks"])
    assert [c["name"] for c in man["chunks"]] == [f"chunk{i:02d}" for i in range(len(man["chunks"]))]
    assert all(c["size"] == man["chunk_size"] == 4096 for c in man["chunks"][:-1])
    assert 0 < man["chunks"][-1]["size"] <= 4096 and len(data) == man["total_size"]
    assert hashlib.sha256(data).hexdigest() == man["total_sha256"] and man["kit_id"] == man["total_sha256"][:16]
    assert all(hashlib.sha256((kit / c["name"]).read_bytes()).hexdigest() == c["sha256"] for c in man["chunks"])
    assert man["version"] == "0.32.0" and man["torch"] == "2.13.0" and man["payloads"] == [".kimi/models/pair"]
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
        inner = json.loads(tar.extractfile("kit.json").read())
    assert names[0] == "kit.json" and "vllm.tar.xz" in names and "payload/.kimi/models/pair/config.json" in names
    assert {"wheels/torch-2.13.0-py3-none-any.whl", "wheels/tinydep-1.0-py3-none-any.whl"} <= set(names)
    assert inner["torch"] == "2.13.0" and inner["payloads"] == [".kimi/models/pair"]
    # the same inputs make the same stream; another chunk size replaces every chunk; two wheels of one project
    # are refused
    os.utime(tmp_path / "src" / "wheels", (1, 1))
    again = pack(kit, 4096 / MiB, [("vllm.tar.xz", tmp_path / "src" / "vllm.tar.xz"),
                                                  ("wheels", tmp_path / "src" / "wheels")],
                        [(".kimi/models/pair", tmp_path / "src" / "pair")], {"version": "0.32.0", "torch": "2.13.0",
                                                                             "skip": []})
    assert again["total_sha256"] == man["total_sha256"] and again["chunks"] == man["chunks"]
    pack(kit, 3 * 4096 / MiB, [("wheels", tmp_path / "src" / "wheels")], [], {"version": "x"})
    assert sorted(p.name for p in kit.glob("chunk*")) == _names(kit)
    _wheel(tmp_path / "src" / "wheels", "torch", "2.12.0", {"torch/__init__.py": ""})
    with pytest.raises(KitError, match="two wheels of one project"):
        pack(kit, 1, [("wheels", tmp_path / "src" / "wheels")], [], {})


def test_rechunk_cuts_the_same_stream_again_and_refuses_a_broken_kit(tmp_path: Path) -> None:
    kit = _fake_kit(tmp_path)
    before = json.loads((kit / MANIFEST).read_text())
    stream = b"".join((kit / c["name"]).read_bytes() for c in before["chunks"])
    after = rechunk(kit, 3 * 4096 / MiB)
    assert after["kit_id"] == before["kit_id"] and after["chunk_size"] == 3 * 4096
    assert len(after["chunks"]) == -(-len(stream) // (3 * 4096)) < len(before["chunks"])
    assert sorted(p.name for p in kit.glob("chunk*")) == _names(kit) and not (kit / ".rechunk").exists()
    assert b"".join((kit / c["name"]).read_bytes() for c in after["chunks"]) == stream
    assert all(hashlib.sha256((kit / c["name"]).read_bytes()).hexdigest() == c["sha256"] for c in after["chunks"])
    (kit / "chunk01").write_bytes(b"x" * 10)  # a damaged chunk: nothing is replaced
    with pytest.raises(KitError, match="do not make the stream"):
        rechunk(kit, 4096 / MiB)
    assert json.loads((kit / MANIFEST).read_text())["chunks"] == after["chunks"]


def test_default_chunk_leaves_room_for_the_working_tree() -> None:
    assert default_chunk_mib(int(2.7 * MiB)) == 57
    assert default_chunk_mib(0) == 60
    with pytest.raises(KitError):
        default_chunk_mib(61 * MiB)
    assert tree_bytes(ROOT) > 0


def test_torch_stack_comes_from_the_torch_wheels_own_pins(tmp_path: Path) -> None:
    pins = ("filelock", 'triton==3.7.1; platform_system == "Linux"',
            'nvidia-nccl-cu13==2.29.7; platform_system == "Linux"', 'optree>=0.13.0; extra == "optree"')
    torch = _wheel(tmp_path, "torch", "2.13.0", {}, pins)
    assert torch_stack(torch) == ("2.13.0", ["triton==3.7.1", "nvidia-nccl-cu13==2.29.7"], [])
    other = _wheel(tmp_path / "b", "torch", "2.99.0", {}, pins)
    version, reqs, warnings = torch_stack(other)
    assert reqs == ["triton==3.7.1", "nvidia-nccl-cu13==2.29.7"] and "not tried on the GPU host" in warnings[0]
    with pytest.raises(KitError, match="pins no nvidia-nccl-cu13"):
        torch_stack(_wheel(tmp_path / "c", "torch", "2.13.0", {}, pins[:2]))
    vllm = _wheel(tmp_path, "vllm", "0.32.0", {}, ("torch==2.13.0", "torchvision==0.28.0", "regex"))
    assert exact_pins(wheel_requires(vllm)) == {"torch": "2.13.0", "torchvision": "0.28.0"}
    # torch 2.14 requires triton~=3.8.0, a range: it travels as the wheel says (the newest 3.8.x)
    ranged = _wheel(tmp_path / "d", "torch", "2.14.0", {}, (
        'triton~=3.8.0; platform_system == "Linux" and python_version < "3.15"',
        'nvidia-nccl-cu13==2.30.7; platform_system == "Linux"',
        'cuda-bindings<14,>=13.0.3; platform_system == "Linux"'))
    assert torch_stack(ranged)[1] == ["triton~=3.8.0", "nvidia-nccl-cu13==2.30.7"]
    assert requirement_specs(wheel_requires(ranged))["cuda-bindings"] == "<14,>=13.0.3"
    assert exact_pins(["torch (==2.14.0)", "triton~=3.8.0"]) == {"torch": "2.14.0"}


def test_the_kits_line_is_named_or_found_by_the_version_its_pin_names(tmp_path: Path) -> None:
    """A kit is the line whose pin names its version (that series goes on the host), else the mainline."""
    lines = tmp_path / "lines"
    for line, version, sha in (("mainline", "0.32.0", "a" * 64), ("next", "0.34.0", "b" * 64), ("v0.26", "0.26.0", "")):
        (lines / line).mkdir(parents=True)
        artifacts = {"cuda_wheel": {"file": f"vllm-{version}.whl", "sha256": sha}} if sha else {}
        (lines / line / "pin.json").write_text(json.dumps({"version": version, "torch": "2.13.0",
                                                           "artifacts": artifacts}))
    assert kit_line(lines) == ("mainline", "0.32.0", "a" * 64)
    assert kit_line(lines, version="0.34.0") == ("next", "0.34.0", "b" * 64)
    assert kit_line(lines, line="next") == ("next", "0.34.0", "b" * 64)
    assert kit_line(lines, version="0.26.0") == ("v0.26", "0.26.0", "")
    assert kit_line(lines, version="0.33.0") == ("mainline", "0.33.0", "")  # no pin: nothing to check against
    with pytest.raises(KitError, match="line next pins vLLM 0.34.0, not 0.32.0"):
        kit_line(lines, line="next", version="0.32.0")
    with pytest.raises(KitError, match="no line 'nope'"):
        kit_line(lines, line="nope")
    # a line's gpu-kit.txt: what its release needs that the shared resolver skips (0.34.0: the CuTe DSL)
    (lines / "next" / "gpu-kit.txt").write_text("# why\nnvidia-cutlass-dsl==4.8.0  # the DSL\n\nx-libs-cu13==4.8.0\n")
    assert line_requires(lines, "next") == ["nvidia-cutlass-dsl==4.8.0", "x-libs-cu13==4.8.0"]
    assert line_requires(lines, "mainline") == []
    shipped = line_requires(ROOT / "kimi" / "lines", "mainline")
    assert "nvidia-cutlass-dsl-libs-cu13==4.8.0" in shipped and not any("cu12" in r for r in shipped)


def test_a_gpu_kits_torch_is_the_cuda_wheels_not_the_lines_cpu_torch(tmp_path: Path) -> None:
    """The next line's pin says torch 2.13.0 (its CPU path); vLLM 0.34.0's CUDA wheel requires 2.14.0: the kit
    carries 2.14.0, and the pin's torch is never a GPU kit's fallback."""
    wheel = _wheel(tmp_path, "vllm", "0.34.0", {}, ("torch==2.14.0", "torchvision==0.29.0", "regex"))
    assert kit_torch(wheel) == "2.14.0" and kit_torch(wheel, "2.14.0") == "2.14.0"
    with pytest.raises(KitError, match="requires torch==2.14.0, not KIMI_KIT_TORCH=2.13.0"):
        kit_torch(wheel, "2.13.0")
    unpinned = _wheel(tmp_path / "u", "vllm", "0.99.0", {}, ("torch>=2.11", "regex"))
    with pytest.raises(KitError, match="pins no torch"):
        kit_torch(unpinned)
    assert kit_torch(unpinned, "2.14.1") == "2.14.1"
    run = subprocess.run([sys.executable, str(GPUKIT), "kit-torch", str(wheel), "--torch", ""],
                         capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "2.14.0"


def test_host_pins_carry_only_what_the_host_has_too_old(tmp_path: Path) -> None:
    pytest.importorskip("packaging")
    w = _wheel(tmp_path, "carried", "1.0", {}, ("numpy<2.4,>=1.25", "transformers>=9.0", "aiohttp>=3.14.3",
                                                 "nvidia-cudnn-cu13==9.20.0.48", "tokenizers>=0.23.2", "jax>=0.1"))
    host = {"numpy", "transformers", "aiohttp", "nvidia-cudnn-cu13", "tokenizers"}
    states = {e["name"]: e["state"] for e in host_pins([w], host, set())}
    assert states == {"numpy": "newer", "transformers": "older", "aiohttp": "unknown", "nvidia-cudnn-cu13": "older",
                      "tokenizers": "ok"}
    lines = "\n".join(host_pins_report(host_pins([w], host, set())))
    assert "host misses, carried: transformers" in lines and "host misses, reported only: nvidia-cudnn-cu13" in lines
    assert "host newer, reported only: numpy" in lines
    assert "unverified (checked on the host at install): aiohttp" in lines


def test_a_host_package_that_a_carried_wheel_breaks_travels_too(tmp_path: Path) -> None:
    """vLLM 0.34.0 wants huggingface-hub>=2.0.0, the host's transformers 5.17.0 checks at import for <2.0: the kit
    carries transformers too, as the release requires it (the newest it accepts)."""
    pytest.importorskip("packaging")
    vllm = _wheel(tmp_path, "vllm", "0.34.0", {}, ("transformers<5.23.0,>=5.16.1", "huggingface_hub>=2.0.0"))
    hub2 = _wheel(tmp_path / "a", "huggingface_hub", "2.4.0", {})
    assert host_broken(vllm, [hub2]) == ["transformers<5.23.0,>=5.16.1"]
    assert host_broken(vllm, [_wheel(tmp_path / "b", "huggingface_hub", "1.40.0", {})]) == []
    assert host_broken(vllm, [hub2, _wheel(tmp_path / "c", "transformers", "5.22.0", {})]) == []


def test_calls_helper_prints_the_device_calls_in_order(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    kit = _fake_kit(tmp_path)
    shutil.copytree(kit, repo / KIT)
    names = _names(kit)
    run = subprocess.run([sys.executable, str(GPUKIT), "calls", "--kit", KIT, "--json"],
                         cwd=repo, capture_output=True, text=True, check=True)
    calls = [json.loads(line) for line in run.stdout.splitlines()]
    assert [c["carry"] for c in calls] == [[f"{KIT}/MANIFEST.json", f"{KIT}/{n}"] for n in names]
    assert {c["command"] for c in calls} == {"bash benchmarks/gpu_call.sh"} and calls[-1]["timeout_s"] == 600
    only = subprocess.run([sys.executable, str(GPUKIT), "calls", "--kit", KIT, "--only",
                           f"{names[1]},{names[-1]}", "--last-command",
                           "KIMI_GPU_STEPS=kit bash benchmarks/gpu_call.sh"],
                          cwd=repo, capture_output=True, text=True, check=True).stdout
    assert f"{KIT}/{names[1]}" in only and f"{KIT}/{names[0]}\"" not in only and "KIMI_GPU_STEPS=kit" in only


# -- benchmarks/gpu_call.sh ------------------------------------------------------------------------------------------

def test_chunks_stashed_call_by_call_bad_ones_refused_and_install_only_when_complete(tmp_path: Path) -> None:
    kit = _fake_kit(tmp_path)
    names = _names(kit)
    site, box = tmp_path / "site", tmp_path / "stash" / json.loads((kit / MANIFEST).read_text())["kit_id"]
    first = _call(_repo(tmp_path, kit, [names[0]]), tmp_path, 0)
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"stashed {names[0]}" in first.stdout
    assert f"still missing {len(names) - 1}: {' '.join(names[1:])}" in first.stdout
    assert f"next: carry {KIT}/MANIFEST.json and {KIT}/{names[1]}" in first.stdout
    assert "RESTARTED" not in first.stdout and not site.exists() and _steps(tmp_path, 0) == ["stash"]
    report = json.loads((tmp_path / "out0" / "kit-stash.json").read_text())
    assert report["state"] == "incomplete" and report["have"] == names[:1] and report["missing"] == names[1:]

    # a chunk damaged on the way is refused by name and not stashed
    repo = _repo(tmp_path, kit, [names[1]])
    (repo / KIT / names[1]).write_bytes(b"x" + (kit / names[1]).read_bytes()[1:])
    bad = _call(repo, tmp_path, 1)
    assert bad.returncode == 2 and f"REFUSED {names[1]}" in bad.stdout and f"carry {names[1]} again" in bad.stdout
    assert not (box / names[1]).exists() and not site.exists()

    # the rest, one call each; nothing is installed before the last one
    for i, name in enumerate(names[1:-1], 2):
        r = _call(_repo(tmp_path, kit, [name]), tmp_path, i)
        assert r.returncode == 0 and not site.exists(), r.stdout + r.stderr
        assert f"still missing {len(names) - i}:" in r.stdout
    last = _call(_repo(tmp_path, kit, [names[-1]]), tmp_path, 9)
    assert last.returncode == 0, last.stdout + last.stderr
    assert "total sha256 ok" in last.stdout and "kit installed" in last.stdout
    assert "torch: 2.13.0+cu130 cuda_available=True cuda=13.0 nccl=2.29.7 device=NVIDIA_H200" in last.stdout
    assert "(the kit pins torch 2.13.0)" in last.stdout
    assert "missing  kimi-fake-missing; wanted >=1.0 (vllm)" in last.stdout  # check-reqs: a requirement nothing meets
    assert (site / "vllm" / "_version.py").is_file() and (site / "torch" / "__init__.py").is_file()
    assert (site / ".kit-sha256").read_text().strip() == json.loads((kit / MANIFEST).read_text())["total_sha256"]
    assert (tmp_path / "upstream" / "vllm" / "_version.py").is_file()
    pair = tmp_path / "repo" / ".kimi" / "models" / "pair"  # the payload, linked at its path in the repository
    assert pair.is_symlink() and json.loads((pair / "config.json").read_text())["model_type"] == "llama"
    assert not box.exists() and not (tmp_path / "site.bundle").exists()  # /tmp freed
    assert _steps(tmp_path, 9) == ["stash", "kit_unpack", "kit_install", "upstream_copy", "torch_check", "check_reqs"]

    # a later call needs no chunk; a command runs once the kit is there
    again = _call(_repo(tmp_path, kit, []), tmp_path, 10, KIMI_GPU_STEPS="all")
    assert "kit already installed" in again.stdout and "torch:" not in again.stdout
    bare = _call(_repo(tmp_path, kit, [], manifest=False), tmp_path, 11)
    assert bare.returncode == 0 and "kit already installed" in bare.stdout


def test_a_cold_machine_is_recognised_and_the_chunks_from_the_start_named(tmp_path: Path) -> None:
    kit = _fake_kit(tmp_path)
    names = _names(kit)
    cold = _call(_repo(tmp_path, kit, [names[2]]), tmp_path, 0)
    assert cold.returncode == 0, cold.stdout + cold.stderr
    assert "MACHINE RESTARTED" in cold.stdout and f"Needed again from the start: {names[0]} {names[1]}" in cold.stdout
    assert f"stashed {names[2]}" in cold.stdout  # the chunk it brought is kept
    warm = _call(_repo(tmp_path, kit, [names[0]]), tmp_path, 1)
    assert "RESTARTED" not in warm.stdout and names[2] not in warm.stdout.split("still missing")[1]
    shutil.rmtree(tmp_path / "stash")
    nothing = _call(_repo(tmp_path, kit, []), tmp_path, 2)
    assert "NOTHING STASHED" in nothing.stdout and f"from the start: {' '.join(names)}" in nothing.stdout
    none = _call(_repo(tmp_path, kit, [], manifest=False), tmp_path, 3)
    assert none.returncode == 3 and "none installed" in none.stdout
    waiting = _call(_repo(tmp_path, kit, [names[1]]), tmp_path, 4, "touch", str(tmp_path / "ran"))
    assert waiting.returncode == 3 and "kit incomplete: not running touch" in waiting.stdout
    assert not (tmp_path / "ran").exists()


def test_the_whole_streams_sha256_is_checked_before_unpacking(tmp_path: Path) -> None:
    kit = _fake_kit(tmp_path)
    names = _names(kit)
    man = json.loads((kit / MANIFEST).read_text())
    # a chunk changed in the stash after it was checked: named, removed, nothing installed
    _call(_repo(tmp_path, kit, names[:-1]), tmp_path, 0)
    box = tmp_path / "stash" / man["kit_id"]
    (box / names[0]).write_bytes(b"y" * man["chunks"][0]["size"])
    r = _call(_repo(tmp_path, kit, names[-1:]), tmp_path, 1)
    assert r.returncode == 2 and f"{names[0]} changed in the stash" in r.stdout and not (box / names[0]).exists()
    assert not (tmp_path / "site").exists()
    # a manifest whose chunks are right but whose total is not (not of one build): refused before unpacking
    man["total_sha256"] = "0" * 64
    (kit / MANIFEST).write_text(json.dumps(man))
    r = _call(_repo(tmp_path, kit, names), tmp_path, 2)
    assert r.returncode == 2 and "total sha256 check FAILED" in r.stdout and not (tmp_path / "site").exists()
    assert _steps(tmp_path, 2) == ["stash", "kit_unpack"]


def test_the_kits_torch_is_checked_and_needs_the_carried_nccl(tmp_path: Path) -> None:
    kit = _fake_kit(tmp_path, nccl=False)
    r = _call(_repo(tmp_path, kit, _names(kit)), tmp_path, 0)
    assert r.returncode == 1 and "torch check FAILED" in r.stdout and "ncclCommResume" in r.stdout
    assert _steps(tmp_path, 0)[-1] == "torch_check"


def test_a_failed_install_stops_the_call_with_pips_words(tmp_path: Path) -> None:
    kit = _fake_kit(tmp_path)
    (tmp_path / "src" / "wheels" / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    pack(kit, 4096 / MiB, [("vllm.tar.xz", tmp_path / "src" / "vllm.tar.xz"),
                                          ("wheels", tmp_path / "src" / "wheels")], [], {"torch": "2.13.0"})
    r = _call(_repo(tmp_path, kit, _names(kit)), tmp_path, 0)
    assert r.returncode != 0 and "broken-1.0" in r.stdout and _steps(tmp_path, 0)[-1] == "kit_install"
    assert not (tmp_path / "site" / ".kit-sha256").exists()


def test_the_kit_with_chunks_is_taken_when_an_older_kits_manifest_is_left(tmp_path: Path) -> None:
    kit = _fake_kit(tmp_path)
    repo = _repo(tmp_path, kit, _names(kit)[:1])
    stale = repo / ".kimi" / "gpu-kit-0.26.0"  # a warm machine keeps the ignored paths of earlier calls
    stale.mkdir()
    shutil.copy2(kit / MANIFEST, stale / MANIFEST)
    r = _call(repo, tmp_path, 0)
    assert r.returncode == 0 and f"stashed {_names(kit)[0]}" in r.stdout, r.stdout + r.stderr
    shutil.copy2(kit / _names(kit)[1], stale / _names(kit)[1])
    r = _call(repo, tmp_path, 1)
    assert r.returncode == 3 and "several kits carried" in r.stdout
    r = _call(repo, tmp_path, 2, KIMI_KIT_DIR=str(repo / KIT))
    assert r.returncode == 0 and _names(kit)[0] in r.stdout


def _recording_python(tmp: Path) -> Path:
    """A python that answers the fork's install (recording its arguments in tmp/install-into.args), the vllm import
    and the kernel build, and runs everything else with this Python."""
    fake, args = tmp / "python", tmp / "install-into.args"
    fake.write_text("#!/usr/bin/env bash\n"
                    'case "$*" in\n'
                    f"  *install-into*) echo \"$*\" > {args}; echo 'install-into: done'; exit 0 ;;\n"
                    "  *'import vllm'*) echo 0.32.0+kimi.1.cuda; exit 0 ;;\n"
                    "  *'kernels build'*) echo '{\"library\": \"\"}'; exit 0 ;;\n"
                    "esac\n"
                    f'exec {sys.executable} "$@"\n')
    fake.chmod(0o755)
    return fake


def test_the_kits_line_is_the_series_put_on_the_installed_vllm(tmp_path: Path) -> None:
    """A kit built for the next line (kit.json "line") gets `install-into --line next`; one without a line (built
    before kits named theirs) the mainline. A line without the draft-greedy patch builds no draft-head kernel."""
    src = tmp_path / "src"
    _fake_kit(tmp_path)
    kit = tmp_path / "kit-next"
    pack(kit, 4096 / MiB, [("vllm.tar.xz", src / "vllm.tar.xz"), ("wheels", src / "wheels")], [],
                {"version": "0.34.0", "line": "next", "torch": "2.13.0", "skip": []})
    env = {"KIMI_GPU_STEPS": "install", "KIMI_PYTHON": str(_recording_python(tmp_path))}
    r = _call(_repo(tmp_path, tmp_path / "kit", _names(tmp_path / "kit")), tmp_path, 0, **env)
    assert r.returncode == 0 and (tmp_path / "install-into.args").read_text().split()[-2:] == ["--line", "mainline"]
    r = _call(_repo(tmp_path, kit, _names(kit)), tmp_path, 1, **env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "install-into.args").read_text().split()[-3:] == [str(tmp_path / "site"), "--line", "next"]
    assert "putting the next line on the installed vLLM" in r.stdout
    # a checkout where the kit's line is gone (the next line became the mainline): the line pinning its version
    lines_dir = tmp_path / "repo" / "kimi" / "lines"
    (lines_dir / "mainline").mkdir(parents=True)
    (lines_dir / "mainline" / "pin.json").write_text(json.dumps({"version": "0.34.0", "torch": "2.13.0"}))
    r = _call(tmp_path / "repo", tmp_path, 3, **env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "install-into.args").read_text().split()[-2:] == ["--line", "mainline"]
    assert "the line that pins vLLM 0.34.0, mainline" in r.stdout
    shutil.rmtree(lines_dir)
    repo = _repo(tmp_path, kit, [], manifest=False)  # the next line's kit stays installed: this call runs "true"
    (repo / "kimi" / "lines" / "next" / "patches").mkdir(parents=True)
    r = _call(repo, tmp_path, 2, "true", **{**env, "KIMI_GPU_STEPS": "all"})
    assert r.returncode == 0 and "no draft-head kernel to build" in r.stdout, r.stdout + r.stderr
    assert "kernels_build_skipped" in _steps(tmp_path, 2)


def test_what_the_sites_pth_files_add_is_on_the_path(tmp_path: Path) -> None:
    """The CuTe DSL (carried for vLLM 0.34.0) puts its `cutlass` on the path through a .pth file, which Python reads
    in site directories only, not in a --target folder on PYTHONPATH: gpu_call.sh adds what the site's .pth files
    add, so `import cutlass` works in COMMAND and in the engines it starts."""
    src = tmp_path / "src"
    _fake_kit(tmp_path)
    _wheel(src / "wheels", "fakedsl", "1.0", {
        "fakedsl/__init__.py": "", "fakedsl/dsl_packages/fakecutlass.py": "OK = 'dsl on the path'\n",
        "fakedsl_packages.pth": "import sys, os, fakedsl; "
                                "sys.path.insert(0, os.path.join(fakedsl.__path__[0], 'dsl_packages'))\n"})
    kit = tmp_path / "kit-dsl"
    pack(kit, 4096 / MiB, [("vllm.tar.xz", src / "vllm.tar.xz"), ("wheels", src / "wheels")], [],
                {"version": "0.34.0", "line": "next", "torch": "2.13.0", "skip": []})
    env = {"KIMI_GPU_STEPS": "all", "KIMI_PYTHON": str(_recording_python(tmp_path))}
    r = _call(_repo(tmp_path, kit, _names(kit)), tmp_path, 0, sys.executable, "-c",
              "import fakecutlass; print(fakecutlass.OK)", **env)
    assert r.returncode == 0 and "dsl on the path" in r.stdout, r.stdout + r.stderr


def test_a_command_that_overruns_is_stopped_before_the_calls_limit(tmp_path: Path) -> None:
    """COMMAND is stopped 20 s before KIMI_CALL_LIMIT_S, child processes too, so that the device command's steps
    after gpu_call.sh still copy its results (a 600 s call that ran out inside train-pair + acceptance.py lost
    everything it had made, 2026-12-04); a command that ends in time keeps its own exit status, 124 included, and
    is not said to be stopped."""
    kit = _fake_kit(tmp_path)
    assert _call(_repo(tmp_path, kit, _names(kit)), tmp_path, 0).returncode == 0
    fake = tmp_path / "python"  # the fork's install, import and kernel build answered; the rest by this Python
    fake.write_text("#!/usr/bin/env bash\n"
                    'case "$*" in\n'
                    "  *install-into*) echo 'install-into: nothing to do'; exit 0 ;;\n"
                    "  *'import vllm'*) echo 0.32.0+kimi.1.cuda; exit 0 ;;\n"
                    "  *'kernels build'*) echo '{\"library\": \"\"}'; exit 0 ;;\n"
                    "esac\n"
                    f'exec {sys.executable} "$@"\n')
    fake.chmod(0o755)
    env = {"KIMI_GPU_STEPS": "all", "KIMI_PYTHON": str(fake), "KIMI_CALL_LIMIT_S": "30"}
    child = tmp_path / "child-still-running"
    repo = _repo(tmp_path, kit, [], manifest=False)
    r = _call(repo, tmp_path, 1, "bash", "-c", f"(sleep 20; touch {child}) & echo started; sleep 60", **env)
    assert r.returncode == 124, r.stdout + r.stderr
    assert "started" in r.stdout and "COMMAND STOPPED after" in r.stdout and "KIMI_CALL_LIMIT_S=30" in r.stdout
    report = json.loads((tmp_path / "out1" / "gpu_call.json").read_text())
    assert (report["steps"][-1]["step"], report["steps"][-1]["rc"]) == ("command", 124)
    assert report["seconds"] <= 30 - 20 + 5  # the stop (limit - 20 s) plus timeout's 5 s grace, at most
    ok = _call(repo, tmp_path, 2, "bash", "-c", "exit 7", **env)
    assert ok.returncode == 7 and "COMMAND STOPPED" not in ok.stdout
    own = _call(repo, tmp_path, 4, "bash", "-c", "exit 124", **env)  # its own 124, long before the stop
    assert own.returncode == 124 and "COMMAND STOPPED" not in own.stdout, own.stdout
    late = _call(repo, tmp_path, 3, "touch", str(tmp_path / "ran"), **{**env, "KIMI_CALL_LIMIT_S": "20"})
    assert late.returncode == 124 and "before it started" in late.stdout and not (tmp_path / "ran").exists()
    subprocess.run(["sleep", "12"], check=True)  # past the 20 s the background child would have taken
    assert not child.exists()  # the command's children were stopped with it


@pytest.mark.skipif(os.environ.get("KIMI_HEAVY") != "1", reason="heavy: installs the real kit (~1.1 GB); "
                    "set KIMI_HEAVY=1 after `bash benchmarks/gpu_kit.sh`")
def test_rehearsal_of_the_device_calls_with_the_real_kit(tmp_path: Path) -> None:
    version = json.loads((ROOT / "kimi" / "lines" / "mainline" / "pin.json").read_text())["version"]
    kit_dir = ROOT / ".kimi" / f"gpu-kit-{version}"
    pyenv = sorted(Path.home().glob(".pyenv/versions/3.12*/bin/python3.12"))
    python = (pyenv[-1] if pyenv else None) or shutil.which("python3.12")
    if not (kit_dir / MANIFEST).is_file() or not python:
        pytest.skip(f"needs {kit_dir} (bash benchmarks/gpu_kit.sh) and a python3.12")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    for tree in ("kimi", "lab"):  # the working tree's, edits not yet committed included
        shutil.rmtree(clone / tree)
        shutil.copytree(ROOT / tree, clone / tree, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(SCRIPT, clone / "benchmarks" / "gpu_call.sh")
    env = {"KIMI_PYTHON": str(python), "KIMI_GPU_STEPS": "install", "KIMI_KIT_CHECK_TORCH": "0"}
    for n, name in enumerate(_names(kit_dir)):
        kit = clone / ".kimi" / kit_dir.name
        shutil.rmtree(kit, ignore_errors=True)
        kit.mkdir(parents=True)
        for f in (MANIFEST, name):
            os.link(kit_dir / f, kit / f)
        result = _call(clone, tmp_path, n, **env)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"vllm/_version.py says {version}+kimi." in result.stdout, result.stdout[-3000:]
    assert (tmp_path / "site" / "kimi" / "__init__.py").is_file()  # install-into copies the fork beside vllm
    upstream = (tmp_path / "upstream" / "vllm" / "_version.py").read_text()  # pristine copy for perf_vs_upstream
    assert version in upstream and "+kimi" not in upstream
    again = _call(clone, tmp_path, 99, **env)
    assert "kit already installed" in again.stdout and "nothing to do" in again.stderr + again.stdout


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
