"""The offline GPU host's install kit: one byte stream, cut into chunks that travel one per device call.

A device call carries at most 64 MiB of the working tree (tracked files, untracked files that git does
not ignore, and at most 8 carried ignored paths), and a machine left idle for ~30 s is given back, losing
``/tmp``.  So the kit (upstream vLLM's CUDA wheel, the wheels the host lacks, a newer torch stack where
the release pins one, optional payload folders such as a model pair) is packed as ONE uncompressed tar
stream, cut into chunks of a fixed size, and described by ``MANIFEST.json`` (chunk names, sizes and
sha256s, the stream's total size and sha256, the vLLM and torch versions).  Each call carries the
manifest and one chunk; the host stashes the chunk (checked against the manifest) in ``/tmp`` and, once
all are there, checks the total sha256 and unpacks the stream.

Build side (here, with the package index; ``benchmarks/gpu_kit.sh`` drives these)::

   python3 lab/kimi_lab/gpukit.py chunk-mib --root .   default chunk size for this working tree
   python3 lab/kimi_lab/gpukit.py line --lines kimi/lines [--line L] [--version V]   line, version, pinned wheel sha256
   python3 lab/kimi_lab/gpukit.py line-requires --lines kimi/lines LINE   what the line's gpu-kit.txt adds to its kit
   python3 lab/kimi_lab/gpukit.py kit-torch CUDA_WHEEL [--torch T]   the kit's torch (the wheel's, not the pin's)
   python3 lab/kimi_lab/gpukit.py wheel-pin WHEEL NAME   the ==version that WHEEL requires of NAME
   python3 lab/kimi_lab/gpukit.py torch-stack TORCH_WHEEL   what must travel with a torch the host lacks
   python3 lab/kimi_lab/gpukit.py host-pins WHEEL...   requirements the host's own packages may miss
   python3 lab/kimi_lab/gpukit.py host-broken VLLM_WHEEL WHEEL...   host packages the carried wheels break
   python3 lab/kimi_lab/gpukit.py pack --out KIT ...   the stream -> KIT/chunkNN + KIT/MANIFEST.json
   python3 lab/kimi_lab/gpukit.py calls --kit KIT   the device calls to make, in order

Device side (``benchmarks/gpu_call.sh``; ``python3 -S``, standard library only, no torch, no vLLM)::

    python3 -S lab/kimi_lab/gpukit.py stash --kit KIT --stash /tmp/kitparts --site /tmp/site
    python3 -S lab/kimi_lab/gpukit.py unpack --kit KIT --stash /tmp/kitparts --dest /tmp/site.bundle
    python3 lab/kimi_lab/gpukit.py check-reqs --site /tmp/site   (uses `packaging`, which the host has)
    python3 -S lab/kimi_lab/gpukit.py field FILE.json KEY

The stream holds ``kit.json`` (the build's metadata), ``vllm.tar.xz`` (the release's installed files, as
``build_kit.sh`` packs them), ``wheels/*.whl`` (installed with ``pip install --no-deps --target``) and
``payload/<path>`` for each payload folder (``<path>`` relative to the repository root).

Everything here uses the standard library only (``packaging`` is imported lazily by the requirement
checks), so that it runs with the host's python3 before anything is installed, and with Python >= 3.10.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterable
from pathlib import Path

MiB = 1 << 20
FORMAT = "kimi-gpu-kit/1"
MANIFEST = "MANIFEST.json"
KIT_JSON = "kit.json"
CALL_LIMIT_MIB = 64      # what one device call carries, working tree included
MARGIN_MIB = 4           # the manifest, files other engineers add meanwhile, rounding
MAX_CHUNK_MIB = 60
HOST_TORCH = "2.11.0"    # torch on the GPU host (2.11.0+cu130)
BLOCK = 8 * MiB

# The torch releases tried on the host (/work/shared/gpu/README.md; 2.14.0 on the H100:
# benchmarks/results/gpu_e2e-0.34.0.md) and what had to travel with them. The versions are read from the
# torch wheel's own Requires-Dist; this table names the companions (a torch not listed gets triton and the
# NCCL wheel, with a warning) and cross-checks the versions the wheel pins exactly (2.14 asks triton~=3.8.0).
TORCH_STACKS: dict[str, dict[str, str]] = {
    "2.13.0": {"triton": "3.7.1", "nvidia-nccl-cu13": "2.29.7"},
    "2.14.0": {"triton": "3.8.0", "nvidia-nccl-cu13": "2.30.7"},
}
DEFAULT_COMPANIONS = ("triton", "nvidia-nccl-cu13")

# Versions known on the host (the device docs' pip list and the shared README); a requirement on a host
# package that is not listed here is "unverified" at build time and checked on the host (check-reqs).
HOST_VERSIONS = {
    "accelerate": "1.15.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0",
    "sentencepiece": "0.2.2", "tiktoken": "0.14.0", "tokenizers": "0.23.2", "torch": "2.11.0",
    "torchaudio": "2.11.0", "torchvision": "0.26.0", "transformers": "5.17.0", "triton": "3.6.0",
    "nvidia-nccl-cu13": "2.28.9", "nvidia-cudnn-cu13": "9.19.0.56",
}
# What host packages (at HOST_VERSIONS) require of packages a kit may carry (read from their wheels' metadata).
# A carried version outside it breaks that host package: transformers 5.17.0 checks at import that
# huggingface-hub is <2.0, and the mainline's vLLM wants >=2.0.0, so transformers travels too (host_broken).
HOST_REQUIRES = {"transformers": {"huggingface-hub": "<2.0,>=1.5.0", "tokenizers": "<0.24.0,>=0.23.1"}}
# The CUDA libraries torch pins exactly: a miss is reported, never carried on its own (cuDNN is ~700 MB;
# torch 2.13 ran on the host with its cuDNN 9.19 for everything but cudnn convolutions).
NOT_AUTO_CARRIED = re.compile(r"^(nvidia-|cuda-)")


def norm(name: str) -> str:
    """PEP 503 normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(filename: str) -> str:
    """The normalized project name of a wheel file name."""
    return norm(Path(filename).name.split("-", 1)[0])


