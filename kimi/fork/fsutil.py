"""Small file-system helpers: atomic writes, exact text, content digests.

Text read from or written to patch files and git is decoded as UTF-8 with
``surrogateescape`` and without newline translation, so any byte sequence
(CRLF line ends, Latin-1 text) survives a round trip unchanged.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def decode(raw: bytes) -> str:
    """Bytes to str, losslessly (UTF-8 + surrogateescape, no newline translation)."""
    return raw.decode("utf-8", "surrogateescape")


def encode(text: str) -> bytes:
    """The inverse of ``decode``."""
    return text.encode("utf-8", "surrogateescape")


def read_exact(path: Path) -> str:
    """A file's text exactly as stored (see ``decode``)."""
    return decode(path.read_bytes())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def default_mode(folder: bool = False) -> int:
    """The permissions a plain ``open``/``mkdir`` would give (0644 / 0755 under the usual umask)."""
    return (0o777 if folder else 0o666) & ~_umask()


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename.

    A reader sees the old file or the new one, never a half-written one.  The
    file gets the usual permissions (``default_mode``), not ``mkstemp``'s 0600.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = encode(data) if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
        os.chmod(tmp, default_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented, key-sorted JSON, atomically."""
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def read_json_object(path: Path) -> dict | None:
    """The JSON object stored at ``path``; None when there is no such file.

    Raises:
        ValueError: the file cannot be read, is not valid JSON, or holds something other than an object (the
            message names the file; the caller adds the way out).
    """
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data


def check_replaceable(dst: Path, marker: str, force: bool, keep: tuple[Path, ...] = (),
                      inputs: tuple[Path, ...] = (), marker_keys: tuple[str, ...] = ()) -> None:
    """Refuse to write a folder over something that must not be lost, or where it cannot be written (the
    nearest existing folder on its path is not writable): called before the command's work, not after it.

    Args:
        dst: the folder about to be written.
        marker: a file name an earlier output of the same command holds
            (``config.json``, ``MANIFEST.json``); only such a folder is replaced.
        force: the user asked to replace an existing output.
        keep: paths that must survive (the input, the working directory):
            ``dst`` may not be one of them or contain one.
        inputs: folders the command reads: ``dst`` may not be one, contain one
            or lie inside one.
        marker_keys: top-level keys the marker (a JSON object) of an earlier
            output of the same command holds; a marker without one belongs
            to another command's output, which ``force`` does not replace.

    Raises:
        KimiError: with the reason and the way out.
    """
    from kimi.errors import KimiError

    dest = dst.resolve()
    for path in inputs:
        if dest == path.resolve():
            raise KimiError(f"{dst} is an input of this command: choose another folder to write")
    for path in (*keep, *inputs):
        if dest == path.resolve() or dest in path.resolve().parents:
            raise KimiError(f"{dst} holds {path}: choose a folder outside it")
    for path in inputs:
        if path.resolve() in dest.parents:
            raise KimiError(f"{dst} lies inside {path}, an input of this command: choose a folder outside it")
    if dst.is_symlink() or (dst.exists() and not dst.is_dir()):
        raise KimiError(f"{dst} exists and is not a folder; choose another destination")
    if dst.exists() and not force:
        raise KimiError(f"{dst} exists; choose another folder or pass --force to replace it")
    if dst.exists() and any(dst.iterdir()) and not (dst / marker).is_file():
        raise KimiError(f"{dst} has no {marker}: it is not an earlier output, and --force only replaces those")
    if marker_keys and (dst / marker).is_file():
        try:
            found = read_json_object(dst / marker)
        except ValueError as exc:
            raise KimiError(f"{exc}: not a readable JSON manifest, so not an earlier output; choose another "
                            "folder") from None
        if not all(key in found for key in marker_keys):
            raise KimiError(f"{dst} holds another command's output ({dst / marker} has no "
                            f"{' / '.join(marker_keys)}): --force does not replace it; choose another folder")
    parent = dest.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise KimiError(f"cannot write {dst}: {parent} is not a folder this user can write in")


def publish_folder(staging: Path, dst: Path) -> None:
    """Put the finished ``staging`` folder at ``dst`` (same file system); an existing ``dst`` is swapped
    out first and removed after, so ``dst`` is the old folder or the new one, never a mix."""
    os.chmod(staging, default_mode(folder=True))
    if not dst.exists():
        os.replace(staging, dst)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old.", dir=dst.parent))
    os.replace(dst, old / dst.name)
    os.replace(staging, dst)
    shutil.rmtree(old)


@contextlib.contextmanager
def staged_folder(dst: Path) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``dst``; when the block succeeds it becomes ``dst``
    (``publish_folder``), and in every case nothing temporary is left behind.

    Raises:
        KimiError: a file-system error while writing (``nothing was written``).
    """
    from kimi.errors import KimiError

    staging = None
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
        yield staging
        publish_folder(staging, dst)
    except OSError as exc:
        raise KimiError(f"writing {dst} failed: {exc.strerror or exc}; nothing was written") from None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def copy_folder(source: Path, dst: Path) -> None:
    """Copy the folder ``source`` to ``dst`` through :func:`staged_folder`: ``dst`` is the old folder or the whole
    copy, never a part of it.

    Raises:
        KimiError: a file-system error while writing (nothing was written).
    """
    with staged_folder(dst) as staging:
        shutil.copytree(source, staging, dirs_exist_ok=True)
