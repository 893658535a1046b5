"""The device side: stash each carried chunk, checked against the manifest, and unpack the stream once all are
there (``python3 -S``: standard library only)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import time
from collections.abc import Iterable
from pathlib import Path

from kimi_lab.kit.base import (
    BLOCK,
    COMPLETE,
    INCOMPLETE,
    INSTALLED,
    MANIFEST,
    REFUSED,
    KitError,
    MiB,
    fmt_mib,
    load_manifest,
)


def _names(chunks: Iterable[dict]) -> str:
    return " ".join(c["name"] for c in chunks)


def _rel(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)



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