def fmt_mib(n: int) -> str:
    return f"{n / MiB:.1f} MiB"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            h.update(block)
    return h.hexdigest()


class KitError(Exception):
    """A problem with the kit that the message explains; the command exits 3."""


# -- the chunk plan ---------------------------------------------------------------------------------------------

def tree_bytes(root: Path) -> int:
    """Bytes of the working tree that travels with every device call (files git does not ignore), counted
    in 4 KiB blocks as ``du`` does."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True).stdout
    total = 0
    for rel in filter(None, out.split(b"\0")):
        try:
            size = os.lstat(root / os.fsdecode(rel)).st_size
        except OSError:
            continue
        total += -(-size // 4096) * 4096
    return total


def default_chunk_mib(tree: int, limit_mib: int = CALL_LIMIT_MIB, margin_mib: int = MARGIN_MIB,
                      max_mib: int = MAX_CHUNK_MIB) -> int:
    """The largest whole-MiB chunk that, with the working tree and a margin, stays under a call's limit."""
    mib = min(max_mib, math.floor(limit_mib - tree / MiB - margin_mib))
    if mib < 1:
        raise KitError(f"the working tree ({fmt_mib(tree)}) leaves no room for a chunk under {limit_mib} MiB")
    return mib


def chunk_names(count: int) -> list[str]:
    width = max(2, len(str(count - 1)))
    return [f"chunk{i:0{width}d}" for i in range(count)]


# -- writing the stream -----------------------------------------------------------------------------------------

class ChunkWriter:
    """A write-only file that cuts what is written into ``chunk_size`` files, hashing each and the whole."""

    def __init__(self, out: Path, chunk_size: int, width: int) -> None:
        self.out, self.chunk_size, self.width = out, chunk_size, width
        self.total = hashlib.sha256()
        self.total_size = 0
        self.chunks: list[dict] = []
        self._f = None
        self._h = None
        self._size = 0

    def _open(self) -> None:
        name = f"chunk{len(self.chunks):0{self.width}d}"
        self._f = open(self.out / name, "wb")  # noqa: SIM115 (closed in _close)
        self._h = hashlib.sha256()
        self._size = 0
        self.chunks.append({"name": name})

    def _close(self) -> None:
        self._f.close()
        self.chunks[-1].update(size=self._size, sha256=self._h.hexdigest())
        self._f = None

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        n = len(view)
        while view:
            if self._f is None:
                self._open()
            part = view[: self.chunk_size - self._size]
            self._f.write(part)
            self._h.update(part)
            self.total.update(part)
            self._size += len(part)
            self.total_size += len(part)
            view = view[len(part):]
            if self._size == self.chunk_size:
                self._close()
        return n

    def close(self) -> None:
        if self._f is not None:
            self._close()


FIXED_MTIME = 1_700_000_000  # every member's: the same inputs make the same stream, kit id and chunks


