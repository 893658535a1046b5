"""The toolchain of ``kimi kernels build-vllm``: cmake, ninja, nvcc and its CUDA toolkit, the C++ compiler, the
Python with the pinned torch, ccache, the machine's cores and memory, and the toolkit overlay that joins the CUDA
toolkit with the ``nvidia`` wheels' headers and libraries where the toolkit lacks what torch's CMake config links
(:mod:`kimi.kernels.vllm_build` says when)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kimi.kernels import build as fork_build
from kimi.kernels.cmake_tree import cmake_minimum

OVERLAY_DIR = "cuda"


STANDIN_MARK = ".kimi-standin"


def available_memory_gb() -> float:
    """``MemAvailable`` of ``/proc/meminfo`` in GiB (0.0 where it cannot be read)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    return 0.0


def cpu_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass
class Toolchain:
    """The programs a build needs, where they are, and what is wrong (``problems``)."""

    cmake: str | None = None
    cmake_version: str | None = None
    ninja: str | None = None
    nvcc: str | None = None
    cuda_home: str | None = None
    cuda_release: str | None = None
    python: str | None = None
    torch: str | None = None
    torch_cuda: str | None = None
    python_path: list[str] = field(default_factory=list)
    ccache: str | None = None
    cxx: str | None = None          # the C++ compiler CMake takes ($CXX, else c++ on PATH)
    cxx_version: str | None = None
    cxx_gnu: bool | None = None     # GCC (not clang)
    toolkit_gaps: list[str] = field(default_factory=list)  # what the CUDA toolkit lacks for torch's CMake
    problems: list[str] = field(default_factory=list)


def _version(tool: str, pattern: str = r"(\d+\.\d+(?:\.\d+)?)") -> str | None:
    try:
        out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(pattern, out)
    return match.group(1) if match else None


def version_tuple(text: str) -> tuple[int, ...]:
    """The first three numbers of a version string, for comparing (``"12.8.93"`` -> ``(12, 8, 93)``)."""
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def _candidates(name: str, python: str | None) -> list[str]:
    found = []
    if python:
        found.append(str(Path(python).parent / name))
    found.append(str(Path(sys.executable).parent / name))
    on_path = shutil.which(name)
    if on_path:
        found.append(on_path)
    return [c for c in dict.fromkeys(found) if Path(c).is_file() and os.access(c, os.X_OK)]


def pinned_torch(root: Path, line: str | None = None) -> str | None:
    """The torch version the line's ``pin.json`` pins (``torch`` of ``kimi/lines/<line>/pin.json``), or None."""
    from kimi.fork.layout import DEFAULT_LINE

    try:
        return json.loads((root / "kimi" / "lines" / (line or DEFAULT_LINE) / "pin.json").read_text()).get("torch")
    except (OSError, ValueError):
        return None


