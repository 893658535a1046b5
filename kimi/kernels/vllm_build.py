"""Offline from-source build of the laid vLLM tree's CUDA extensions (``kimi kernels build-vllm``).

vLLM's own ``setup.py`` (``cmake_build_ext.configure``) runs CMake on the tree with Ninja, a job pool
and ccache/sccache launchers; its CMake clones CUTLASS, FlashMLA, flash-attention, DeepGEMM, QuTLASS,
MSA (fmha_sm100), tml-fa4 and triton_kernels unless each ``*_SRC_DIR`` names a local folder. This
module makes the same configure with every ``*_SRC_DIR`` set to a local folder
(:mod:`kimi.kernels.sources`) and ``FETCHCONTENT_FULLY_DISCONNECTED=ON``, so no step reaches the
network, and builds one of three subsets:

* ``fork``: the fork's own kernels — the EAGLE-3 draft-head library (:mod:`kimi.kernels.build`,
  nvcc alone) plus any upstream CUDA unit the line's patch series changes (none today: then no
  CMake configure runs at all);
* ``sm100``: the sm_100-only group of ``_C_stable_libtorch``, read from the laid tree's
  ``CMakeLists.txt`` (lists ``SCALED_MM_SM100_SRCS``, ``CUTLASS_MOE_SM100_SRCS``, ``FP4_SM100_SRCS``,
  ``CUTLASS_MLA_SRCS``: scaled_mm sm100 fp8 and blockwise fp8, grouped MoE sm100, NVFP4/MXFP4 with the
  NVFP4 KV-cache kernels, CUTLASS MLA sm100; 13 units on the v0.26 line under ``csrc/libtorch_stable/``,
  14 on the v0.32 line under ``csrc/``, which adds ``nvfp4_ds_mla_cache_kernels.cu``), built as Ninja object targets;
* ``all``: everything upstream's CMake builds (``cmake --build``), optionally installed into the tree.

Every source must exist for CMake to configure at all, even for one object. For ``fork`` and
``sm100`` a source other than CUTLASS that is missing is replaced by a *configure-only stand-in*
(``BUILD/standins/<name>``: empty files where the CMake file lists sources, a ``CMakeLists.txt`` with
empty targets for flash-attention); those units are never built, and ``all`` refuses stand-ins.

Two more configure-only accommodations, each printed as a note and refused by ``all``:

* *compiler waivers*: a ``GCC >= X`` check of ``CMakeLists.txt`` that the host ``c++`` fails and whose
  message names only external sources (the v0.32 line: ``GCC >= 13 ... DeepGEMM and DeepSelect ... <format>``)
  does not concern ``fork``/``sm100``, which compile none of them; configure includes
  ``BUILD/kimi-waivers.cmake`` (``CMAKE_PROJECT_<project>_INCLUDE``), which turns exactly that
  ``FATAL_ERROR`` into a warning. A check about vLLM itself (``GCC >= 11.3``) stays a problem.
* a *toolkit overlay*: where the CUDA toolkit lacks what torch's CMake config links (cuBLAS headers,
  NVRTC, a ``libcuda.so``; :func:`toolkit_gaps`) and the ``--python`` environment's ``nvidia`` wheels
  have the headers and libraries, ``BUILD/cuda`` joins both (links, a copy of ``nvcc``, an empty
  ``libcuda.so`` stub) and is ``CUDA_HOME`` for the build (:func:`make_toolkit_overlay`).

Jobs are sized to memory: a heavy CUTLASS unit takes ~11 GB and ~2 min on 2 cores (measured on the
project's 2-core, 24 GB machine; DESIGN.md), so ``jobs = max(1, min(cores, available // per_job_gb))``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kimi.errors import KimiError
from kimi.kernels import build as fork_build
from kimi.kernels import sources as srcs

SUBSETS = ("fork", "sm100", "all")
PER_JOB_GB = 11.0
# CMakeLists.txt lists whose units compile for sm_100 only (the 10.0f/10.0a branches; the v0.26 and v0.32 lines).
SM100_LISTS = ("SCALED_MM_SM100_SRCS", "CUTLASS_MOE_SM100_SRCS", "FP4_SM100_SRCS", "CUTLASS_MLA_SRCS")
STANDIN_MARK = ".kimi-standin"
WAIVERS_FILE = "kimi-waivers.cmake"
OVERLAY_DIR = "cuda"
_CODE_EXT = srcs.CODE_EXT


# ---------------------------------------------------------------------------------------------
# Jobs

def jobs_for_memory(cores: int, available_gb: float, per_job_gb: float = PER_JOB_GB) -> int:
    """Parallel compile jobs: ``max(1, min(cores, available_gb // per_job_gb))``.

    Args:
        cores: CPU cores this process may use.
        available_gb: memory available now, in GiB (``MemAvailable``).
        per_job_gb: peak memory of one heavy unit, GiB (~11 for a CUTLASS sm100 unit).

    Raises KimiError when ``per_job_gb`` is not positive.
    """
    if per_job_gb <= 0:
        raise KimiError(f"--per-job-gb must be positive, not {per_job_gb}")
    return max(1, min(cores, int(available_gb // per_job_gb)))


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


# ---------------------------------------------------------------------------------------------
# Units of a subset, read from the laid tree's CMakeLists.txt

@dataclass(frozen=True)
class Unit:
    """One translation unit: the CMake target it belongs to and its path relative to the tree."""

    target: str
    source: str
    group: str = ""

    @property
    def object(self) -> str:
        """The Ninja object target (``CMakeFiles/<target>.dir/<source>.o``)."""
        return f"CMakeFiles/{self.target}.dir/{self.source}.o"


def cmake_lists(text: str) -> dict[str, list[str]]:
    """``set(NAME "a" "b" ...)`` statements of a CMake file whose items are literal paths -> {NAME: [a, b]}."""
    found: dict[str, list[str]] = {}
    for match in re.finditer(r"\bset\(\s*([A-Za-z0-9_]+)\s+((?:\s*\"[^\"$]+\")+)\s*\)", text):
        found[match.group(1)] = re.findall(r"\"([^\"]+)\"", match.group(2))
    return found


def target_of_list(text: str, list_name: str) -> str:
    """The extension target whose sources receive ``list_name``: ``list(APPEND EXT "${list_name}")``
    then ``define_extension_target(TARGET ... SOURCES ${EXT}``.

    Raises KimiError when either link is missing (a new upstream layout: the subset needs updating).
    """
    appended = re.search(rf"list\(\s*APPEND\s+([A-Za-z0-9_]+)\s+\"?\$\{{{list_name}\}}\"?\s*\)", text)
    if not appended:
        raise KimiError(f"CMakeLists.txt appends {list_name} to no source list: update SM100_LISTS in {__file__}")
    ext = appended.group(1)
    target = _target_with_sources(text, ext)
    if not target:
        raise KimiError(f"no define_extension_target(... SOURCES ${{{ext}}}) in CMakeLists.txt")
    return target


def _target_with_sources(text: str, list_name: str) -> str | None:
    """The target of ``define_extension_target(TARGET ... SOURCES ${list_name}``, or None."""
    match = re.search(rf"define_extension_target\(\s*([A-Za-z0-9_]+)[^)]*?SOURCES\s+\$\{{{list_name}\}}", text, re.S)
    return match.group(1) if match else None


def sm100_units(root: Path) -> list[Unit]:
    """The sm_100-only units of ``root/CMakeLists.txt`` (lists :data:`SM100_LISTS`), each once.

    Raises KimiError when a list is not found (names it).
    """
    text = (root / "CMakeLists.txt").read_text(errors="replace")
    lists = cmake_lists(text)
    units: dict[str, Unit] = {}
    for name in SM100_LISTS:
        if name not in lists:
            raise KimiError(f"CMakeLists.txt has no set({name} ...): update SM100_LISTS in {__file__}")
        target = target_of_list(text, name)
        for source in lists[name]:
            units.setdefault(source, Unit(target, source, name))
    return list(units.values())


def owner_target(text: str, source: str) -> str:
    """The extension target of CMakeLists.txt ``text`` that compiles ``source``: the target of the
    ``set(...)`` list naming it; else by folder (``csrc/libtorch_stable/moe/`` -> ``_moe_C_stable_libtorch``,
    other -> ``_C_stable_libtorch``). A wrong guess is caught before building (no rule in build.ninja)."""
    for name, items in cmake_lists(text).items():
        if source in items:
            try:
                return _target_with_sources(text, name) or target_of_list(text, name)
            except KimiError:
                break
    return "_moe_C_stable_libtorch" if "/moe/" in source else "_C_stable_libtorch"


def series_cuda_units(checkout: Path, line: str, tree: Path | None = None) -> list[Unit]:
    """Upstream CUDA/C++ units under ``csrc/`` that the line's patch series changes
    (``CHECKOUT/kimi/lines/<line>/patches/*.patch``), each with the target of ``tree``'s (default:
    the checkout's) CMakeLists.txt that compiles it."""
    text = ((tree or checkout) / "CMakeLists.txt").read_text(errors="replace")
    changed: list[str] = []
    for patch in sorted((checkout / "kimi" / "lines" / line / "patches").glob("*.patch")):
        for path in re.findall(r"^diff --git a/(csrc/\S+\.(?:cu|cpp|cc))\s", patch.read_text(errors="replace"), re.M):
            if path not in changed:
                changed.append(path)
    return [Unit(owner_target(text, path), path, "series") for path in changed]


# ---------------------------------------------------------------------------------------------
# Tools

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


def _vtuple(text: str) -> tuple[int, ...]:
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


def cmake_minimum(root: Path) -> str:
    """``cmake_minimum_required(VERSION x.y)`` of the tree's CMakeLists.txt (``3.26`` on the v0.26 line)."""
    match = re.search(r"cmake_minimum_required\(\s*VERSION\s+([\d.]+)", (root / "CMakeLists.txt").read_text())
    return match.group(1) if match else "3.26"


@dataclass(frozen=True)
class CompilerCheck:
    """A ``GCC >= version`` check of ``CMakeLists.txt`` that stops configure (``message(FATAL_ERROR``)."""

    version: str
    message: str   # the message's text as written (``${...}`` left in)

    @property
    def prefix(self) -> str:
        """The message up to its first ``${``: what the configured message starts with."""
        return self.message.split("${", 1)[0]


_GCC_CHECK_RE = re.compile(
    r'if\s*\(([^()]*?CMAKE_CXX_COMPILER_ID\s+STREQUAL\s+"GNU"[^()]*?CMAKE_CXX_COMPILER_VERSION\s+'
    r'VERSION_LESS\s+"?([\d.]+)"?[^()]*)\)\s*message\(\s*FATAL_ERROR\s+((?:"(?:[^"\\]|\\.)*"\s*)+)\)')


def compiler_checks(root: Path) -> list[CompilerCheck]:
    """The GCC version checks of the tree's ``CMakeLists.txt`` (the v0.26 line: ``>= 11.3``; the v0.32 line
    adds ``>= 13`` for CUDA, for DeepGEMM's and DeepSelect's host code)."""
    text = (root / "CMakeLists.txt").read_text(errors="replace")
    return [CompilerCheck(m.group(2), "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(3))))
            for m in _GCC_CHECK_RE.finditer(text)]


def project_name(root: Path) -> str:
    """The ``project(NAME`` of the tree's ``CMakeLists.txt`` (``vllm_extensions``)."""
    match = re.search(r"^\s*project\(\s*([A-Za-z0-9_.-]+)", (root / "CMakeLists.txt").read_text(), re.M)
    return match.group(1) if match else "vllm_extensions"


def waivers_cmake(prefixes: list[str]) -> str:
    """A CMake file for ``CMAKE_PROJECT_<name>_INCLUDE`` that turns a ``message(FATAL_ERROR`` whose text
    starts with one of ``prefixes`` into a warning, and passes every other message on unchanged (each
    argument as given, through bracket arguments)."""
    items = " ".join(f"[==[{p}]==]" for p in prefixes)
    return f"""# kimi kernels build-vllm: configure-only compiler waivers (the subset builds none of what they are for)
include_guard(GLOBAL)
function(message)
  if(ARGC GREATER 1 AND "${{ARGV0}}" STREQUAL "FATAL_ERROR")
    set(_kimi_text "")
    math(EXPR _kimi_last "${{ARGC}} - 1")
    foreach(_kimi_i RANGE 1 ${{_kimi_last}})
      string(APPEND _kimi_text "${{ARGV${{_kimi_i}}}}")
    endforeach()
    foreach(_kimi_prefix IN ITEMS {items})
      string(FIND "${{_kimi_text}}" "${{_kimi_prefix}}" _kimi_at)
      if(_kimi_at EQUAL 0)
        _message(WARNING "kimi kernels build-vllm waived this check (its sources are not built here): ${{_kimi_text}}")
        return()
      endif()
    endforeach()
  endif()
  set(_kimi_call "_message(")
  if(ARGC GREATER 0)
    math(EXPR _kimi_last "${{ARGC}} - 1")
    foreach(_kimi_i RANGE 0 ${{_kimi_last}})
      string(APPEND _kimi_call " [==[${{ARGV${{_kimi_i}}}}]==]")
    endforeach()
  endif()
  string(APPEND _kimi_call ")")
  cmake_language(EVAL CODE "${{_kimi_call}}")
endfunction()
"""


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
        if version and _vtuple(version) >= _vtuple(need):
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


# ---------------------------------------------------------------------------------------------
# The plan: commands and environment

@dataclass
class Plan:
    """Everything a build will do, before it does it (printed by ``--dry-run``)."""

    subset: str
    archs: list[str]
    source_dir: str
    build_dir: str
    jobs: int
    cores: int
    available_gb: float
    per_job_gb: float
    build_type: str
    env: dict[str, str]
    configure: list[str] | None
    build: list[str] | None
    install: list[str] | None
    units: list[dict]
    fork_library: bool
    sources: list[dict]
    standins: list[str]
    warnings: list[str]
    problems: list[str]
    toolchain: dict
    waivers: list[str] = field(default_factory=list)  # FATAL_ERROR prefixes kimi-waivers.cmake makes warnings
    overlay: dict | None = None  # the CUDA toolkit overlay: {"path", "home", "providers"}

    def as_dict(self) -> dict:
        return asdict(self)


def _compiler_waivers(root: Path, subset: str, tc: Toolchain, found: list, cmake_args: list[str],
                      problems: list[str], warnings: list[str]) -> list[str]:
    """The GCC checks of the tree that the host compiler fails: a problem each, except, for a subset other
    than ``all``, a check whose message names only external sources (none of which the subset compiles),
    which is waived (a note). Returns the waived messages' prefixes. Nothing when the compiler is not GCC,
    unknown, or chosen with ``-DCMAKE_CXX_COMPILER``."""
    if not tc.cxx_gnu or not tc.cxx_version or any(a.startswith("-DCMAKE_CXX_COMPILER") for a in cmake_args):
        return []
    names = sorted({s.repo_name for s in found if s.repo_name})
    waived = []
    for check in compiler_checks(root):
        if _vtuple(tc.cxx_version) >= _vtuple(check.version):
            continue
        named = [n for n in names if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", check.message, re.I)]
        line = (f"the host C++ compiler {tc.cxx} is GCC {tc.cxx_version}, and CMakeLists.txt stops for GCC < "
                f"{check.version}: \"{check.prefix.strip()}\"")
        if subset != "all" and named:
            waived.append(check.prefix)
            warnings.append(f"{line}, for {', '.join(named)}, which the {subset} subset does not compile: waived "
                            f"(configure includes {WAIVERS_FILE}, which turns that FATAL_ERROR into a warning); "
                            f"--subset all needs GCC >= {check.version}")
        else:
            problems.append(f"{line}: install GCC >= {check.version} and set CXX and CC (or --cmake-arg "
                            "-DCMAKE_CXX_COMPILER=...)")
    return waived


def _toolkit_overlay(subset: str, tc: Toolchain, build_dir: Path, problems: list[str],
                     warnings: list[str]) -> dict | None:
    """Where the CUDA toolkit lacks what torch's CMake config links (``tc.toolkit_gaps``): for a subset
    other than ``all`` (which links, so needs a real toolkit) an overlay of the toolkit and the
    ``--python`` environment's CUDA wheels when they fill the gaps (a note), else a problem naming the fix."""
    if not tc.toolkit_gaps or not tc.cuda_home:
        return None
    home = Path(tc.cuda_home)
    providers = overlay_providers(tc.python_path)
    left = [g for g in toolkit_gaps(home, providers) if g != LIBCUDA_GAP]
    if providers and not left and subset != "all":  # all links the libraries: no empty stub there
        path = build_dir / OVERLAY_DIR
        warnings.append(f"the CUDA toolkit at {home} lacks {', '.join(tc.toolkit_gaps)}, which torch's CMake config "
                        f"links: CUDA_HOME is {path}, an overlay of it and {', '.join(map(str, providers))} "
                        "(an empty libcuda.so stub: nothing is linked)")
        return {"path": str(path), "home": str(home), "providers": [str(d) for d in providers]}
    problems.append(f"the CUDA toolkit at {home} lacks {', '.join(left or tc.toolkit_gaps)}, which torch's CMake "
                    "config links: install the full toolkit (cuBLAS, NVRTC, stubs) or point CUDA_HOME at a folder "
                    "that adds them, or use a --python whose environment has the nvidia-cublas / nvidia-cuda-nvrtc "
                    "wheels (torch's CUDA build brings them), which build-vllm then overlays")
    return None


def default_build_dir(root: Path, subset: str) -> Path:
    """``ROOT/.kimi/build/vllm-<subset>`` (git-ignored); ``all`` and the subsets keep separate caches."""
    return root / ".kimi" / "build" / f"vllm-{subset}"


def make_plan(root: Path, subset: str = "sm100", archs: tuple[str, ...] = fork_build.DEFAULT_ARCHS, *,
              build_dir: Path | None = None, jobs: int | None = None, per_job_gb: float = PER_JOB_GB,
              python: str | None = None, build_type: str = "RelWithDebInfo", install: bool = False,
              line: str | None = None, sources_dir: Path | None = None, toolchain: Toolchain | None = None,
              cores: int | None = None, available_gb: float | None = None,
              cmake_args: list[str] | None = None, only: list[str] | None = None,
              checkout: Path | None = None, keep_going: bool = False) -> Plan:
    """The configure/build commands and environment for ``subset`` of the vLLM tree at ``root``.

    Args:
        root: the laid vLLM tree (``CMakeLists.txt``, ``csrc/``, ``cmake/``) and the fork checkout.
        subset: one of :data:`SUBSETS`.
        archs: TORCH_CUDA_ARCH_LIST entries (``("9.0a", "10.0a")``).
        jobs: parallel compile jobs; default :func:`jobs_for_memory` of ``cores`` and ``available_gb``.
        per_job_gb: GiB one job may take (default 11).
        python: the interpreter whose torch CMake uses (default :func:`default_python`).
        build_type: CMAKE_BUILD_TYPE (setup.py's default is RelWithDebInfo).
        install: after ``all``, install the libraries into ``root`` (``cmake --install``).
        checkout: the fork checkout whose ``kimi/lines/<line>/patches`` the fork subset reads
            (default: ``root``).
        keep_going: build every unit that can be built when one fails (Ninja ``-k 0``).
        only: keep the subset's units whose path contains one of these strings (one heavy unit alone).
        cmake_args: more configure arguments (``-DX=Y``), after ours; default: ``$CMAKE_ARGS`` split
            on spaces, as vLLM's setup.py reads it.
        toolchain, cores, available_gb: for tests; found on this machine otherwise.

    Problems (missing sources or tools) go to ``plan.problems``, each naming its fix; nothing is run.
    Raises KimiError for an unknown subset or a tree that is not laid.
    """
    from kimi.fork.layout import DEFAULT_LINE

    if subset not in SUBSETS:
        raise KimiError(f"unknown subset {subset!r}: one of {', '.join(SUBSETS)}")
    if not (root / "CMakeLists.txt").is_file():
        raise KimiError(f"no CMakeLists.txt at {root}: lay the upstream tree first with `python3 -m kimi sync`")
    build_dir = (build_dir or default_build_dir(root, subset)).resolve()
    cores = cores or cpu_cores()
    available_gb = available_memory_gb() if available_gb is None else available_gb
    jobs = jobs or jobs_for_memory(cores, available_gb, per_job_gb)
    problems: list[str] = []
    warnings: list[str] = []
    if available_gb < per_job_gb * jobs:
        warnings.append(f"{available_gb:.1f} GiB available for {jobs} job(s) of up to {per_job_gb:g} GiB: a heavy "
                        "CUTLASS unit may be killed for memory (free memory, or lower --jobs)")

    if subset == "sm100":
        units = sm100_units(root)
        if not any(a.startswith("10.") for a in archs):
            problems.append(f"the sm100 subset compiles for 10.x only, and --arch {';'.join(archs)} has none: "
                            "add 10.0a")
    elif subset == "fork":
        units = series_cuda_units(checkout or root, line or DEFAULT_LINE, root)
    else:
        units = []
    if only:
        kept = [u for u in units if any(s in u.source for s in only)]
        if not kept:
            problems.append(f"--only {' '.join(only)} matches none of the {subset} subset's {len(units)} units"
                            + (f": {', '.join(Path(u.source).name for u in units)}" if units else ""))
        units = kept or units
    needs_cmake = subset == "all" or bool(units)

    found = srcs.external_sources(root, sources_dir)
    waivers: list[str] = []
    overlay: dict | None = None
    standins: list[str] = []
    env: dict[str, str] = {}
    cmake_defs: list[str] = []
    tc = toolchain or (find_toolchain(root, python) if needs_cmake else Toolchain(python=python))
    if needs_cmake:
        problems += tc.problems
        for s in found:
            if s.present:
                path = s.path
                if s.revision_ok is False:
                    warnings.append(f"{s.variable}: {s.revision} ({s.origin}), not the pinned {s.tag}")
            elif subset != "all" and s.variable != "VLLM_CUTLASS_SRC_DIR":
                path = str(build_dir / "standins" / s.name)
                standins.append(s.variable)
            else:
                more = f" and {len(s.missing_files) - 6} more" if len(s.missing_files) > 6 else ""
                lacks = f" incomplete (lacks {', '.join(s.missing_files[:6])}{more})" if Path(s.path).exists() else ""
                problems.append(f"{s.variable}{lacks}: {s.how_to_provide()}")
                path = s.path
            env[s.variable] = path
            if s.variable != "TRITON_KERNELS_SRC_DIR":  # triton_kernels.cmake reads only the environment
                cmake_defs.append(f"-D{s.variable}={path}")
        cutlass = env.get("VLLM_CUTLASS_SRC_DIR", "")
        # vLLM reads these three from CUTLASS's own CMakeLists.txt, which a headers tree lacks;
        # for a checkout they are the values CUTLASS would set.
        cmake_defs += [f"-DCUTLASS_DIR={cutlass}", f"-DCUTLASS_INCLUDE_DIR={cutlass}/include",
                       f"-DCUTLASS_TOOLS_UTIL_INCLUDE_DIR={cutlass}/tools/util/include"]
        if standins:
            warnings.append("configure-only stand-ins (never compiled) for: " + ", ".join(standins))
        extra = cmake_args if cmake_args is not None else os.environ.get("CMAKE_ARGS", "").split()
        waivers = _compiler_waivers(root, subset, tc, found, extra, problems, warnings)
        if waivers:
            cmake_defs.append(f"-DCMAKE_PROJECT_{project_name(root)}_INCLUDE={build_dir / WAIVERS_FILE}")
        overlay = _toolkit_overlay(subset, tc, build_dir, problems, warnings)
    env["TORCH_CUDA_ARCH_LIST"] = ";".join(archs)
    nvcc = tc.nvcc
    if overlay:
        env["CUDA_HOME"] = overlay["path"]
        nvcc = str(Path(overlay["path"]) / "bin" / "nvcc")
    elif tc.cuda_home:
        env["CUDA_HOME"] = tc.cuda_home
    if nvcc:  # CMakeLists.txt: find_program(NVCC_EXECUTABLE nvcc)
        env["PATH"] = f"{Path(nvcc).parent}:$PATH"
    env["NINJA_STATUS"] = "[%f/%t %es] "

    configure = build = inst = None
    if needs_cmake:
        cmake = tc.cmake or "cmake"
        configure = [cmake, "-S", str(root), "-B", str(build_dir), "-G", "Ninja",
                     f"-DCMAKE_BUILD_TYPE={build_type}", "-DVLLM_TARGET_DEVICE=cuda",
                     f"-DVLLM_PYTHON_EXECUTABLE={tc.python}",
                     f"-DFETCHCONTENT_BASE_DIR={build_dir / 'deps'}", "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
                     "-DFETCHCONTENT_QUIET=OFF", "-DNVCC_THREADS=1",
                     "-DCMAKE_JOB_POOL_COMPILE:STRING=compile", f"-DCMAKE_JOB_POOLS:STRING=compile={jobs}"]
        python_path = [p for p in tc.python_path if p and Path(p).exists()]
        if python_path:  # as setup.py: machete's generator runs with it
            configure.append(f"-DVLLM_PYTHON_PATH={':'.join(python_path)}")
        if tc.ninja:
            configure.append(f"-DCMAKE_MAKE_PROGRAM={tc.ninja}")
        if nvcc:
            configure.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
        if tc.ccache:
            configure += [f"-DCMAKE_{lang}_COMPILER_LAUNCHER={tc.ccache}" for lang in ("C", "CXX", "CUDA")]
        configure += cmake_defs
        configure += cmake_args if cmake_args is not None else os.environ.get("CMAKE_ARGS", "").split()
        build = [cmake, "--build", str(build_dir), "-j", str(jobs)]
        if units:
            build += ["--target", *[u.object for u in units]]
        if keep_going:
            build += ["--", "-k", "0"]
        if subset == "all" and install:
            inst = [cmake, "--install", str(build_dir), "--prefix", str(root)]
    elif subset == "fork":
        if not tc.nvcc and fork_build.find_nvcc() is None:
            problems.append("no nvcc for the draft-head library: install the CUDA toolkit 13 and set CUDA_HOME or NVCC")
        warnings.append(f"the {line or DEFAULT_LINE} series changes no upstream CUDA unit: "
                        "no CMake configure is needed")

    return Plan(subset=subset, archs=list(archs), source_dir=str(root), build_dir=str(build_dir), jobs=jobs,
                cores=cores, available_gb=round(available_gb, 1), per_job_gb=per_job_gb, build_type=build_type,
                env=env, configure=configure, build=build, install=inst, units=[asdict(u) | {"object": u.object}
                                                                                  for u in units],
                fork_library=subset in ("fork", "all"), sources=[s.as_dict() for s in found] if needs_cmake else [],
                standins=standins, warnings=warnings, problems=problems, toolchain=asdict(tc), waivers=waivers,
                overlay=overlay)


_WITH_VALUE = ("-S", "-B", "-G", "-j", "--build", "--install", "--prefix")


def _shell(cmd: list[str]) -> str:
    """A command as shell text, one option (with its value) per line."""
    parts: list[str] = [shlex.quote(cmd[0])]
    i = 1
    while i < len(cmd):
        if cmd[i] in _WITH_VALUE and i + 1 < len(cmd):
            parts.append(f"{cmd[i]} {shlex.quote(cmd[i + 1])}")
            i += 2
        else:
            parts.append(shlex.quote(cmd[i]))
            i += 1
    return " \\\n    ".join(parts)


def expand_env(env: dict[str, str], base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default os.environ) updated with ``env``, where ``$PATH`` in a value is the base's PATH."""
    base = dict(os.environ if base is None else base)
    return {**base, **{k: v.replace("$PATH", base.get("PATH", "")) for k, v in env.items()}}


def render_plan(plan: Plan) -> str:
    """The plan as text: sizing, environment, the full commands (shell-quoted), warnings, problems."""
    lines = [f"subset {plan.subset}: TORCH_CUDA_ARCH_LIST={';'.join(plan.archs)}, build dir {plan.build_dir}",
             (f"jobs: {plan.jobs} (cores {plan.cores}, available memory {plan.available_gb:.1f} GiB, "
              f"{plan.per_job_gb:g} GiB per job: max(1, min(cores, available // per_job)))"),
             f"ccache: {plan.toolchain.get('ccache') or 'not found (builds do not reuse earlier objects)'}"]
    tc = plan.toolchain
    if plan.configure:
        lines.append(f"tools: cmake {tc.get('cmake_version')} ({tc.get('cmake')}), ninja {tc.get('ninja')}, "
                     f"nvcc {tc.get('cuda_release')} ({tc.get('nvcc')}), "
                     f"c++ {tc.get('cxx_version')} ({tc.get('cxx')}), python {tc.get('python')} "
                     f"(torch {tc.get('torch')}, CUDA {tc.get('torch_cuda')})")
    if plan.fork_library:
        lines.append(f"the fork's draft-head library: kimi kernels build --arch '{';'.join(plan.archs)}' "
                     f"({fork_build.SOURCE.name}, nvcc)")
    if plan.units:
        lines.append(f"{len(plan.units)} units:")
        lines += [f"  {u['group']:<24} {u['source']}" for u in plan.units]
    if plan.configure:
        lines.append("\nenvironment:")
        lines += [f"  export {k}={shlex.quote(v) if k != 'PATH' else v}" for k, v in plan.env.items()]
        lines.append("\nconfigure:\n  " + _shell(plan.configure))
        lines.append("\nbuild:\n  " + _shell(plan.build or []))
        if plan.install:
            lines.append("\ninstall:\n  " + _shell(plan.install))
    for w in plan.warnings:
        lines.append(f"note: {w}")
    for p in plan.problems:
        lines.append(f"MISSING: {p}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Running it

def make_standin(root: Path, source: dict, dest: Path) -> None:
    """A configure-only stand-in for the external source ``source`` (an ExternalSource dict) at
    ``dest``: an empty file for every ``${<name>_SOURCE_DIR}/<file>`` its CMake file lists, FlashMLA's
    interface (the laid tree's copy with vLLM's import line undone, so configure writes the same file
    back, else a module raising ImportError), and for flash-attention a ``CMakeLists.txt`` with its two
    targets empty. Marked with ``.kimi-standin``; never compiled (the subsets build named objects)."""
    from kimi.fork.fsutil import staged_folder

    text = (root / source["cmake_file"]).read_text(errors="replace")
    with staged_folder(dest) as staged:
        for rel in sorted(set(re.findall(r"\$\{[\w-]+_SOURCE_DIR\}/([\w./+-]+)", text))):
            if rel.endswith(_CODE_EXT) and ".." not in rel:
                (staged / rel).parent.mkdir(parents=True, exist_ok=True)
                (staged / rel).write_text("// configure-only stand-in (kimi kernels build-vllm); never compiled\n"
                                          if not rel.endswith(".py") else "")
        if source["variable"] == "FLASH_MLA_SRC_DIR":
            laid = root / "vllm" / "third_party" / "flashmla" / "flash_mla_interface.py"
            body = (laid.read_text().replace("import vllm._flashmla_C\n", "", 1) if laid.is_file() else
                    'raise ImportError("FlashMLA was not built: configure-only stand-in of kimi kernels build-vllm")\n')
            (staged / "flash_mla").mkdir(exist_ok=True)
            (staged / "flash_mla" / "flash_mla_interface.py").write_text(body)
        if source["variable"] == "VLLM_FLASH_ATTN_SRC_DIR":
            (staged / "CMakeLists.txt").write_text(
                "# configure-only stand-in (kimi kernels build-vllm): the FA2/FA3 targets, empty\n"
                "add_custom_target(_vllm_fa2_C)\nadd_custom_target(_vllm_fa3_C)\n")
            for sub in ("vllm_flash_attn", "flash_attn/cute"):
                (staged / sub).mkdir(parents=True, exist_ok=True)
        (staged / STANDIN_MARK).write_text(f"stand-in for {source['variable']} ({source['repository']} @ "
                                           f"{source['tag']}); configure only\n")


def _stream(cmd: list[str], env: dict[str, str], log, prefix: str) -> int:
    """Run ``cmd``, echoing and logging its output line by line; returns the exit status."""
    log.write(f"$ {shlex.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
        print(f"{prefix}{line}", end="", flush=True)
    return proc.wait()


@dataclass
class BuildRecord:
    """What a build did (``BUILD/kimi-build.json``)."""

    plan: dict
    configure_seconds: float | None = None
    build_seconds: float | None = None
    install_seconds: float | None = None
    fork_library: dict | None = None
    objects: list[str] = field(default_factory=list)
    cubins: dict[str, list[str]] = field(default_factory=dict)
    result: str = "not run"
    log: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def run(plan: Plan, *, configure_only: bool = False) -> BuildRecord:
    """Carry out ``plan``: the fork's library (subsets fork/all), stand-ins, configure, build
    (progress on stdout, everything in ``BUILD/build.log``), install; the record is written to
    ``BUILD/kimi-build.json`` atomically, also when a step fails.

    Raises KimiError when the plan has problems (each listed) or a step fails (with the log's path).
    """
    from kimi.fork.fsutil import write_json_atomic

    if plan.problems:
        raise KimiError("cannot build:\n  " + "\n  ".join(plan.problems))
    record = BuildRecord(plan=plan.as_dict())
    build_dir = Path(plan.build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    record.log = str(build_dir / "build.log")
    env = expand_env(plan.env)
    try:
        if plan.fork_library:
            result = fork_build.build(tuple(plan.archs), threads=min(2, plan.jobs))
            record.fork_library = result.as_dict()
            print(f"draft-head library: {result.library} ({'reused' if result.cached else f'{result.seconds} s'})")
        if not plan.configure:
            record.result = "ok"
            return record
        for source in plan.sources:
            if source["variable"] in plan.standins:
                make_standin(Path(plan.source_dir), source, Path(plan.env[source["variable"]]))
        if plan.waivers:
            (build_dir / WAIVERS_FILE).write_text(waivers_cmake(plan.waivers))
        if plan.overlay:
            make_toolkit_overlay(Path(plan.overlay["home"]), [Path(d) for d in plan.overlay["providers"]],
                                 Path(plan.overlay["path"]))
        with open(record.log, "a") as log:
            start = time.monotonic()
            print(f"configure: {len(plan.configure)} arguments, log {record.log}", flush=True)
            rc = _stream(plan.configure, env, log, "  ")
            record.configure_seconds = round(time.monotonic() - start, 1)
            if rc != 0:
                record.result = f"configure failed (exit {rc})"
                raise KimiError(f"CMake configure failed (exit {rc}) after {record.configure_seconds} s: "
                                f"see {record.log}")
            if configure_only:
                record.result = "configured"
                return record
            missing = _missing_objects(build_dir, plan.units)
            if missing:
                record.result = "objects not in build.ninja"
                raise KimiError("build.ninja has no rule for: " + ", ".join(missing) +
                                " (the unit is not compiled for --arch, or the upstream layout changed)")
            start = time.monotonic()
            print(f"build: {plan.jobs} job(s), {len(plan.units) or 'all'} target(s)", flush=True)
            rc = _stream(plan.build or [], env, log, "")
            record.build_seconds = round(time.monotonic() - start, 1)
            record.objects = [u["object"] for u in plan.units if (build_dir / u["object"]).is_file()]
            record.cubins = object_cubins(build_dir, record.objects)
            for obj, cubins in record.cubins.items():
                print(f"  {Path(obj).name}: {', '.join(cubins) or 'no cubin'}")
            if rc != 0:
                record.result = f"build failed (exit {rc})"
                failed = [Path(u["object"]).name for u in plan.units if u["object"] not in record.objects]
                raise KimiError(f"build failed (exit {rc}) after {record.build_seconds} s"
                                + (f"; not built: {', '.join(failed)}" if failed else "") + f": see {record.log}")
            if plan.install:
                start = time.monotonic()
                rc = _stream(plan.install, env, log, "  ")
                record.install_seconds = round(time.monotonic() - start, 1)
                if rc != 0:
                    record.result = f"install failed (exit {rc})"
                    raise KimiError(f"cmake --install failed (exit {rc}): see {record.log}")
        record.result = "ok"
        return record
    finally:
        write_json_atomic(build_dir / "kimi-build.json", record.as_dict())


def object_cubins(build_dir: Path, objects: list[str]) -> dict[str, list[str]]:
    """``cuobjdump --list-elf`` architectures of each built object (``{obj: ["sm_90a", "sm_100a"]}``);
    empty when no cuobjdump of CUDA 13 or newer is found (``kimi kernels prepare --fetch`` gets one)."""
    if not objects or fork_build.find_cuobjdump() is None:
        return {}
    found = {}
    for obj in objects:
        try:
            found[obj] = fork_build.list_cubins(build_dir / obj)
        except KimiError as exc:
            found[obj] = [f"error: {exc}"]
    return found


def _missing_objects(build_dir: Path, units: list[dict]) -> list[str]:
    """The unit objects ``build.ninja`` has no build statement for."""
    if not units:
        return []
    try:
        ninja = (build_dir / "build.ninja").read_text(errors="replace")
    except OSError:
        return [u["object"] for u in units]
    return [u["object"] for u in units if f"build {u['object']}:" not in ninja
            and f"build {u['object'].replace(':', '$:')}:" not in ninja]
