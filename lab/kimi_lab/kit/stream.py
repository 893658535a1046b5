"""Writing the kit's stream: one tar stream cut into chunks as it is written, and the manifest that names them."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import time
from pathlib import Path

from kimi_lab.kit.base import BLOCK, FORMAT, KIT_JSON, MANIFEST, KitError, MiB, load_manifest, wheel_name
from kimi_lab.kit.plan import chunk_names


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