def _cxx_compiler() -> tuple[str | None, str | None, bool | None]:
    """(path, version, is GCC) of the C++ compiler CMake would take: ``$CXX``, else ``c++`` on PATH."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        return None, None, None
    try:
        banner = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
        version = subprocess.run([cxx, "-dumpfullversion", "-dumpversion"], capture_output=True, text=True,
                                 timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return cxx, None, None
    gnu = "clang" not in banner.lower() and bool(re.search(r"g\+\+|gcc|Free Software Foundation", banner))
    return cxx, version or None, gnu


def default_python(root: Path) -> str:
    """``ROOT/.venv/bin/python`` (the fork's environment, which has the pinned torch) or this interpreter."""
    venv = root / ".venv" / "bin" / "python"
    return str(venv) if venv.is_file() else sys.executable


def cuda_home(nvcc: Path) -> Path | None:
    """The CUDA toolkit folder of ``nvcc``: ``$CUDA_HOME``, else the folder above ``nvcc`` (links
    resolved) or ``/usr/local/cuda`` when it has ``include/cuda_runtime_api.h`` (an ``nvcc`` on PATH
    may be a wrapper script); None when none has."""
    if os.environ.get("CUDA_HOME"):
        return Path(os.environ["CUDA_HOME"])
    for home in (nvcc.resolve().parent.parent, Path("/usr/local/cuda")):
        if (home / "include" / "cuda_runtime_api.h").is_file():
            return home.resolve()
    return None


LIBCUDA_GAP = "a libcuda.so (stub)"


def toolkit_gaps(home: Path, providers: list[Path] | tuple[Path, ...] = ()) -> list[str]:
    """What torch's CMake config (``Caffe2/public/cuda.cmake``: CUDA::cublas, CUDA::nvrtc,
    CUDA::cuda_driver) needs from the CUDA toolkit at ``home`` and does not find there: ``cublas_v2.h``,
    ``libnvrtc.so``, a ``libcuda.so`` (the toolkit's stub, or a driver's in the system library folders).
    ``providers`` (:func:`overlay_providers`) count as part of the toolkit for the first two."""
    libs = [home / d for d in ("lib64", "lib", "targets/x86_64-linux/lib")]
    def has(pattern: str, dirs: list[Path]) -> bool:
        return any(d.is_dir() and any(d.glob(pattern)) for d in dirs)
    gaps = []
    if not any((d / "include" / "cublas_v2.h").is_file() for d in (home, *providers)):
        gaps.append("include/cublas_v2.h")
    if not has("libnvrtc.so*", libs + [d / "lib" for d in providers]):
        gaps.append("libnvrtc.so")
    system = [Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib64"), Path("/usr/lib")]
    if not has("libcuda.so", [d / "stubs" for d in libs] + libs + system):
        gaps.append(LIBCUDA_GAP)
    return gaps


def overlay_providers(python_path: list[str]) -> list[Path]:
    """The CUDA wheels' folders of an environment (``site-packages/nvidia/<name>`` with ``include/`` or
    ``lib/``: ``nvidia/cu13`` for CUDA 13's cuBLAS, NVRTC, ...), from its ``sys.path``."""
    found: list[Path] = []
    for entry in python_path:
        nvidia = Path(entry) / "nvidia"
        if entry and nvidia.is_dir():
            found += sorted(d for d in nvidia.iterdir() if (d / "include").is_dir() or (d / "lib").is_dir())
    return list(dict.fromkeys(found))


def make_toolkit_overlay(home: Path, providers: list[Path], dest: Path) -> None:
    """A CUDA toolkit folder at ``dest`` that is ``home`` plus the ``providers``' headers and libraries:
    links to every entry of ``home`` and of its ``include/`` and ``lib/`` (``lib64`` a link to it, and
    ``targets/<arch>/include|lib`` to these), then to the providers' (``home`` wins a name), unversioned
    ``libX.so`` links where only ``libX.so.N`` is there, an empty ``lib/stubs/libcuda.so`` (CMake only
    has to find it: the subsets link nothing), and a copy of ``nvcc`` (it finds its toolkit from where
    its binary is, ``nvcc.profile``: ``$(_HERE_)/..``).
    Raises KimiError when it cannot be written."""
    from kimi.fork.fsutil import staged_folder

    libs = [home / n for n in ("lib", "lib64") if (home / n).is_dir()]
    ours = {(home / "include").resolve(): "include", **{d.resolve(): "lib" for d in libs}}
    with staged_folder(dest) as staged:
        for entry in sorted(home.iterdir()):
            if entry.name not in ("bin", "include", "lib", "lib64", "targets"):
                (staged / entry.name).symlink_to(entry.resolve())
        for arch in sorted((home / "targets").iterdir()) if (home / "targets").is_dir() else []:
            (staged / "targets" / arch.name).mkdir(parents=True)
            for entry in sorted(arch.iterdir()):  # targets/x86_64-linux/include -> ../../include: to the merged one
                mine = ours.get(entry.resolve())
                (staged / "targets" / arch.name / entry.name).symlink_to(f"../../{mine}" if mine else entry.resolve())
        (staged / "bin").mkdir()
        for entry in sorted((home / "bin").iterdir()):
            if entry.name == "nvcc":
                shutil.copy2(entry.resolve(), staged / "bin" / "nvcc")
            else:
                (staged / "bin" / entry.name).symlink_to(entry.resolve())
        for sub, mine in (("include", [home / "include"]), ("lib", libs)):
            folder = staged / sub
            folder.mkdir()
            for source in mine + [d / sub for d in providers]:
                for entry in sorted(source.iterdir()) if source.is_dir() else []:
                    if not (folder / entry.name).exists() and not (folder / entry.name).is_symlink():
                        (folder / entry.name).symlink_to(entry.resolve())
        if (home / "lib64").is_dir():
            (staged / "lib64").symlink_to("lib")
        lib = staged / "lib"
        for entry in sorted(lib.iterdir()):
            match = re.fullmatch(r"(lib[\w+-]+\.so)\.\d+", entry.name)
            if match and not (lib / match.group(1)).exists():
                (lib / match.group(1)).symlink_to(entry.resolve())
        stubs = lib / "stubs"
        if stubs.is_symlink():
            stubs.unlink()
        stubs.mkdir(exist_ok=True)
        if not (stubs / "libcuda.so").exists():
            (stubs / "libcuda.so").write_bytes(b"")
        (staged / STANDIN_MARK).write_text(f"CUDA toolkit overlay (kimi kernels build-vllm): {home} + "
                                           + ", ".join(map(str, providers)) + "\n")


def find_toolchain(root: Path, python: str | None = None) -> Toolchain:
    """cmake (the first of the Python environment's, this interpreter's and PATH's that is at least
    the tree's ``cmake_minimum_required``), ninja, nvcc (:func:`kimi.kernels.build.find_nvcc`), the
    Python whose torch CMake uses (``python``, default :func:`default_python`) and ccache, with a
    problem line naming the fix for each one missing."""
    if python and os.sep not in python:
        python = shutil.which(python) or python
    # absolute (links kept: a venv's python is one), as CMake and its generators run it from the build folder
    tc = Toolchain(python=os.path.abspath(python) if python else default_python(root))
    need = cmake_minimum(root)
    for cmake in _candidates("cmake", tc.python):
        version = _version(cmake)
        if version and version_tuple(version) >= version_tuple(need):
            tc.cmake, tc.cmake_version = cmake, version
            break
        tc.cmake_version = tc.cmake_version or version
    if not tc.cmake:
        older = f" (found only {tc.cmake_version})" if tc.cmake_version else ""
        tc.problems.append(f"no cmake >= {need}{older}: `pip install cmake` into {tc.python}'s environment")
    ninja = _candidates("ninja", tc.python)
    tc.ninja = ninja[0] if ninja else None
    if not tc.ninja:
        tc.problems.append(f"no ninja: `pip install ninja` into {tc.python}'s environment")
    nvcc = fork_build.find_nvcc()
    home = cuda_home(nvcc) if nvcc else None
    if home and (home / "bin" / "nvcc").is_file():
        nvcc = home / "bin" / "nvcc"  # as setup.py: CMAKE_CUDA_COMPILER=$CUDA_HOME/bin/nvcc
    if nvcc:
        tc.nvcc, tc.cuda_home = str(nvcc), str(home) if home else None
        if not home:
            tc.problems.append(f"no CUDA toolkit folder (include/cuda_runtime_api.h) for {nvcc}: set CUDA_HOME")
        else:
            tc.toolkit_gaps = toolkit_gaps(home)  # make_plan: an overlay, or a problem
        release = fork_build.tool_release(nvcc)
        tc.cuda_release = f"{release[0]}.{release[1]}" if release else None
    else:
        tc.problems.append("no nvcc: install the CUDA toolkit 13 (or the nvidia-cuda-nvcc wheel) and set CUDA_HOME")
    probe = ("import json, sys\ntry:\n import torch\n t, c = torch.__version__, torch.version.cuda\n"
             "except ImportError:\n t = c = None\nprint(json.dumps([t, c, sys.path]))")
    try:
        proc = subprocess.run([tc.python, "-c", probe], capture_output=True, text=True, timeout=300)
        tc.torch, tc.torch_cuda, tc.python_path = json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        tc.problems.append(f"{tc.python} does not run: pass --python with the environment holding torch")
    else:
        if tc.torch is None:
            tc.problems.append(f"no torch in {tc.python}: `python3 -m kimi setup`, or pass --python")
        elif tc.torch_cuda is None:
            pin = pinned_torch(root) or "<the pinned version>"
            tc.problems.append(f"torch {tc.torch} in {tc.python} is a CPU build: CMake needs torch's CUDA build "
                               f"(the package index's torch=={pin} is built for CUDA 13: a separate venv with it, "
                               "cmake and ninja, then --python)")
    tc.ccache = shutil.which("ccache") or shutil.which("sccache")
    tc.cxx, tc.cxx_version, tc.cxx_gnu = _cxx_compiler()
    return tc