def _tarinfo_filter(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = FIXED_MTIME
    return info


def _du(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum((Path(d) / f).stat().st_size for d, _, files in os.walk(path, followlinks=True) for f in files)


def pack(out: Path, chunk_mib: float, adds: list[tuple[str, Path]], payloads: list[tuple[str, Path]],
         meta: dict) -> dict:
    """Write ``kit.json`` + ``adds`` (archive name, path) + ``payloads`` (under ``payload/``) as one tar
    stream into ``out/chunkNN`` files of ``chunk_mib`` MiB, then ``out/MANIFEST.json``; returns the manifest.

    Old chunks and the old manifest in ``out`` are removed first, so a build that stops half way leaves no
    manifest that could be mistaken for a kit.  Owners and times are fixed, so the same inputs give the same
    stream: a rebuild leaves the kit id and the chunks already stashed on a warm host valid."""
    chunk_size = int(chunk_mib * MiB)
    if chunk_size < 1:
        raise KitError("chunk size must be positive")
    wheels = sorted(p.name for arc, path in adds if arc.split("/")[0] == "wheels"
                    for p in ([path] if path.is_file() else path.glob("*.whl")))
    seen: dict[str, str] = {}
    for w in wheels:
        if wheel_name(w) in seen:
            raise KitError(f"two wheels of one project: {seen[wheel_name(w)]} and {w} (pip would refuse both)")
        seen[wheel_name(w)] = w
    for arc, path in [*adds, *payloads]:
        if not path.exists():
            raise KitError(f"{arc}: {path} does not exist")
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)
    for old in out.glob("chunk*"):
        old.unlink()
    inner = {"format": FORMAT, **meta, "payloads": [rel for rel, _ in payloads], "wheels": wheels,
             "members": [arc for arc, _ in adds]}
    inner_bytes = (json.dumps(inner, indent=1, sort_keys=True) + "\n").encode()
    writer = ChunkWriter(out, chunk_size, 6)  # renamed to the width the count needs below
    t0 = time.monotonic()
    with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT, bufsize=MiB) as tar:
        info = tarfile.TarInfo(KIT_JSON)
        info.size, info.mtime, info.mode = len(inner_bytes), FIXED_MTIME, 0o644
        tar.addfile(info, _BytesReader(inner_bytes))
        for arc, path in adds:
            tar.add(path, arcname=arc, recursive=True, filter=_tarinfo_filter)
        for rel, path in payloads:
            tar.dereference = True  # a model folder may link into a cache: carry the files
            tar.add(path, arcname=f"payload/{rel}", recursive=True, filter=_tarinfo_filter)
            tar.dereference = False
    writer.close()
    _place_chunks(writer, out, out)
    total = writer.total.hexdigest()
    manifest = {"format": FORMAT, **meta, "kit_id": total[:16], "total_sha256": total,
                "total_size": writer.total_size, "chunk_size": chunk_size, "chunks": writer.chunks,
                "payloads": inner["payloads"], "wheels": wheels,
                "members": {arc: _du(p) for arc, p in [*adds, *payloads]},
                "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "pack_s": round(time.monotonic() - t0, 1)}
    _write_manifest(out, manifest)
    return manifest


def _place_chunks(writer: ChunkWriter, src: Path, dst: Path) -> None:
    """Move ``writer``'s chunks from ``src`` to ``dst`` under the names their count needs (``chunk_names``)."""
    for chunk, name in zip(writer.chunks, chunk_names(len(writer.chunks)), strict=True):
        (src / chunk["name"]).rename(dst / name)
        chunk["name"] = name


def _write_manifest(kit: Path, manifest: dict) -> None:
    """``kit/MANIFEST.json``, written to a temporary name and renamed: never a half-written manifest."""
    tmp = kit / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    tmp.replace(kit / MANIFEST)


def rechunk(kit: Path, chunk_mib: float) -> dict:
    """Cut the kit's stream in ``kit`` again into chunks of ``chunk_mib`` MiB (the working tree grew, say), in place;
    returns the new manifest. The stream, so the kit id and ``total_sha256``, stays the same; it is checked
    against the manifest before any old chunk is replaced, and the new chunks are written beside the old ones
    and swapped in only once all are there.

    Raises:
        KitError: a chunk is missing or the stream's sha256 is not the manifest's.
    """
    man = load_manifest(kit / MANIFEST)
    chunk_size = int(chunk_mib * MiB)
    if chunk_size < 1:
        raise KitError("chunk size must be positive")
    staging = kit / ".rechunk"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    writer = ChunkWriter(staging, chunk_size, 6)
    for chunk in man["chunks"]:
        path = kit / chunk["name"]
        if not path.is_file():
            shutil.rmtree(staging)
            raise KitError(f"{path} is missing: rebuild the kit with bash benchmarks/gpu_kit.sh")
        with open(path, "rb") as f:
            while block := f.read(BLOCK):
                writer.write(block)
    writer.close()
    if writer.total.hexdigest() != man["total_sha256"] or writer.total_size != man["total_size"]:
        shutil.rmtree(staging)
        raise KitError(f"the chunks in {kit} do not make the stream its manifest names: rebuild the kit")
    (kit / MANIFEST).unlink()  # no manifest while old and new chunks are swapped: never a mixed kit
    for old in kit.glob("chunk*"):
        old.unlink()
    _place_chunks(writer, staging, kit)
    staging.rmdir()
    man.update(chunk_size=chunk_size, chunk_mib=f"{chunk_mib:g}", chunks=writer.chunks)
    _write_manifest(kit, man)
    return man


class _BytesReader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else self.pos + n
        chunk, self.pos = self.data[self.pos:end], min(end, len(self.data))
        return chunk


# -- reading the manifest ---------------------------------------------------------------------------------------

def load_manifest(path: Path) -> dict:
    try:
        man = json.loads(path.read_text())
    except FileNotFoundError:
        raise KitError(f"no {path}: carry the kit's {MANIFEST} with every call") from None
    except ValueError as e:
        raise KitError(f"{path} is not valid JSON ({e}): carry it again") from None
    if man.get("format") != FORMAT or not man.get("chunks") or not man.get("total_sha256"):
        raise KitError(f"{path} is not a {FORMAT} manifest")
    return man


def _names(chunks: Iterable[dict]) -> str:
    return " ".join(c["name"] for c in chunks)


def _rel(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


# -- the device side: stash, unpack ----------------------------------------------------------------------------

COMPLETE, INCOMPLETE, REFUSED, BROKEN, INSTALLED = 0, 1, 2, 3, 4


def _copy_verified(src: Path, dst: Path, want: dict) -> str | None:
    """Copy ``src`` to ``dst`` hashing on the way; None when size and sha256 match ``want``, else why not
    (and nothing is left at ``dst``)."""
    tmp = dst.with_name(dst.name + ".part")
    h = hashlib.sha256()
    size = 0
    with open(src, "rb") as fi, open(tmp, "wb") as fo:
        while block := fi.read(BLOCK):
            h.update(block)
            fo.write(block)
            size += len(block)
    got = h.hexdigest()
    if size != want["size"] or got != want["sha256"]:
        tmp.unlink()
        return f"{size} bytes, sha256 {got[:16]}…; the manifest says {want['size']} bytes, {want['sha256'][:16]}…"
    tmp.replace(dst)
    return None


def stash(kit: Path, stash_root: Path, site: Path | None = None, report: Path | None = None) -> int:
    """Check the chunks carried in ``kit`` against its manifest and stash the good ones in
    ``stash_root/<kit_id>``; print what is there and what is still missing.

    Returns COMPLETE (0) when every chunk is stashed, INCOMPLETE (1) when some are missing, REFUSED (2) when
    a carried chunk did not match the manifest (it is not stashed; the message names it), BROKEN (3) for a
    missing or bad manifest, INSTALLED (4) when ``site`` already holds this kit.  A stash that was empty
    before this call, while the call carries a chunk after the first, means that the machine went cold
    between calls (a fresh machine has an empty /tmp): the message says so and names the chunks needed
    again from the start."""
    man = load_manifest(kit / MANIFEST)
    chunks, kid, total = man["chunks"], man["kit_id"], man["total_sha256"]
    label = f"kit {kid} (vLLM {man.get('version', '?')}, torch {man.get('torch', '?')}, {len(chunks)} chunks)"
    installed = ""
    if site is not None and (site / ".kit-sha256").is_file():
        installed = (site / ".kit-sha256").read_text().strip()
    if installed == total:
        print(f"kit already installed in {site}: {label}")
        return INSTALLED
    stash_root.mkdir(parents=True, exist_ok=True)
    for other in sorted(stash_root.iterdir()):
        if other.is_dir() and other.name != kid:
            shutil.rmtree(other, ignore_errors=True)
            print(f"removed the stash of another kit ({other.name})")
    box = stash_root / kid
    box.mkdir(exist_ok=True)
    # by name and size: a warm host may still hold chunks of the same stream cut otherwise (``rechunk``)
    had = [c for c in chunks if (box / c["name"]).is_file() and (box / c["name"]).stat().st_size == c["size"]]
    carried = [c for c in chunks if (kit / c["name"]).is_file()]
    known = {c["name"] for c in chunks}
    strays = sorted(p.name for p in kit.glob("chunk*") if p.name not in known and not p.name.endswith(".part"))
    if strays:
        print(f"ignored (not in this manifest): {' '.join(strays)}")
    refused, stashed = [], []
    for c in carried:
        if c in had:
            print(f"{c['name']} already stashed")
            continue
        why = _copy_verified(kit / c["name"], box / c["name"], c)
        if why:
            refused.append(c)
            print(f"REFUSED {c['name']}: {why}; not stashed, carry {c['name']} again")
        else:
            stashed.append(c)
    if stashed:
        print(f"stashed {_names(stashed)} ({fmt_mib(sum(c['size'] for c in stashed))}, sha256 ok)")
    (box / MANIFEST).write_text(json.dumps(man, indent=1) + "\n")
    have = [c for c in chunks if (box / c["name"]).is_file()]
    missing = [c for c in chunks if c not in have]
    cold = not had and (not carried or carried[0]["name"] != chunks[0]["name"])
    if installed:
        print(f"{site} holds another kit ({installed[:16]}); this one replaces it once complete")
    if cold and not carried:
        print(f"NOTHING STASHED: {stash_root} holds no chunk of {label} and this call carries none: the machine "
              f"is fresh or restarted (a cold machine loses /tmp). Carry the chunks from the start: "
              f"{_names(missing)}")
    elif cold:
        lost = [c for c in chunks[: chunks.index(carried[0])] if c not in have]
        print(f"MACHINE RESTARTED: the stash {stash_root} was empty, though this call carries {carried[0]['name']} "
              f"and the chunks before it were expected there: the machine went cold between calls and lost /tmp. "
              f"Needed again from the start: {_names(lost)}")
    state = "complete" if not missing else "incomplete"
    print(f"{label}: {len(have)} of {len(chunks)} chunks stashed, {fmt_mib(sum(c['size'] for c in have))} "
          f"of {fmt_mib(man['total_size'])}")
    if missing:
        print(f"still missing {len(missing)}: {_names(missing)} ({fmt_mib(sum(c['size'] for c in missing))})")
        print(f"next: carry {_rel(kit / MANIFEST)} and {_rel(kit / missing[0]['name'])}")
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps({
            "kit_id": kid, "version": man.get("version"), "torch": man.get("torch"), "state": state,
            "chunks": len(chunks), "have": [c["name"] for c in have], "missing": [c["name"] for c in missing],
            "stashed": [c["name"] for c in stashed], "refused": [c["name"] for c in refused], "cold": cold,
        }, indent=1) + "\n")
    if refused:
        return REFUSED
    return INCOMPLETE if missing else COMPLETE


class _Concat:
    """A read-only file over the stashed chunks in order."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = iter(paths)
        self.f = None

    def read(self, n: int = -1) -> bytes:
        out = []
        while n != 0:
            if self.f is None:
                path = next(self.paths, None)
                if path is None:
                    break
                self.f = open(path, "rb")  # noqa: SIM115 (closed below)
            block = self.f.read(n if n > 0 else BLOCK)
            if not block:
                self.f.close()
                self.f = None
                continue
            out.append(block)
            if n > 0:
                n -= len(block)
        return b"".join(out)


def verify_stream(box: Path, man: dict) -> str | None:
    """None when the stashed chunks' sizes and the whole stream's sha256 match the manifest, else why not
    (a chunk that fails its own sha256 is removed from the stash and named)."""
    total = hashlib.sha256()
    size = 0
    for c in man["chunks"]:
        path = box / c["name"]
        if not path.is_file():
            return f"{c['name']} is not stashed"
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(BLOCK):
                h.update(block)
                total.update(block)
                size += len(block)
        if h.hexdigest() != c["sha256"]:
            path.unlink()
            return f"{c['name']} changed in the stash (sha256 {h.hexdigest()[:16]}…): removed, carry it again"
    if size != man["total_size"] or total.hexdigest() != man["total_sha256"]:
        return (f"the whole stream has {size} bytes, sha256 {total.hexdigest()[:16]}…; the manifest says "
                f"{man['total_size']} bytes, {man['total_sha256'][:16]}… (manifest and chunks not of one build)")
    return None


def unpack(kit: Path, stash_root: Path, dest: Path) -> int:
    """Check the total sha256 of the stashed stream, then unpack it into ``dest`` (emptied first)."""
    man = load_manifest(kit / MANIFEST)
    box = stash_root / man["kit_id"]
    t0 = time.monotonic()
    why = verify_stream(box, man)
    if why:
        print(f"kit {man['kit_id']}: total sha256 check FAILED: {why}")
        return REFUSED
    print(f"kit {man['kit_id']}: total sha256 ok ({fmt_mib(man['total_size'])}, {time.monotonic() - t0:.1f} s)")
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=_Concat([box / c["name"] for c in man["chunks"]]), mode="r|", bufsize=MiB) as tar:
        tar.copybufsize = BLOCK
        for member in tar:
            if member.name.startswith("/") or ".." in Path(member.name).parts:
                raise KitError(f"unsafe path in the kit: {member.name}")
            if hasattr(tarfile, "data_filter"):
                tar.extract(member, dest, filter="data")
            else:  # Python < 3.10.12 / 3.11.4
                tar.extract(member, dest)
    print(f"unpacked into {dest} ({time.monotonic() - t0:.1f} s)")
    return COMPLETE


# -- metadata of wheels -----------------------------------------------------------------------------------------

def wheel_requires(wheel: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    return [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]


_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*\(?\s*([<>=!~][^;)]*?)\s*\)?\s*(?:;(.*))?$")


def requirement_specs(requires: Iterable[str]) -> dict[str, str]:
    """{normalized name: version specifier, spaces removed (``==2.13.0``, ``~=3.8.0``, ``<14,>=13.0.3``)} of the
    requirements that name versions and are not behind an extra."""
    specs = {}
    for req in requires:
        m = _REQ.match(req)
        if m and "extra" not in (m.group(3) or ""):
            specs.setdefault(norm(m.group(1)), re.sub(r"\s+", "", m.group(2)))
    return specs


def exact_pins(requires: Iterable[str]) -> dict[str, str]:
    """{normalized name: version} of the ``name==version`` requirements that are not behind an extra."""
    return {name: spec.lstrip("=") for name, spec in requirement_specs(requires).items()
            if re.fullmatch(r"===?[^,<>=!~*]+", spec)}


def torch_stack(torch_wheel: Path) -> tuple[str, list[str], list[str]]:
    """(torch version, [requirement] of the companions that must travel with it, [warning]).

    Each companion travels as the torch wheel requires it: ``triton==3.7.1`` (torch 2.13), ``triton~=3.8.0``
    (torch 2.14: the newest 3.8.x on the index); the table's versions are checked against exact pins only."""
    version = Path(torch_wheel).name.split("-")[1].split("+")[0]
    specs = requirement_specs(wheel_requires(torch_wheel))
    pins = exact_pins(wheel_requires(torch_wheel))
    table = TORCH_STACKS.get(version)
    warnings = []
    if table is None:
        warnings.append(f"torch {version} was not tried on the GPU host (tried: {', '.join(TORCH_STACKS)}); "
                        f"carrying {', '.join(DEFAULT_COMPANIONS)} as for those")
    reqs = []
    for name in table or DEFAULT_COMPANIONS:
        if name not in specs:
            raise KitError(f"torch {version}'s wheel pins no {name}: add it to TORCH_STACKS in lab/kimi_lab/gpukit.py")
        if table and name in pins and table[name] != pins[name]:
            warnings.append(f"torch {version} requires {name}=={pins[name]}; the table says {table[name]} "
                            "(using the wheel's)")
        reqs.append(f"{name}{specs[name]}")
    return version, reqs, warnings


def resolve_skip(resolve_wheels_py: Path) -> list[str]:
    """DEFAULT_SKIP of the shared ``resolve_wheels.py`` (the packages the kit leaves out on purpose), read
    without importing it."""
    import ast
    for node in ast.walk(ast.parse(resolve_wheels_py.read_text())):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "DEFAULT_SKIP" for t in node.targets):
            return sorted(norm(x) for x in ast.literal_eval(node.value))
    raise KitError(f"no DEFAULT_SKIP in {resolve_wheels_py}")


