"""vLLM's CMake external sources for a from-source build, and what the package index has of them.

Upstream's CMake clones CUTLASS, FlashMLA, flash-attention, DeepGEMM, QuTLASS, ... from the
network unless each is given as a local folder through its ``*_SRC_DIR`` environment variable
(``CMakeLists.txt``: ``VLLM_CUTLASS_SRC_DIR``; ``cmake/external_projects/*.cmake``: the others).
:func:`external_sources` reads the laid tree for those variables and the repository and revision
each would clone, and says which local folders are there, complete and at which revision. Every
fact comes from the laid tree, so the same code serves each release: the v0.26 line's has eight
sources (CUTLASS v4.4.2), the v0.32 line's ten (DeepSelect and FlashKDA added; CUTLASS v4.7.1).

Complete means holding what :func:`required_files` lists: the entries of :data:`REQUIRED` that
every release needs (a submodule's headers, a file tools/build_deepgemm_C.py reads, ...) plus what
the source's CMake file of the laid tree names itself: the code files it compiles, reads or depends on
(``${<name>_SOURCE_DIR}/...``, through ``set()`` aliases such as ``FMHA_SM100_PY_ROOT``), the folders it
installs, and its ``GIT_SUBMODULES`` (DeepGEMM's ``third-party/fmt`` on the v0.26 line,
``third-party/deep_jit`` on the v0.32 line), each a folder that must not be empty.

:mod:`kimi.kernels.fill_sources` fills the folders.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kimi.errors import KimiError

_ENV_RE = re.compile(r"\bENV\{([A-Z0-9_]+_SRC_DIR)\}")
_SET_RE = re.compile(r'set\(\s*([A-Z0-9_]+)\s+"?([^")\s]+)"?\s*\)')
_SHA_RE = re.compile(r"^[0-9a-f]{40}$")
PROVENANCE = ".kimi-source.json"  # written by prepare into each folder it fills

# Files and folders each source must hold whatever the release, relative to its *_SRC_DIR (submodule
# headers, include folders, what tools/build_deepgemm_C.py and flash-attention's own CMakeLists.txt
# read); required_files() adds what the laid tree's CMake file names. A trailing "/": a folder that
# must not be empty (a submodule that was not checked out is an empty folder).
REQUIRED: dict[str, tuple[str, ...]] = {
    "VLLM_CUTLASS_SRC_DIR": ("include/cutlass/cutlass.h", "include/cute/tensor.hpp",
                             "tools/util/include/cutlass/util/packed_stride.hpp",
                             "python/cutlass_library/__init__.py",    # ${CUTLASS_DIR}/python: machete generate.py
                             "examples/77_blackwell_fmha", "examples/common"),  # CUTLASS MLA sm100
    "FLASH_MLA_SRC_DIR": ("flash_mla/flash_mla_interface.py", "csrc/api/api.cpp", "csrc/kerutils/include",
                          "csrc/cutlass/include/cutlass/cutlass.h"),
    "VLLM_FLASH_ATTN_SRC_DIR": ("CMakeLists.txt", "csrc/flash_attn/flash_api.cpp", "hopper/flash_api.cpp",
                                "csrc/cutlass/include/cutlass/cutlass.h", "vllm_flash_attn", "flash_attn/cute"),
    "DEEPGEMM_SRC_DIR": ("csrc/python_api.cpp", "deep_gemm/__init__.py", "deep_gemm/include",
                         "third-party/cutlass/include/cutlass/cutlass.h"),
    "QUTLASS_SRC_DIR": ("qutlass/csrc/bindings.cpp", "qutlass/csrc/gemm.cu"),
    "FMHA_SM100_SRC_DIR": ("python/fmha_sm100/api.py", "python/fmha_sm100/csrc", "python/fmha_sm100/cute",
                           "python/fmha_sm100/cutlass/include", "python/fmha_sm100/cutlass/tools/util/include"),
    "TML_FA4_SRC_DIR": ("flash_attn/cute/interface.py",),
    "TRITON_KERNELS_SRC_DIR": ("__init__.py", "matmul_ogs.py"),  # the triton_kernels package folder itself
    # from the v0.32 line on
    "DEEPSELECT_SRC_DIR": ("csrc/api.cpp", "csrc/3rdparty/cutlass/include/cutlass/cutlass.h",
                           "csrc/3rdparty/kerutils/include"),
    "FLASH_KDA_SRC_DIR": ("csrc/flash_kda.cpp", "cutlass/include/cutlass/cutlass.h", "cutlass/examples/common",
                          "cutlass/tools/util/include/cutlass/util/packed_stride.hpp"),
}
CODE_EXT = (".cu", ".cpp", ".cc", ".c", ".py")  # what a CMake file names as a file, not a folder

# Where inside the upstream repository the *_SRC_DIR folder is (triton_kernels.cmake: the env
# variable names python/triton_kernels/triton_kernels of the triton repository).
SUBDIR = {"TRITON_KERNELS_SRC_DIR": "python/triton_kernels/triton_kernels"}
# Sources that only the pinned vLLM wheel's installed copy provides from the package index.
FROM_VLLM_WHEEL = {
    "FMHA_SM100_SRC_DIR": ("vllm/third_party/fmha_sm100/", "python/fmha_sm100/"),
    "TML_FA4_SRC_DIR": ("vllm/third_party/tml_fa4/", "flash_attn/cute/"),
    "TRITON_KERNELS_SRC_DIR": ("vllm/third_party/triton_kernels/", ""),
}


@dataclass
class ExternalSource:
    """One ``*_SRC_DIR`` variable of upstream's CMake build and the local folder for it.

    ``present``: the folder holds everything of ``required`` (:func:`required_files`);
    ``missing_files`` lists the absent ones; ``revision``: what the folder is (git HEAD, or the
    provenance prepare wrote), ``revision_ok`` whether it is the pinned ``tag`` (None: cannot tell).
    """

    variable: str
    cmake_file: str
    repository: str
    tag: str
    path: str  # the folder it would use: the variable's value, else .kimi/sources/<name>
    present: bool
    missing_files: list[str] = field(default_factory=list)
    revision: str | None = None
    revision_ok: bool | None = None
    origin: str | None = None
    required: list[str] = field(default_factory=list)  # required_files() of the laid tree

    @property
    def name(self) -> str:
        """The folder name under ``.kimi/sources`` (``VLLM_CUTLASS_SRC_DIR`` -> ``vllm_cutlass``)."""
        return source_name(self.variable)

    @property
    def repo_name(self) -> str:
        """The repository's name (``https://github.com/nvidia/cutlass.git`` -> ``cutlass``)."""
        return self.repository.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")

    def how_to_provide(self) -> str:
        """One line: what to put where for this source."""
        sub = f" (its {SUBDIR[self.variable]} folder)" if self.variable in SUBDIR else ""
        index = ""
        if self.variable == "VLLM_CUTLASS_SRC_DIR":
            index = ("; or `kimi kernels prepare --fetch` (the package index's nvidia-cutlass, 4.2.0, with the "
                     "pinned vLLM wheel's newer CUTLASS headers where it has them: not the pinned revision)")
        elif self.variable in FROM_VLLM_WHEEL:
            index = "; or `kimi kernels prepare --fetch` (the pinned vLLM CUDA wheel's copy)"
        return (f"a checkout of {self.repository} at {self.tag}{sub}, with its submodules, at {self.path} "
                f"(or set {self.variable}, or put it in DIR as {self.repo_name}/ or "
                f"{self.repo_name}-<revision>.tar.gz for `kimi kernels prepare --from DIR`){index}")

    def as_dict(self) -> dict:
        return {**asdict(self), "name": self.name}


