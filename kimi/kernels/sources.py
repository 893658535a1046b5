"""vLLM's CMake external sources for a from-source build, and the tools the package index has.

Upstream's CMake clones CUTLASS, FlashMLA, flash-attention, DeepGEMM, QuTLASS, ... from the
network unless each is given as a local folder through its ``*_SRC_DIR`` environment variable.
:func:`external_sources` reads the laid tree (``CMakeLists.txt``, ``cmake/external_projects``)
for those variables and the repository and tag each would clone, and says which are present.
:func:`fetch_cuobjdump` and :func:`fetch_cutlass_headers` get what the package index has
(``nvidia-cuda-cuobjdump``; ``nvidia-cutlass`` headers, another CUTLASS release than the pinned
one and without CUTLASS's CMakeLists.txt, so usable as ``CUTLASS_INCLUDE_DIR``, not as
``VLLM_CUTLASS_SRC_DIR``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from kimi.errors import KimiError

_ENV_RE = re.compile(r"\bENV\{([A-Z0-9_]+_SRC_DIR)\}")
_SET_RE = re.compile(r'set\(\s*([A-Z0-9_]+)\s+"?([^")\s]+)"?\s*\)')


@dataclass
class ExternalSource:
    """One ``*_SRC_DIR`` variable of upstream's CMake build."""

    variable: str
    cmake_file: str
    repository: str
    tag: str
    path: str  # the folder it would use: the variable's value, else .kimi/sources/<name>
    present: bool

    def as_dict(self) -> dict:
        return asdict(self)


def _resolve(text: str, sets: dict[str, str]) -> str:
    return re.sub(r"\$\{([A-Za-z0-9_]+)\}", lambda m: sets.get(m.group(1), m.group(0)), text)


def external_sources(root: Path, sources_dir: Path | None = None) -> list[ExternalSource]:
    """Each ``*_SRC_DIR`` variable the laid tree at ``root`` reads, with the repository and tag
    it would clone and whether a local folder is there (``$VAR``, else ``sources_dir/<name>``
    with ``<name>`` the variable without ``_SRC_DIR`` in lower case).

    Raises KimiError when ``root`` has no laid vLLM tree (run ``kimi sync``).
    """
    files = [root / "CMakeLists.txt", *sorted((root / "cmake" / "external_projects").glob("*.cmake"))]
    if not files[0].is_file():
        raise KimiError(f"no CMakeLists.txt at {root}: lay the upstream tree first with `python3 -m kimi sync`")
    sources_dir = sources_dir or root / ".kimi" / "sources"
    found: dict[str, ExternalSource] = {}
    for path in files:
        text = path.read_text(errors="replace")
        sets = dict(_SET_RE.findall(text))
        repos = [_resolve(r, sets) for r in re.findall(r"GIT_REPOSITORY\s+\"?([^\"\s)]+)", text)]
        tags = [_resolve(t, sets) for t in re.findall(r"GIT_TAG\s+\"?([^\"\s)]+)", text)]
        for variable in dict.fromkeys(_ENV_RE.findall(text)):
            if variable in found:
                continue
            default = sources_dir / variable.removesuffix("_SRC_DIR").lower()
            local = Path(os.environ[variable]) if os.environ.get(variable) else default
            found[variable] = ExternalSource(
                variable=variable, cmake_file=str(path.relative_to(root)), repository=repos[0] if repos else "?",
                tag=tags[0] if tags else "?", path=str(local), present=local.is_dir() and any(local.iterdir()))
    return list(found.values())


def render(sources: list[ExternalSource]) -> str:
    """A table of the external sources and the environment to export for the present ones."""
    lines = []
    for s in sources:
        state = "present" if s.present else "MISSING"
        lines.append(f"{s.variable:<24} {state:<8} {s.path}\n{'':<33}clones {s.repository} @ {s.tag} ({s.cmake_file})")
    present = [s for s in sources if s.present]
    if present:
        lines.append("\nexport " + " ".join(f"{s.variable}={s.path}" for s in present))
    missing = [s for s in sources if not s.present]
    if missing:
        lines.append(f"\n{len(missing)} missing: copy each repository at its tag to the path shown (or set the "
                     "variable); none of them is on the package index.")
    return "\n".join(lines)


def _pip_download(requirement: str, dest: Path) -> Path:
    """``pip download --no-deps`` one wheel into ``dest``; returns its path."""
    from kimi.fork.index import index_url

    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest),
           "--index-url", index_url(), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise KimiError(f"pip download {requirement} failed:\n{proc.stderr.strip()[-2000:]}")
    new = set(dest.glob("*.whl")) - before
    name = re.split(r"[<>=!~ ]", requirement)[0].replace("-", "_").lower()
    wheels = sorted(new or {w for w in dest.glob("*.whl") if w.name.lower().startswith(name)})
    if not wheels:
        raise KimiError(f"pip download {requirement} left no wheel in {dest}")
    return wheels[-1]


def fetch_cuobjdump(root: Path, cache: Path) -> Path:
    """Put a CUDA 13 ``cuobjdump`` from the ``nvidia-cuda-cuobjdump`` wheel at
    ``root/.kimi/tools/bin/cuobjdump`` (where kimi.kernels.build looks); returns the path."""
    wheel = _pip_download("nvidia-cuda-cuobjdump>=13,<14", cache)
    dest = root / ".kimi" / "tools" / "bin" / "cuobjdump"
    with zipfile.ZipFile(wheel) as zf:
        member = next((n for n in zf.namelist() if n.endswith("/bin/cuobjdump")), None)
        if member is None:
            raise KimiError(f"{wheel.name} holds no bin/cuobjdump")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(".tmp")
        tmp.write_bytes(zf.read(member))
        tmp.chmod(0o755)
        tmp.replace(dest)
    return dest


def fetch_cutlass_headers(root: Path, cache: Path) -> Path:
    """Unpack the ``nvidia-cutlass`` wheel's ``include`` folder (the one holding
    ``cutlass/cutlass.h`` and ``cute/``) to ``root/.kimi/sources/cutlass-headers/include``."""
    wheel = _pip_download("nvidia-cutlass", cache)
    dest = root / ".kimi" / "sources" / "cutlass-headers"
    with zipfile.ZipFile(wheel) as zf:
        heads = [n for n in zf.namelist() if n.endswith("include/cutlass/cutlass.h")]
        if not heads:
            raise KimiError(f"{wheel.name} holds no include/cutlass/cutlass.h")
        prefix = heads[0].removesuffix("cutlass/cutlass.h")
        staged = Path(tempfile.mkdtemp(dir=root / ".kimi", prefix=".cutlass-"))
        try:
            for name in zf.namelist():
                if name.startswith(prefix) and not name.endswith("/"):
                    out = staged / "include" / name[len(prefix):]
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(zf.read(name))
            (staged / "WHEEL").write_text(wheel.name + "\n")
            if dest.exists():
                shutil.rmtree(dest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            staged.rename(dest)
        finally:
            shutil.rmtree(staged, ignore_errors=True)
    return dest / "include"