# -- the kit's line and torch ----------------------------------------------------------------------------------

def kit_line(lines: Path, line: str | None = None, version: str | None = None) -> tuple[str, str, str]:
    """(line, vLLM version, sha256 of the CUDA wheel its pin names, or "") of a kit: ``line``
    (``kimi/lines/<line>``) at its pin's version, or else the line whose pin names ``version`` (the mainline
    first; the mainline, with no sha256, when none does), or else the mainline's pin.

    The line decides which series ``kimi install-into`` puts on the host's vLLM, so a kit of the v0.32 line's release
    installs the ``v0.32`` line, not the mainline's patches.

    Raises:
        KitError: no such line, or ``version`` is not the named line's.
    """
    def pin(name: str) -> dict:
        try:
            found = json.loads((lines / name / "pin.json").read_text())
        except (OSError, ValueError):
            found = {}
        if "version" not in found:
            raise KitError(f"no line {name!r} ({lines / name / 'pin.json'} missing or without a version)")
        return found

    def sha(found: dict) -> str:
        return found.get("artifacts", {}).get("cuda_wheel", {}).get("sha256", "")

    if line:
        found = pin(line)
        if version and version != found["version"]:
            raise KitError(f"line {line} pins vLLM {found['version']}, not {version}")
        return line, found["version"], sha(found)
    if not version:
        found = pin("mainline")
        return "mainline", found["version"], sha(found)
    names = ["mainline", *sorted(p.parent.name for p in lines.glob("*/pin.json") if p.parent.name != "mainline")]
    match = next((n for n in names if pin(n)["version"] == version), None)
    return (match, version, sha(pin(match))) if match else ("mainline", version, "")


