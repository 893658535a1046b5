"""Filling ``.kimi/sources/<name>``, the local source folders of ``kimi kernels build-vllm``
(:mod:`kimi.kernels.sources` says which folders a tree needs and when one is complete).

:func:`prepare` fills them offline or from the package index:

* CUTLASS from the ``nvidia-cutlass`` wheel: it holds CUTLASS's ``include/``, ``tools/util/include``,
  ``examples/`` and the ``cutlass_library`` Python package (machete's generator imports it from
  ``${CUTLASS_DIR}/python``), but not CUTLASS's top-level ``CMakeLists.txt``, and the index has only
  4.2.0 (the v0.26 line's vLLM pins v4.4.2, the v0.32 line's v4.7.1). Where the pinned vLLM wheel's MSA copy carries
  newer CUTLASS headers (4.3.4 in the v0.26 line's wheel, 4.8.0 in the v0.32 line's), those replace ``include/`` and
  ``tools/util/include``. The revision against the pin is recorded and reported.
* fmha_sm100 (MSA), tml-fa4 and triton_kernels from the pinned vLLM CUDA wheel: upstream's CMake
  only copies their Python files and headers into the wheel (``install()`` rules of
  ``fmha_sm100.cmake``, ``tml_fa4.cmake``, ``triton_kernels.cmake``), so the installed files are the
  whole of what the build uses (tml-fa4's import rewrite is undone).
* anything from ``--from DIR``: git checkouts (``DIR/<repository name>``, revision checked),
  unpacked trees or archives (``DIR/<repository name>-<revision>.tar.gz`` / ``.zip``, as a forge's
  archive download names them), and the two wheels above.

FlashMLA, flash-attention, DeepGEMM, QuTLASS and (from the v0.32 line) DeepSelect and FlashKDA compile C++/CUDA
sources that no package on the index carries (the vLLM wheel holds only their built libraries and, for
DeepGEMM, its Python files and JIT headers); they must come from ``--from DIR`` with their git
submodules (FlashMLA's and flash-attention's ``csrc/cutlass``, DeepGEMM's ``third-party/*``,
DeepSelect's ``csrc/3rdparty/*``, FlashKDA's ``cutlass``).

:func:`fetch_cuobjdump` gets a CUDA 13 ``cuobjdump`` from the ``nvidia-cuda-cuobjdump`` wheel.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from kimi.errors import KimiError
from kimi.kernels.sources import (
    FROM_VLLM_WHEEL,
    PROVENANCE,
    SUBDIR,
    ExternalSource,
    default_sources_dir,
    external_sources,
)


def _write_provenance(folder: Path, origin: str, revision: str | None, **extra: object) -> None:
    from kimi.fork.fsutil import write_json_atomic

    write_json_atomic(folder / PROVENANCE, {"origin": origin, "revision": revision, **extra})


def _unzip_prefix(zf: zipfile.ZipFile, prefix: str, dest: Path, rewrite: tuple[str, str] | None = None) -> int:
    """Extract the members under ``prefix`` to ``dest`` (the prefix stripped); ``rewrite`` replaces
    a string in ``.py`` files. Returns the number of files."""
    count = 0
    for name in zf.namelist():
        if not name.startswith(prefix) or name.endswith("/") or "/__pycache__/" in name:
            continue
        out = dest / name[len(prefix):]
        out.parent.mkdir(parents=True, exist_ok=True)
        data = zf.read(name)
        if rewrite and name.endswith(".py"):
            data = data.replace(rewrite[0].encode(), rewrite[1].encode())
        out.write_bytes(data)
        count += 1
    return count


def cutlass_version(include: Path) -> str | None:
    """``"4.2.0"`` from ``include/cutlass/version.h``, or None."""
    try:
        text = (include / "cutlass" / "version.h").read_text(errors="replace")
    except OSError:
        return None
    parts = [re.search(rf"#define CUTLASS_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts) if all(parts) else None  # type: ignore[union-attr]


VLLM_WHEEL_CUTLASS = "vllm/third_party/fmha_sm100/cutlass/"  # CUTLASS 4.3.4 (v0.26 line's wheel), 4.8.0 (v0.32's)


def cutlass_from_wheel(wheel: Path, dest: Path, vllm_wheel: Path | None = None) -> str:
    """Lay a CUTLASS tree at ``dest`` from an ``nvidia-cutlass`` wheel: ``include/``, ``tools/``,
    ``examples/`` (from the wheel's ``cutlass_library/source``) and ``python/cutlass_library``
    (the Python package, where a CUTLASS checkout keeps it); written atomically with a
    provenance file. Returns the CUTLASS version of ``include/`` (``version.h``).

    With ``vllm_wheel`` (the pinned vLLM CUDA wheel) whose MSA copy carries newer CUTLASS headers
    (``vllm/third_party/fmha_sm100/cutlass/include`` and ``tools/util/include``: 4.3.4 on the v0.26 line, nearer
    the pinned v4.4.2 than the index's 4.2.0; 4.8.0 on the v0.32 line, which pins v4.7.1), those replace
    ``include/`` and ``tools/util/include``; ``examples/`` and ``cutlass_library`` stay the
    nvidia-cutlass wheel's (recorded in the provenance).
    Measured: the v0.26 line's ``scaled_mm_blockwise_sm100_fp8.cu`` needs
    ``cutlass::epilogue::BlockwiseNoSmemWarpSpecialized1Sm``, which 4.2.0 lacks and 4.3.4 has.

    Raises KimiError when the wheel holds no ``cutlass_library/source/include/cutlass/cutlass.h``.
    """
    from kimi.fork.fsutil import sha256_file, staged_folder

    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        heads = [n for n in names if n.endswith("source/include/cutlass/cutlass.h")]
        if not heads:
            raise KimiError(f"{wheel.name} holds no .../source/include/cutlass/cutlass.h: not an nvidia-cutlass wheel")
        source = heads[0].removesuffix("include/cutlass/cutlass.h")      # cutlass_library/source/
        package = source.removesuffix("source/")                           # cutlass_library/
        with staged_folder(dest) as staged:
            _unzip_prefix(zf, source, staged)
            for name in names:  # the Python package without its copy of the sources
                if name.startswith(package) and not name.startswith(source) and not name.endswith("/"):
                    out = staged / "python" / name
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(zf.read(name))
            version = cutlass_version(staged / "include") or "?"
            origin = f"{wheel.name} (sha256 {sha256_file(wheel)})"
            note = "headers, tools, examples and cutlass_library of the wheel; no CMakeLists.txt"
            newer = _newer_vllm_wheel_headers(vllm_wheel, version) if vllm_wheel else None
            if newer:
                with zipfile.ZipFile(vllm_wheel) as vz:  # type: ignore[arg-type]
                    for sub, prefix in (("include", "include/"), ("tools/util/include", "tools/util/include/")):
                        shutil.rmtree(staged / sub)
                        _unzip_prefix(vz, VLLM_WHEEL_CUTLASS + prefix, staged / sub)
                origin = f"{vllm_wheel.name} {VLLM_WHEEL_CUTLASS} + {origin}"  # type: ignore[union-attr]
                note = (f"include/ and tools/util/include: CUTLASS {newer} from the vLLM wheel; examples/ and "
                        f"python/cutlass_library: CUTLASS {version} from {wheel.name}; no CMakeLists.txt")
                version = newer
            _write_provenance(staged, origin, version, note=note)
    return version


def _newer_vllm_wheel_headers(vllm_wheel: Path, than: str) -> str | None:
    """The version of the vLLM wheel's CUTLASS header copy when it is newer than ``than``, else None."""
    with zipfile.ZipFile(vllm_wheel) as vz:
        try:
            text = vz.read(VLLM_WHEEL_CUTLASS + "include/cutlass/version.h").decode(errors="replace")
        except KeyError:
            return None
    parts = [re.search(rf"#define CUTLASS_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        return None
    have = tuple(int(m.group(1)) for m in parts)  # type: ignore[union-attr]
    base = tuple(int(x) for x in re.findall(r"\d+", than)[:3]) if than != "?" else (0,)
    return ".".join(map(str, have)) if have > base else None


def from_vllm_wheel(wheel: Path, variable: str, dest: Path, tag: str) -> int:
    """Lay the source folder of ``variable`` (one of :data:`FROM_VLLM_WHEEL`) at ``dest`` from the
    pinned vLLM CUDA wheel's installed copy (``vllm/third_party/...``); tml-fa4's import rewrite
    (``flash_attn.cute`` -> ``vllm.third_party.tml_fa4``, tml_fa4.cmake) is undone. The revision
    recorded is ``tag``, the one the release's CMake pinned when it built the wheel. Returns the
    number of files.

    Raises KimiError when the wheel holds none of those files.
    """
    from kimi.fork.fsutil import sha256_file, staged_folder

    prefix, sub = FROM_VLLM_WHEEL[variable]
    rewrite = ("vllm.third_party.tml_fa4", "flash_attn.cute") if variable == "TML_FA4_SRC_DIR" else None
    with zipfile.ZipFile(wheel) as zf, staged_folder(dest) as staged:
        count = _unzip_prefix(zf, prefix, staged / sub if sub else staged, rewrite)
        if not count:
            raise KimiError(f"{wheel.name} holds no {prefix}: not a vLLM CUDA wheel of this release")
        _write_provenance(staged, f"{wheel.name} (sha256 {sha256_file(wheel)}), its {prefix}", tag,
                          note="the files upstream's CMake installs from this source, as the release wheel has them")
    return count


def _archive_top(names: list[str]) -> str:
    tops = {n.split("/", 1)[0] for n in names if n.strip("/")}
    return tops.pop() + "/" if len(tops) == 1 else ""


def unpack_archive(archive: Path, dest: Path, subdir: str = "") -> str:
    """Unpack a ``.tar.gz`` / ``.tgz`` / ``.tar`` / ``.zip`` source archive (one top folder, as a
    forge's archive download has) to ``dest``, keeping only ``subdir`` of it; returns the top folder's
    name (``flash-attention-caaa4eb...``), whose suffix names the revision.

    Raises KimiError for another kind of file or an unsafe member path.
    """
    from kimi.fork.fsutil import staged_folder

    with staged_folder(dest) as staged:
        scratch = Path(tempfile.mkdtemp(dir=staged.parent, prefix=f".{dest.name}.unpack."))
        try:
            if archive.name.endswith(".zip"):
                with zipfile.ZipFile(archive) as zf:
                    top = _archive_top(zf.namelist())
                    for name in zf.namelist():
                        if name.startswith("/") or ".." in Path(name).parts:
                            raise KimiError(f"{archive}: unsafe member path {name!r}")
                    zf.extractall(scratch)
            elif re.search(r"\.(tar\.gz|tgz|tar|tar\.xz|tar\.bz2)$", archive.name):
                with tarfile.open(archive) as tf:
                    top = _archive_top(tf.getnames())
                    for member in tf.getmembers():
                        if member.name.startswith("/") or ".." in Path(member.name).parts:
                            raise KimiError(f"{archive}: unsafe member path {member.name!r}")
                    try:
                        tf.extractall(scratch, filter="data")
                    except TypeError:  # a Python without extraction filters; the paths are checked above
                        tf.extractall(scratch)
                    except tarfile.TarError as exc:
                        raise KimiError(f"{archive}: {exc}") from None
            else:
                raise KimiError(f"{archive}: not a .tar.gz, .tgz, .tar or .zip archive")
            inner = scratch / top / subdir if subdir else scratch / top
            if not inner.is_dir():
                raise KimiError(f"{archive}: no {subdir or 'top folder'} inside")
            for child in inner.iterdir():
                os.replace(child, staged / child.name)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return top.rstrip("/")


@dataclass
class Prepared:
    """What :func:`prepare` did for one source."""

    variable: str
    action: str   # "kept", "linked", "unpacked", "from nvidia-cutlass", "from the vLLM wheel", "missing"
    detail: str


def _find_wheel(where: Path, pattern: str) -> Path | None:
    wheels = sorted(where.glob(pattern)) if where.is_dir() else []
    return wheels[-1] if wheels else None


def prepare(root: Path, *, fetch: bool = False, from_dir: Path | None = None, cache: Path | None = None,
            sources_dir: Path | None = None, force: bool = False, line: str | None = None) -> list[Prepared]:
    """Fill the sources folder (``.kimi/sources``) for each ``*_SRC_DIR`` source that is not
    there yet (all with ``force``), offline from ``from_dir`` and, with ``fetch``, from the package
    index; sources set through their environment variable are left alone.

    Order per source: ``from_dir/<repository name>`` (a checkout or tree, linked, with
    ``SUBDIR``), ``from_dir/<repository name>-<revision>.{tar.gz,tgz,zip}`` (unpacked), then for
    CUTLASS an ``nvidia_cutlass-*.whl`` in ``from_dir`` or, with ``fetch``, downloaded; for fmha_sm100,
    tml-fa4 and triton_kernels the pinned vLLM CUDA wheel (``from_dir``, the cache, or with ``fetch``
    the index; sha256 checked against the line's pin).

    Returns one :class:`Prepared` per source. Raises KimiError on a corrupt archive or wheel.
    """
    sources_dir = sources_dir or default_sources_dir(root)
    cache = cache or root / ".kimi" / "cache"
    sources_dir.mkdir(parents=True, exist_ok=True)
    done: list[Prepared] = []
    vllm_wheel: Path | None = None
    for s in external_sources(root, sources_dir):
        dest = sources_dir / s.name
        if os.environ.get(s.variable):
            done.append(Prepared(s.variable, "kept", f"${s.variable}={os.environ[s.variable]}"))
            continue
        if s.present and not force:
            done.append(Prepared(s.variable, "kept", str(dest)))
            continue
        got = _from_local(s, dest, from_dir) if from_dir else None
        if got is None and s.variable == "VLLM_CUTLASS_SRC_DIR":
            wheel = (_find_wheel(from_dir, "nvidia_cutlass-*.whl") if from_dir else None) or \
                (_pip_download("nvidia-cutlass", cache) if fetch else None)
            if wheel:
                vllm_wheel = vllm_wheel or _pinned_cuda_wheel(root, cache, from_dir, fetch, line)
                version = cutlass_from_wheel(wheel, dest, vllm_wheel)
                got = Prepared(s.variable, "from nvidia-cutlass", f"{wheel.name}: CUTLASS {version} headers "
                               f"(pinned {s.tag}); {json.loads((dest / PROVENANCE).read_text())['note']}")
        if got is None and s.variable in FROM_VLLM_WHEEL:
            if vllm_wheel is None:
                vllm_wheel = _pinned_cuda_wheel(root, cache, from_dir, fetch, line)
            if vllm_wheel:
                count = from_vllm_wheel(vllm_wheel, s.variable, dest, s.tag)
                got = Prepared(s.variable, "from the vLLM wheel", f"{count} files of {vllm_wheel.name}")
        done.append(got or Prepared(s.variable, "missing", s.how_to_provide()))
    return done


def _from_local(s: ExternalSource, dest: Path, from_dir: Path) -> Prepared | None:
    """A checkout/tree or an archive of ``s`` in ``from_dir``, put at ``dest``; None if neither."""
    sub = SUBDIR.get(s.variable, "")
    tree = from_dir / s.repo_name
    if tree.is_dir():
        target = (tree / sub).resolve() if sub else tree.resolve()
        if dest.is_symlink() or dest.is_file():
            dest.unlink()
        elif dest.exists():
            shutil.rmtree(dest)
        dest.symlink_to(target, target_is_directory=True)
        return Prepared(s.variable, "linked", f"{dest} -> {target}")
    for archive in sorted(from_dir.glob(f"{s.repo_name}-*")):
        if archive.is_file() and re.search(r"\.(tar\.gz|tgz|tar|zip)$", archive.name):
            top = unpack_archive(archive, dest, sub)
            revision = top[len(s.repo_name) + 1:] if top.startswith(s.repo_name + "-") else None
            _write_provenance(dest, f"{archive.name}", revision)
            return Prepared(s.variable, "unpacked", f"{archive.name} -> {dest}")
    return None


def _pinned_cuda_wheel(root: Path, cache: Path, from_dir: Path | None, fetch: bool, line: str | None) -> Path | None:
    """The pinned vLLM CUDA wheel (sha256 checked): cache, ``from_dir``, or with ``fetch`` the index;
    None when it is in neither and ``fetch`` is off."""
    from kimi.fork.artifacts import obtain
    from kimi.fork.layout import DEFAULT_LINE
    from kimi.fork.pin import load_pin

    pin_path = root / "kimi" / "lines" / (line or DEFAULT_LINE) / "pin.json"
    if not pin_path.is_file() and not fetch:
        return None
    pin = load_pin(pin_path)
    artifact = pin.artifact("cuda_wheel")
    if (cache / artifact.file).is_file() or fetch:
        return obtain(artifact, cache)
    if from_dir and (from_dir / artifact.file).is_file():
        return obtain(artifact, cache, from_dir)
    return None


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
