"""Build the fork's own CUDA kernels with nvcc, and list the cubins a built library carries.

The draft-head kernels (``csrc/draft_head.cu``) have a C interface and link the CUDA runtime
statically, so the library needs neither torch headers nor libtorch: it builds with nvcc
alone (seconds, no Python version or torch ABI baked in) and the Python side calls it through
``ctypes`` on raw device pointers (``kimi.kernels.draft_head``).

A build goes to ``<build root>/draft_head-<key>/`` (``key`` hashes the source, the flags and
the nvcc version) with ``libkimi_draft_head.so`` and ``build.json`` (command, seconds, nvcc
version, architectures, source digest). The build root is ``$KIMI_KERNELS_BUILD_DIR`` or
``.kimi/build/kernels`` in the checkout (git-ignored).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kimi.errors import KimiError

SOURCE = Path(__file__).resolve().parent / "csrc" / "draft_head.cu"
LIBRARY_NAME = "libkimi_draft_head.so"
DEFAULT_ARCHS = ("9.0a", "10.0a")  # Hopper H100/H200, Blackwell B200/GB200
_ARCH_RE = re.compile(r"^(?:sm_)?(\d+)\.?(\d)([af]?)$")


def default_build_root() -> Path:
    """``$KIMI_KERNELS_BUILD_DIR`` or ``.kimi/build/kernels`` of this checkout."""
    env = os.environ.get("KIMI_KERNELS_BUILD_DIR")
    if env:
        return Path(env).resolve()
    from kimi.fork.layout import Layout

    return Layout.of().private / "build" / "kernels"


def parse_archs(text: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``"9.0a;10.0a"`` (TORCH_CUDA_ARCH_LIST style; ``,`` or spaces also separate; ``sm_90a`` too)
    -> ``("9.0a", "10.0a")``. Raises KimiError on anything else."""
    items = re.split(r"[;,\s]+", text.strip()) if isinstance(text, str) else list(text)
    archs: list[str] = []
    for item in filter(None, items):
        match = _ARCH_RE.match(item.strip())
        if not match:
            raise KimiError(f"bad CUDA architecture {item!r}: write it as in TORCH_CUDA_ARCH_LIST, e.g. '9.0a;10.0a'")
        major, minor, suffix = match.groups()
        arch = f"{major}.{minor}{suffix}"
        if arch not in archs:
            archs.append(arch)
    if not archs:
        raise KimiError("no CUDA architecture given: e.g. --arch '9.0a;10.0a'")
    return tuple(archs)


def sm_name(arch: str) -> str:
    """``"9.0a"`` -> ``"sm_90a"`` (the name cuobjdump prints for the cubin)."""
    major, minor, suffix = _ARCH_RE.match(arch).groups()  # type: ignore[union-attr]
    return f"sm_{major}{minor}{suffix}"


def gencode_flags(archs: tuple[str, ...]) -> list[str]:
    """nvcc flags for one cubin per architecture (no PTX: ``a`` targets cannot run PTX forward)."""
    flags = []
    for arch in archs:
        sm = sm_name(arch)
        flags += ["-gencode", f"arch=compute_{sm[3:]},code={sm}"]
    return flags