def line_requires(lines: Path, line: str) -> list[str]:
    """The requirements ``kimi/lines/<line>/gpu-kit.txt`` adds to the line's GPU kit (one a line, ``#`` comments;
    none without the file): what the release needs that the shared resolver leaves out (the mainline's: the CuTe DSL,
    QuACK)."""
    path = lines / line / "gpu-kit.txt"
    if not path.is_file():
        return []
    return [r for r in (raw.split("#", 1)[0].strip() for raw in path.read_text().splitlines()) if r]


def kit_torch(cuda_wheel: Path, requested: str | None = None) -> str:
    """The torch a GPU kit carries: the one the release's CUDA wheel requires (``torch==X``).

    A line's ``pin.json`` names the torch of its CPU path (the mainline's says 2.13.0 while its release's CUDA
    wheel requires 2.14.0), so it never decides a GPU kit's torch. ``requested`` (``KIMI_KIT_TORCH``) must agree
    with the wheel, and names the torch when the wheel pins none.

    Raises:
        KitError: ``requested`` disagrees with the wheel, or neither names a torch.
    """
    pinned = exact_pins(wheel_requires(cuda_wheel)).get("torch")
    if pinned and requested and requested != pinned:
        raise KitError(f"{Path(cuda_wheel).name} requires torch=={pinned}, not KIMI_KIT_TORCH={requested}")
    if not (pinned or requested):
        raise KitError(f"{Path(cuda_wheel).name} pins no torch: name the one its kernels are built against with "
                       "KIMI_KIT_TORCH")
    return pinned or requested


# -- requirement checks (build: against HOST_VERSIONS; host: against what is installed) -------------------------

def _packaging():
    """(Requirement, Version, default_environment) from ``packaging``, else from pip's vendored copy, else None."""
    try:
        from packaging.markers import default_environment
        from packaging.requirements import Requirement
        from packaging.version import Version
    except ImportError:
        try:
            from pip._vendor.packaging.markers import default_environment
            from pip._vendor.packaging.requirements import Requirement
            from pip._vendor.packaging.version import Version
        except ImportError:
            return None
    return Requirement, Version, default_environment