def source_name(variable: str) -> str:
    """``VLLM_CUTLASS_SRC_DIR`` -> ``vllm_cutlass`` (the folder name under the sources dir)."""
    return variable.removesuffix("_SRC_DIR").lower()


def default_sources_dir(root: Path) -> Path:
    """``$KIMI_SOURCES_DIR`` or ``ROOT/.kimi/sources`` (git-ignored)."""
    env = os.environ.get("KIMI_SOURCES_DIR")
    return Path(env).resolve() if env else root / ".kimi" / "sources"


def _resolve(text: str, sets: dict[str, str]) -> str:
    return re.sub(r"\$\{([A-Za-z0-9_]+)\}", lambda m: sets.get(m.group(1), m.group(0)), text)


_SOURCE_REF_RE = re.compile(r"\$\{([\w-]+)_SOURCE_DIR\}/([\w./*+-]*)")
_SUBMODULES_RE = re.compile(r"GIT_SUBMODULES((?:\s+\"?[\w./+-]+\"?)+)")
_KEYWORD_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")  # GIT_PROGRESS, TRUE, ...: the end of a value list


def _strip_comments(text: str) -> str:
    return re.sub(r"(?m)#.*$", "", text)


def tree_required(variable: str, cmake_text: str) -> list[str]:
    """What the CMake file ``cmake_text`` of ``variable`` names inside the source, relative to it: each code
    file (:data:`CODE_EXT`) under ``${<name>_SOURCE_DIR}/`` (also through a ``set()`` alias of such a path),
    each folder it installs (a path ending in ``/``) and each ``GIT_SUBMODULES`` entry (as ``<sub>/``: a
    folder that must not be empty). ``${CMAKE_SOURCE_DIR}`` paths are vLLM's own; for a variable that
    names a folder inside its repository (:data:`SUBDIR`), the paths of the clone's layout are left out.
    """
    text = _strip_comments(cmake_text)
    aliases = {k: v for k, v in _SET_RE.findall(text) if re.match(r"\$\{[\w-]+_SOURCE_DIR\}/", v)
               and not v.startswith("${CMAKE_")}
    text = re.sub(r"\$\{([A-Za-z0-9_]+)\}", lambda m: aliases.get(m.group(1), m.group(0)), text)
    found: list[str] = []
    skip = SUBDIR.get(variable, "\0")
    for name, rel in _SOURCE_REF_RE.findall(text):
        if name == "CMAKE" or name.startswith("CMAKE_") or not rel or "*" in rel or ".." in rel.split("/") \
                or rel.startswith(skip):
            continue  # vLLM's own files, a glob, or the clone's layout of a SUBDIR source
        if rel.endswith(CODE_EXT) or rel.endswith("/"):
            found.append(rel)
    for group in _SUBMODULES_RE.findall(text):
        for token in group.split():
            if _KEYWORD_RE.match(token):
                break
            found.append(token.strip('"').rstrip("/") + "/")
    return list(dict.fromkeys(found))


