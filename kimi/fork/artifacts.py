"""Obtain a pinned upstream file and prove it is the pinned one.

Order: the local cache, then ``--from DIR`` (an air-gapped site's copy), then
the package index.  Every file is checked against the pin's sha256 before it
is used or enters the cache; a download goes to a temporary name first, so
the cache never holds a partial or unverified file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
import urllib.request
from pathlib import Path

from kimi.errors import KimiError
from kimi.fork import index as pkgindex
from kimi.fork.fsutil import sha256_file
from kimi.fork.pin import Artifact


def _mismatch(artifact: Artifact, where: str, actual: str) -> KimiError:
    return KimiError(
        f"sha256 mismatch for {artifact.file} ({where}): expected {artifact.sha256}, got {actual}; "
        "nothing was changed"
    )


class _Progress:
    """Download progress on stderr: one rewritten line on a terminal, a line per 10 % otherwise."""

    def __init__(self, name: str, total: int | None) -> None:
        self.name, self.total, self.done = name, total, 0
        self.tty = sys.stderr.isatty()
        self.last_step = -1
        self.start = time.monotonic()

    def update(self, n: int) -> None:
        self.done += n
        if not self.total:
            return
        step = self.done * 10 // self.total
        if self.tty or step != self.last_step:
            self.last_step = step
            end = "\r" if self.tty and self.done < self.total else "\n"
            mb = self.done / 1e6
            rate = mb / max(time.monotonic() - self.start, 1e-6)
            print(f"  {self.name}: {mb:,.0f} / {self.total / 1e6:,.0f} MB ({rate:,.0f} MB/s)", end=end, file=sys.stderr)


def _download(url: str, dest: Path, artifact: Artifact) -> None:
    part = dest.with_name(f".{dest.name}.part-{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=pkgindex.TIMEOUT_S) as resp, open(part, "wb") as out:
            length = resp.headers.get("Content-Length") if resp.headers else None
            progress = _Progress(artifact.file, int(length) if length else None)
            while block := resp.read(1 << 20):
                digest.update(block)
                out.write(block)
                progress.update(len(block))
        if digest.hexdigest() != artifact.sha256:
            raise _mismatch(artifact, f"downloaded from {url}", digest.hexdigest())
        os.replace(part, dest)
    except OSError as exc:
        raise KimiError(f"downloading {url} failed: {exc}") from None
    finally:
        part.unlink(missing_ok=True)


def obtain(artifact: Artifact, cache: Path, from_dir: Path | None = None, *, quiet: bool = False) -> Path:
    """Return the path of the verified ``artifact`` inside ``cache``.

    Args:
        artifact: the pinned file (name and sha256).
        cache: folder of verified downloads; created if missing.
        from_dir: optional folder with the file (air-gapped sites); it is
            verified and copied into the cache.
        quiet: do not print where the file came from.

    Raises:
        KimiError: a sha256 mismatch (names the file, expected and actual
            digest), a missing ``--from`` file, or an index that cannot be
            reached or does not have the file.  Nothing unverified is left in
            the cache (a corrupt cached copy is removed and fetched again).
    """
    cache.mkdir(parents=True, exist_ok=True)
    dest = cache / artifact.file
    say = (lambda msg: None) if quiet else (lambda msg: print(msg, file=sys.stderr))
    if dest.is_file():
        actual = sha256_file(dest)
        if actual == artifact.sha256:
            say(f"kimi: {artifact.file}: cached, sha256 ok")
            return dest
        print(f"kimi: warning: the cached {artifact.file} has sha256 {actual}, expected {artifact.sha256}; "
              "fetching it again", file=sys.stderr)
        dest.unlink()
    if from_dir is not None:
        source = from_dir / artifact.file
        if not source.is_file():
            raise KimiError(f"--from {from_dir}: no {artifact.file} there")
        actual = sha256_file(source)
        if actual != artifact.sha256:
            raise _mismatch(artifact, f"in {from_dir}", actual)
        part = dest.with_name(f".{dest.name}.part-{os.getpid()}")
        shutil.copyfile(source, part)
        os.replace(part, dest)
        say(f"kimi: {artifact.file}: copied from {from_dir}, sha256 ok")
        return dest
    index = pkgindex.index_url()
    url = pkgindex.find_file(index, artifact.project, artifact.file)
    say(f"kimi: {artifact.file}: downloading from the package index")
    _download(url, dest, artifact)
    say(f"kimi: {artifact.file}: sha256 ok")
    return dest