def _host_env() -> dict:
    _, _, default_environment = _packaging()
    env = default_environment()
    env.update(python_version="3.12", python_full_version="3.12.3", platform_machine="x86_64",
               sys_platform="linux", platform_system="Linux", implementation_name="cpython",
               os_name="posix", platform_python_implementation="CPython")
    return env


def _applies(req, env: dict, extras: Iterable[str]) -> bool:
    return req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in extras)


def host_pins(wheels: list[Path], host_packages: set[str], skip: set[str]) -> list[dict]:
    """The requirements of ``wheels`` on packages that the kit does not carry but the host has, one entry a
    package: {name, specs: [(specifier, required by)], have: the host's version or None, state}, where
    state is "older" (the host's known version is below a requirement: carry the package), "newer" (it fails
    only upper bounds or exclusions: reported, not carried, since downgrading a host package under its
    other users is the greater risk; the v0.26 line's vLLM ran so with numpy 2.5.2), "unknown" (the host's version is
    not known here: checked on the host at install) or "ok".  Needs ``packaging``."""
    Requirement, Version, _ = _packaging()
    env = _host_env()
    carried = {wheel_name(w.name) for w in wheels}
    found: dict[str, dict] = {}
    for wheel in wheels:
        for line in wheel_requires(wheel):
            req = Requirement(line)
            name = norm(req.name)
            if (not _applies(req, env, [""]) or name in carried or name in skip or name not in host_packages
                    or not str(req.specifier)):
                continue
            entry = found.setdefault(name, {"name": name, "specs": [], "have": HOST_VERSIONS.get(name)})
            entry["specs"].append((str(req.specifier), wheel_name(wheel.name)))
    for entry in found.values():
        if entry["have"] is None:
            entry["state"] = "unknown"
            continue
        have = Version(entry["have"])
        state = "ok"
        for spec, _ in entry["specs"]:
            for one in Requirement(f"x{spec}").specifier:
                if one.contains(have, prereleases=True):
                    continue
                v = Version(one.version.rstrip(".*"))
                lower = one.operator in (">=", ">", "~=") or (one.operator in ("==", "===") and have < v)
                state = "older" if lower else (state if state == "older" else "newer")
        entry["state"] = state
    return sorted(found.values(), key=lambda e: e["name"])


def host_broken(release: Path, wheels: list[Path]) -> list[str]:
    """The host packages that the carried ``wheels`` break (:data:`HOST_REQUIRES`), each as the requirement to
    carry it by: the release wheel's own on it (``transformers<5.23.0,>=5.16.1``: the newest it accepts), else any
    version. Needs ``packaging``."""
    _, Version, _ = _packaging()
    from_release = requirement_specs(wheel_requires(release))
    carried = {wheel_name(w.name): w.name.split("-")[1] for w in wheels}
    out = []
    for host, needs in HOST_REQUIRES.items():
        if host in carried:
            continue
        if any(name in carried and not _spec_contains(spec, Version(carried[name])) for name, spec in needs.items()):
            out.append(host + from_release.get(host, ""))
    return out


def _spec_contains(spec: str, version) -> bool:
    Requirement, _, _ = _packaging()
    return Requirement(f"x{spec}").specifier.contains(version, prereleases=True)


def _host_pins_report(entries: list[dict]) -> list[str]:
    lines = []
    for e in entries:
        specs = ", ".join(f"{spec} ({by})" for spec, by in e["specs"])
        if e["state"] == "older":
            tag = "reported only" if NOT_AUTO_CARRIED.match(e["name"]) else "carried"
            lines.append(f"host misses, {tag}: {e['name']} {e['have']} on the host; wanted {specs}")
        elif e["state"] == "newer":
            lines.append(f"host newer, reported only: {e['name']} {e['have']} on the host; wanted {specs}")
        elif e["state"] == "unknown":
            lines.append(f"unverified (checked on the host at install): {e['name']} {specs}")
    return lines


def check_reqs(site: Path, skip: set[str], top: str = "vllm") -> int:
    """On the host, with ``site`` first on the path: walk ``top``'s requirements (and theirs) through the
    installed distributions and print the ones that are missing or at a version the requirement excludes.
    Packages left out of the kit on purpose (``skip``) are not followed.  Returns the number of problems."""
    pk = _packaging()
    if pk is None:
        print("check-reqs: `packaging` is not importable here; skipped")
        return 0
    Requirement, Version, _ = pk
    from importlib import metadata
    env = _host_env()
    env.update(python_full_version=sys.version.split()[0],
               python_version=".".join(map(str, sys.version_info[:2])))
    found: dict[str, metadata.Distribution] = {}
    for dist in metadata.distributions(path=[str(site), *[p for p in sys.path if p and p != str(site)]]):
        name = dist.metadata["Name"]
        if name:
            found.setdefault(norm(name), dist)
    problems: dict[tuple[str, str], list[str]] = {}  # (kind, name + what is there) -> [spec (required by)]
    checked = 0
    queue: list[tuple[str, tuple[str, ...]]] = [(norm(top), ("",))]
    seen: set[tuple[str, tuple[str, ...]]] = set()
    while queue:
        name, extras = queue.pop(0)
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        dist = found.get(name)
        if dist is None:
            continue
        for line in dist.requires or []:
            req = Requirement(line)
            if not _applies(req, env, extras):
                continue
            rname = norm(req.name)
            if rname in skip:
                continue
            checked += 1
            have = found.get(rname)
            where = dist.metadata["Name"]
            wanted = f"{req.specifier or 'any'} ({where})"
            if have is None:
                problems.setdefault(("missing", rname), []).append(wanted)
                continue
            if str(req.specifier) and not req.specifier.contains(Version(have.version), prereleases=True):
                loc = Path(str(have.locate_file(""))).as_posix()
                problems.setdefault(("unmet", f"{rname} {have.version} in {loc}"), []).append(wanted)
            queue.append((rname, tuple(sorted({"", *req.extras}))))
    print(f"check-reqs: {checked} requirements of {top} and its dependencies checked against {site} and "
          f"the host; {len(problems)} packages fall short (left out on purpose and not checked: {len(skip)})")
    for (kind, what), wanted in sorted(problems.items(), key=lambda kv: (kv[0][0] != "unmet", kv[0][1])):
        print(f"  {kind:8} {what}; wanted {', '.join(dict.fromkeys(wanted))}")
    return len(problems)