def required_files(variable: str, cmake_text: str = "") -> list[str]:
    """What a complete folder for ``variable`` holds: :data:`REQUIRED` (every release) and
    :func:`tree_required` of its CMake file in the laid tree."""
    need = list(REQUIRED.get(variable, ()))
    return list(dict.fromkeys(need + tree_required(variable, cmake_text))) if cmake_text else need


def _lacks(path: Path, rel: str) -> bool:
    if rel.endswith("/"):
        folder = path / rel
        return not folder.is_dir() or not any(folder.iterdir())
    return not (path / rel).exists()


def missing_files(variable: str, path: Path, need: list[str] | None = None) -> list[str]:
    """The entries of ``need`` (default :data:`REQUIRED`) that ``path`` lacks, a ``/``-ended one
    lacking when that folder is absent or empty (all of them when ``path`` is not a folder)."""
    need = list(REQUIRED.get(variable, ())) if need is None else need
    if not path.is_dir():
        return list(need) or ["(the folder)"]
    return [rel for rel in need if _lacks(path, rel)] if need else ([] if any(path.iterdir()) else
                                                                      ["(any file)"])


def _git_head(path: Path) -> str | None:
    if not (path / ".git").exists():
        return None
    proc = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def _git_resolves(path: Path, tag: str) -> str | None:
    proc = subprocess.run(["git", "-C", str(path), "rev-parse", "--verify", "-q", f"{tag}^{{commit}}"],
                          capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def same_revision(have: str, want: str) -> bool:
    """Whether revision ``have`` is the pinned ``want``: equal commits (a 7+ digit prefix of a
    sha counts) or equal versions (``v4.4.2`` = ``4.4.2``)."""
    a, b = have.strip().lower().removeprefix("v"), want.strip().lower().removeprefix("v")
    if _SHA_RE.match(b) and re.fullmatch(r"[0-9a-f]{7,40}", a):
        return b.startswith(a)
    return a == b


def revision_of(path: Path, tag: str) -> tuple[str | None, bool | None, str | None]:
    """(revision, matches ``tag``, origin) of a source folder: git HEAD for a checkout (checked
    against ``tag`` resolved in that checkout), else the provenance prepare wrote; (None, None, None)
    when it cannot tell."""
    head = _git_head(path)
    if head:
        wanted = tag if _SHA_RE.match(tag) else _git_resolves(path, tag)
        return head, (head == wanted) if wanted else same_revision(head, tag), "git checkout"
    info = path / PROVENANCE
    if info.is_file():
        try:
            data = json.loads(info.read_text())
        except ValueError:
            return None, None, None
        revision = data.get("revision")
        return revision, same_revision(revision, tag) if revision else None, data.get("origin")
    return None, None, None


def external_sources(root: Path, sources_dir: Path | None = None) -> list[ExternalSource]:
    """Each ``*_SRC_DIR`` variable the laid tree at ``root`` reads, with the repository and tag
    it would clone and the local folder for it (``$VAR``, else ``sources_dir/<name>`` with
    ``<name>`` the variable without ``_SRC_DIR`` in lower case): complete or not, at which revision.

    Raises KimiError when ``root`` has no laid vLLM tree (run ``kimi sync``).
    """
    files = [root / "CMakeLists.txt", *sorted((root / "cmake" / "external_projects").glob("*.cmake"))]
    if not files[0].is_file():
        raise KimiError(f"no CMakeLists.txt at {root}: lay the upstream tree first with `python3 -m kimi sync`")
    sources_dir = sources_dir or default_sources_dir(root)
    found: dict[str, ExternalSource] = {}
    for path in files:
        text = path.read_text(errors="replace")
        sets = dict(_SET_RE.findall(text))
        repos = [_resolve(r, sets) for r in re.findall(r"GIT_REPOSITORY\s+\"?([^\"\s)]+)", text)]
        tags = [_resolve(t, sets) for t in re.findall(r"GIT_TAG\s+\"?([^\"\s)]+)", text)]
        if not tags and not repos:
            # fetched as a source archive (the mainline's triton_kernels): set(X_TAG ...) and set(X_GIT ...); the last
            # set() of each wins, as in _SET_RE's dict: the CUDA branch follows the ROCm one
            tags = [v for k, v in sets.items() if k.endswith("_TAG")]
            repos = [v for k, v in sets.items() if k.endswith("_GIT") and v.startswith("https://github.com/")]
        for variable in dict.fromkeys(_ENV_RE.findall(text)):
            if variable in found:
                continue
            local = Path(os.environ[variable]) if os.environ.get(variable) else sources_dir / source_name(variable)
            tag = tags[0] if tags else "?"
            need = required_files(variable, text) if path.parent.name == "external_projects" else \
                required_files(variable)
            missing = missing_files(variable, local, need)
            revision, ok, origin = revision_of(local, tag) if local.is_dir() else (None, None, None)
            found[variable] = ExternalSource(
                variable=variable, cmake_file=str(path.relative_to(root)), repository=repos[0] if repos else "?",
                tag=tag, path=str(local), present=not missing, missing_files=missing, revision=revision,
                revision_ok=ok, origin=origin, required=need)
    return list(found.values())


def render(sources: list[ExternalSource]) -> str:
    """A table of the external sources, the environment to export for the present ones, and for
    each missing one what to provide."""
    lines = []
    for s in sources:
        state = "present" if s.present else ("MISSING" if not Path(s.path).exists() else "INCOMPLETE")
        lines.append(f"{s.variable:<24} {state:<10} {s.path}")
        lines.append(f"{'':<35}pinned: {s.repository} @ {s.tag} ({s.cmake_file})")
        if s.revision:
            verdict = {True: "the pinned revision", False: "NOT the pinned revision", None: "unchecked"}[s.revision_ok]
            lines.append(f"{'':<35}have: {s.revision} ({s.origin or 'local'}): {verdict}")
        if s.present is False and Path(s.path).exists():
            more = len(s.missing_files) - 8
            lines.append(f"{'':<35}lacks: {', '.join(s.missing_files[:8])}" + (f" and {more} more" if more > 0 else ""))
    present = [s for s in sources if s.present]
    if present:
        lines.append("\nexport " + " ".join(f"{s.variable}={s.path}" for s in present))
    missing = [s for s in sources if not s.present]
    if missing:
        lines.append(f"\n{len(missing)} missing:")
        lines += [f"  {s.variable}: {s.how_to_provide()}" for s in missing]
    other = [s for s in sources if s.present and s.revision_ok is False]
    if other:
        lines.append("\nnot the pinned revision (a build uses them, and says so): "
                     + ", ".join(f"{s.variable} ({s.revision} instead of {s.tag})" for s in other))
    return "\n".join(lines)