def _cuda_homes() -> list[Path]:
    homes = [Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    return [*homes, Path("/usr/local/cuda")]


def _wheel_bins() -> list[Path]:
    """``nvidia/cu13/bin`` (and cu12) of the running interpreter's site-packages, where the
    ``nvidia-cuda-nvcc`` / ``nvidia-cuda-cuobjdump`` wheels put their tools."""
    found = []
    for entry in sys.path:
        for sub in ("cu13", "cu12"):
            path = Path(entry or ".") / "nvidia" / sub / "bin"
            if path.is_dir():
                found.append(path)
    return found


def find_nvcc() -> Path | None:
    """``$NVCC``, ``$CUDA_HOME/bin/nvcc``, ``nvcc`` on PATH, ``/usr/local/cuda/bin/nvcc``, an
    ``nvidia-cuda-nvcc`` wheel; None when there is none."""
    if os.environ.get("NVCC"):
        return Path(os.environ["NVCC"])
    candidates = [home / "bin" / "nvcc" for home in _cuda_homes()[:-1]]
    on_path = shutil.which("nvcc")
    candidates += [Path(on_path)] if on_path else []
    candidates += [_cuda_homes()[-1] / "bin" / "nvcc", *(b / "nvcc" for b in _wheel_bins())]
    return next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def tool_release(tool: Path) -> tuple[int, int] | None:
    """The CUDA release a CUDA tool reports with ``--version`` (``(13, 0)``), or None."""
    try:
        out = subprocess.run([str(tool), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"release (\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else None


def find_cuobjdump(at_least: tuple[int, int] | None = (13, 0)) -> Path | None:
    """A cuobjdump of CUDA ``at_least`` or newer: ``$CUOBJDUMP``, next to nvcc, PATH, the
    CUDA homes, ``.kimi/tools/bin`` of the checkout, an ``nvidia-cuda-cuobjdump`` wheel, triton's
    copy. An older one misreads CUDA 13 fat binaries (it prints ``sm_90`` for ``sm_90a``)."""
    if os.environ.get("CUOBJDUMP"):
        return Path(os.environ["CUOBJDUMP"])
    candidates: list[Path] = []
    nvcc = find_nvcc()
    if nvcc:
        candidates.append(nvcc.parent / "cuobjdump")
    on_path = shutil.which("cuobjdump")
    candidates += [Path(on_path)] if on_path else []
    candidates += [home / "bin" / "cuobjdump" for home in _cuda_homes()]
    candidates.append(Path(__file__).resolve().parents[2] / ".kimi" / "tools" / "bin" / "cuobjdump")
    candidates += [b / "cuobjdump" for b in _wheel_bins()]
    for entry in sys.path:
        candidates.append(Path(entry or ".") / "triton" / "backends" / "nvidia" / "bin" / "cuobjdump")
    for tool in candidates:
        if tool.is_file() and os.access(tool, os.X_OK):
            release = tool_release(tool)
            if at_least is None or (release is not None and release >= at_least):
                return tool
    return None


def source_digest() -> str:
    """sha256 of the kernel source."""
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()


def compile_command(nvcc: Path, archs: tuple[str, ...], output: Path, threads: int = 2) -> list[str]:
    """The nvcc command line that builds the library from SOURCE.

    ``-nodlink`` skips the device-link step (it would add empty link cubins to the fat binary);
    hidden visibility plus ``--exclude-libs`` keeps the static CUDA runtime's symbols private.
    """
    return [str(nvcc), "-O3", "-std=c++17", "-shared", "-nodlink", "-Xcompiler", "-fPIC,-fvisibility=hidden",
            "-Xlinker", "--exclude-libs,ALL", *gencode_flags(archs), "--threads", str(max(1, threads)),
            str(SOURCE), "-o", str(output)]


@dataclass
class BuildResult:
    """One built library and how it was made (also written as ``build.json`` beside it)."""

    library: str
    archs: list[str]
    seconds: float
    command: list[str]
    nvcc: str
    nvcc_release: str
    source_sha256: str
    host: str
    date: str
    cached: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def build(archs: tuple[str, ...] = DEFAULT_ARCHS, *, build_root: Path | None = None, nvcc: Path | None = None,
          threads: int = 2, force: bool = False) -> BuildResult:
    """Build (or reuse) the draft-head library for ``archs``.

    Args:
        archs: architectures as in TORCH_CUDA_ARCH_LIST (``("9.0a", "10.0a")``).
        build_root: where builds go (default: :func:`default_build_root`).
        nvcc: the compiler (default: :func:`find_nvcc`).
        threads: nvcc ``--threads`` (architectures compiled in parallel); 2 suits a 2-core machine.
        force: rebuild even when a build of the same source, flags and nvcc exists.

    Returns the BuildResult (``cached`` True when an existing build was reused).
    Raises KimiError when nvcc is missing or the compile fails (with nvcc's output).
    """
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise KimiError("nvcc not found: install the CUDA toolkit (13.0 for torch 2.11 +cu130) or set CUDA_HOME / NVCC")
    release = tool_release(nvcc)
    if release is None:
        raise KimiError(f"{nvcc} --version did not report a CUDA release")
    build_root = build_root or default_build_root()
    flags_key = " ".join(compile_command(Path("nvcc"), archs, Path("out"), 1))
    key = hashlib.sha256(f"{source_digest()}\n{flags_key}\n{release}".encode()).hexdigest()[:12]
    out_dir = build_root / f"draft_head-{key}"
    info_path = out_dir / "build.json"
    if info_path.is_file() and (out_dir / LIBRARY_NAME).is_file() and not force:
        info = json.loads(info_path.read_text())
        return BuildResult(**{**info, "library": str(out_dir / LIBRARY_NAME), "cached": True})
    build_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=build_root, prefix=".tmp-"))
    try:
        staged = tmp / LIBRARY_NAME
        command = compile_command(nvcc, archs, staged, threads)
        start = time.monotonic()
        proc = subprocess.run(command, capture_output=True, text=True)
        seconds = round(time.monotonic() - start, 2)
        if proc.returncode != 0:
            raise KimiError(f"nvcc failed (exit {proc.returncode}):\n{' '.join(command)}\n{proc.stdout}{proc.stderr}")
        result = BuildResult(
            library=str(out_dir / LIBRARY_NAME), archs=list(archs), seconds=seconds,
            command=[*command[:-1], str(out_dir / LIBRARY_NAME)], nvcc=str(nvcc),
            nvcc_release=f"{release[0]}.{release[1]}", source_sha256=source_digest(), host=socket.gethostname(),
            date=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        (tmp / "build.json").write_text(json.dumps(result.as_dict(), indent=2) + "\n")
        tmp.chmod(0o755)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def find_library(build_root: Path | None = None) -> Path | None:
    """The library to load: ``$KIMI_DRAFT_HEAD_LIB``, else the newest build under the build root
    made from the current source; None when there is none."""
    env = os.environ.get("KIMI_DRAFT_HEAD_LIB")
    if env:
        return Path(env)
    root = build_root or default_build_root()
    digest = source_digest()
    builds = []
    for info_path in root.glob("draft_head-*/build.json"):
        try:
            info = json.loads(info_path.read_text())
        except (OSError, ValueError):
            continue
        library = info_path.parent / LIBRARY_NAME
        if info.get("source_sha256") == digest and library.is_file():
            builds.append((info_path.stat().st_mtime, library))
    return max(builds)[1] if builds else None


def list_cubins(library: Path, cuobjdump: Path | None = None) -> list[str]:
    """The architectures of the cubins in ``library`` per ``cuobjdump --list-elf``
    (``["sm_90a", "sm_100a"]``), in file order without repeats.

    Raises KimiError when no cuobjdump of CUDA 13 or newer is found or it fails.
    """
    tool = cuobjdump or find_cuobjdump()
    if tool is None:
        raise KimiError("no cuobjdump of CUDA 13 or newer: install the CUDA toolkit, or "
                        "`pip install nvidia-cuda-cuobjdump`, or set CUOBJDUMP")
    proc = subprocess.run([str(tool), "--list-elf", str(library)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise KimiError(f"{tool} --list-elf {library} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    found: list[str] = []
    for match in re.finditer(r"ELF file\s+\d+:\s+\S*?\.(sm_\d+[af]?)\.cubin", proc.stdout):
        if match.group(1) not in found:
            found.append(match.group(1))
    return found


def list_elf_text(library: Path, cuobjdump: Path | None = None) -> str:
    """The raw ``cuobjdump --list-elf`` output (for reports)."""
    tool = cuobjdump or find_cuobjdump()
    if tool is None:
        return ""
    return subprocess.run([str(tool), "--list-elf", str(library)], capture_output=True, text=True).stdout