# -- the device calls --------------------------------------------------------------------------------------------

def calls(kit: Path, root: Path, command: str, last_command: str | None, only: list[str] | None,
          as_json: bool) -> list[dict]:
    """The device ``run`` calls that bring the kit, one chunk each, back to back; the call with the last
    chunk installs it and runs ``last_command`` (default ``command``)."""
    man = load_manifest(kit / MANIFEST)
    try:
        rel = kit.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        raise KitError(f"{kit} is not inside {root}: a device call carries paths of the repository only") from None
    chunks = [c for c in man["chunks"] if not only or c["name"] in only]
    if only and len(chunks) != len(set(only)):
        raise KitError(f"not in the manifest: {' '.join(sorted(set(only) - {c['name'] for c in man['chunks']}))}")
    out = []
    for i, c in enumerate(chunks):
        last = i == len(chunks) - 1
        out.append({"command": (last_command or command) if last else command,
                    "carry": [f"{rel}/{MANIFEST}", f"{rel}/{c['name']}"], "timeout_s": 600 if last else 60,
                    "mib": round(c["size"] / MiB, 1)})
    if as_json:
        for call in out:
            print(json.dumps({k: call[k] for k in ("command", "carry", "timeout_s")}))
        return out
    tree = tree_bytes(root)
    print(f"# kit {man['kit_id']}: vLLM {man.get('version')}, torch {man.get('torch')}, {len(man['chunks'])} chunks, "
          f"{fmt_mib(man['total_size'])}; working tree {fmt_mib(tree)} travels with each call")
    biggest = max(c["size"] for c in chunks) + (kit / MANIFEST).stat().st_size
    if tree + biggest > CALL_LIMIT_MIB * MiB:
        print(f"# WARNING: a chunk, its manifest and the working tree make {fmt_mib(tree + biggest)}, over a call's "
              f"{CALL_LIMIT_MIB} MiB: cut it again with `python3 lab/kimi_lab/gpukit.py rechunk --kit {kit}` (same "
              "stream and kit id, chunks sized for this tree), or carry less")
    print(f"# {len(out)} device calls, back to back (an idle machine is given back after ~30 s and loses /tmp);")
    print("# each stash call takes a few seconds; the last one installs (~1 min) and then runs its command.")
    print("# If a reply says MACHINE RESTARTED or NOTHING STASHED, start again with the chunks it names.")
    for i, call in enumerate(out, 1):
        print(f"{i:>2}. command={json.dumps(call['command'])} carry={json.dumps(call['carry'])} "
              f"timeout_s={call['timeout_s']}   # {call['mib']} MiB")
    return out


# -- command line ------------------------------------------------------------------------------------------------

def _pairs(values: list[str] | None, what: str) -> list[tuple[str, Path]]:
    pairs = []
    for v in values or []:
        if "=" not in v:
            raise KitError(f"{what} wants NAME=PATH, not {v!r}")
        name, path = v.split("=", 1)
        pairs.append((name.strip("/"), Path(path)))
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpukit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("chunk-mib", help="default chunk size (MiB) for this working tree")
    p.add_argument("--root", type=Path, default=Path("."))
    p.add_argument("--limit-mib", type=int, default=CALL_LIMIT_MIB)
    p.add_argument("--margin-mib", type=int, default=MARGIN_MIB)
    p = sub.add_parser("wheel-pin", help="the ==version that WHEEL requires of NAME (empty if none)")
    p.add_argument("wheel", type=Path)
    p.add_argument("name")
    p = sub.add_parser("line", help="the kit's line, vLLM version and pinned CUDA-wheel sha256, one a line")
    p.add_argument("--lines", type=Path, required=True, help="kimi/lines")
    p.add_argument("--line")
    p.add_argument("--version")
    p = sub.add_parser("line-requires", help="requirements kimi/lines/LINE/gpu-kit.txt adds to the kit, one a line")
    p.add_argument("--lines", type=Path, required=True, help="kimi/lines")
    p.add_argument("line")
    p = sub.add_parser("kit-torch", help="the torch a GPU kit carries: the one the CUDA wheel requires")
    p.add_argument("wheel", type=Path)
    p.add_argument("--torch", help="KIMI_KIT_TORCH: must agree with the wheel; needed if it pins none")
    p = sub.add_parser("skip-names", help="resolve_wheels.py's DEFAULT_SKIP less the carried wheels, comma-separated")
    p.add_argument("resolve_wheels", type=Path)
    p.add_argument("--carried", type=Path, help="the folder of carried wheels")
    p = sub.add_parser("torch-stack", help="requirements that must travel with this torch wheel")
    p.add_argument("wheel", type=Path)
    p = sub.add_parser("host-broken", help="host packages the carried WHEELs break, as requirements to carry them by")
    p.add_argument("release", type=Path, help="the vllm wheel (its requirement on a broken package is used)")
    p.add_argument("wheels", type=Path, nargs="*")
    p = sub.add_parser("host-pins", help="requirements of WHEELs that the host's own packages may miss")
    p.add_argument("wheels", type=Path, nargs="+")
    p.add_argument("--host-packages", type=Path, required=True)
    p.add_argument("--skip", default="", help="comma-separated names left out on purpose")
    p.add_argument("--misses", action="store_true", help="print only the misses that may be carried, one a line")
    p = sub.add_parser("pack", help="write the stream as chunks and MANIFEST.json")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--chunk-mib", type=float, required=True)
    p.add_argument("--add", action="append", help="ARCNAME=PATH (a file or folder)")
    p.add_argument("--payload", action="append", help="REL=PATH: a folder unpacked at REL in the repo on the host")
    p.add_argument("--meta", action="append", help="KEY=VALUE, kept in the manifest and kit.json")
    p = sub.add_parser("rechunk", help="cut the kit's stream again into chunks that fit this working tree")
    p.add_argument("--kit", type=Path, required=True)
    p.add_argument("--root", type=Path, default=Path("."))
    p.add_argument("--chunk-mib", type=float, help="default: the largest that fits (chunk-mib)")
    p = sub.add_parser("stash", help="(host) verify and stash the carried chunks; say what is missing")
    p.add_argument("--kit", type=Path, required=True)
    p.add_argument("--stash", type=Path, required=True)
    p.add_argument("--site", type=Path)
    p.add_argument("--report", type=Path, help="also write the state as JSON here")
    p = sub.add_parser("unpack", help="(host) check the total sha256 and unpack the stashed stream")
    p.add_argument("--kit", type=Path, required=True)
    p.add_argument("--stash", type=Path, required=True)
    p.add_argument("--dest", type=Path, required=True)
    p = sub.add_parser("check-reqs", help="(host) requirements of the installed vllm that are not met")
    p.add_argument("--site", type=Path, required=True)
    p.add_argument("--kit-json", type=Path, help="kit.json: its 'skip' names are not checked")
    p.add_argument("--top", default="vllm")
    p = sub.add_parser("field", help="print one top-level value of a JSON file (lists one item a line)")
    p.add_argument("file", type=Path)
    p.add_argument("key")
    p = sub.add_parser("calls", help="the device calls to make, in order")
    p.add_argument("--kit", type=Path, required=True)
    p.add_argument("--root", type=Path, default=Path("."))
    p.add_argument("--command", default="bash benchmarks/gpu_call.sh")
    p.add_argument("--last-command", help="the command of the call with the last chunk (default: --command)")
    p.add_argument("--only", help="comma-separated chunk names (e.g. the missing ones a reply named)")
    p.add_argument("--json", action="store_true", help="one JSON object a line")
    a = parser.parse_args(argv)
    try:
        return _run(a)
    except KitError as e:
        print(f"gpukit: {e}", file=sys.stderr)
        return BROKEN


def _run(a: argparse.Namespace) -> int:
    if a.cmd == "chunk-mib":
        tree = tree_bytes(a.root)
        mib = default_chunk_mib(tree, a.limit_mib, a.margin_mib)
        print(f"gpukit: working tree {fmt_mib(tree)} -> chunks of {mib} MiB", file=sys.stderr)
        print(mib)
    elif a.cmd == "wheel-pin":
        print(exact_pins(wheel_requires(a.wheel)).get(norm(a.name), ""))
    elif a.cmd == "line":
        print("\n".join(kit_line(a.lines, a.line or None, a.version or None)))
    elif a.cmd == "line-requires":
        print("\n".join(line_requires(a.lines, a.line)))
    elif a.cmd == "kit-torch":
        print(kit_torch(a.wheel, a.torch or None))
    elif a.cmd == "skip-names":
        carried = {wheel_name(w.name) for w in a.carried.glob("*.whl")} if a.carried else set()
        print(",".join(n for n in resolve_skip(a.resolve_wheels) if n not in carried))
    elif a.cmd == "torch-stack":
        _, reqs, warnings = torch_stack(a.wheel)
        for w in warnings:
            print(f"gpukit: warning: {w}", file=sys.stderr)
        print("\n".join(reqs))
    elif a.cmd == "host-broken":
        if _packaging() is None:
            raise KitError("host-broken needs `packaging`")
        print("\n".join(host_broken(a.release, a.wheels)))
    elif a.cmd == "host-pins":
        if _packaging() is None:
            raise KitError("host-pins needs `packaging`")
        host = {norm(x) for x in a.host_packages.read_text().split() if not x.startswith("#")}
        entries = host_pins(a.wheels, host, {norm(x) for x in a.skip.split(",") if x})
        if a.misses:
            for e in entries:
                if e["state"] == "older" and not NOT_AUTO_CARRIED.match(e["name"]):
                    print(e["name"] + ",".join(spec for spec, _ in e["specs"]))
            return 0
        print("\n".join(_host_pins_report(entries)))
    elif a.cmd == "pack":
        meta = dict(kv.split("=", 1) for kv in a.meta or [])
        for key in ("skip", "host_misses", "host_unverified"):
            if key in meta:
                meta[key] = [x for x in re.split(r"[,\n]", meta[key]) if x.strip()]
        man = pack(a.out, a.chunk_mib, _pairs(a.add, "--add"), _pairs(a.payload, "--payload"), meta)
        sizes = ", ".join(f"{c['name']} {fmt_mib(c['size'])}" for c in man["chunks"])
        print(f"kit {man['kit_id']}: {len(man['chunks'])} chunks, {fmt_mib(man['total_size'])} "
              f"(sha256 {man['total_sha256']}) in {a.out} [{man['pack_s']} s]\n  {sizes}")
    elif a.cmd == "rechunk":
        man = rechunk(a.kit, a.chunk_mib or default_chunk_mib(tree_bytes(a.root)))
        print(f"kit {man['kit_id']}: {len(man['chunks'])} chunks of {fmt_mib(man['chunk_size'])} in {a.kit}")
    elif a.cmd == "stash":
        return stash(a.kit, a.stash, a.site, a.report)
    elif a.cmd == "unpack":
        return unpack(a.kit, a.stash, a.dest)
    elif a.cmd == "check-reqs":
        skip = set()
        if a.kit_json and a.kit_json.is_file():
            skip = {norm(x) for x in json.loads(a.kit_json.read_text()).get("skip", [])}
        check_reqs(a.site, skip, a.top)
    elif a.cmd == "field":
        value = json.loads(a.file.read_text()).get(a.key, "")
        print("\n".join(map(str, value)) if isinstance(value, list) else value)
    elif a.cmd == "calls":
        only = [x for x in (a.only or "").replace(",", " ").split() if x] or None
        calls(a.kit, a.root, a.command, a.last_command, only, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
