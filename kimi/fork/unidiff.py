"""A small, strict applier of git-format unified diffs (the diffs of the patch series), in pure Python.

Used where git cannot be relied on: applying the series to an installed vLLM
(``kimi install-into``).  Hunks must match exactly (no fuzz); a hunk may move
by any number of lines from where its header says, the nearest exact match
wins, as with ``git apply`` / ``patch -F0``.  New and deleted files are
supported; renames, copies, mode-only changes and binary diffs are refused.

Text is handled as ``fsutil.decode``-d strings, so any bytes survive.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kimi.errors import KimiError

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_GIT = re.compile(r"^diff --git a/(\S+) b/(\S+)$")
NO_NEWLINE = "\\ No newline at end of file"


@dataclass
class Hunk:
    """One ``@@`` block: the lines it expects (``old``) and the lines it leaves (``new``), with line ends."""

    header: str
    old_start: int
    new_start: int
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)


@dataclass
class FileDiff:
    """The changes of one file; ``old_path`` is None for a new file, ``new_path`` None for a deletion."""

    path: str
    old_path: str | None
    new_path: str | None
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def creates(self) -> bool:
        return self.old_path is None

    @property
    def deletes(self) -> bool:
        return self.new_path is None


def _strip_prefix(name: str, prefix: str) -> str | None:
    name = name.split("\t", 1)[0]
    if name == "/dev/null":
        return None
    return name[len(prefix):] if name.startswith(prefix) else name


def parse(diff: str, where: str = "diff") -> list[FileDiff]:
    """Parse a git diff into file diffs.

    Raises:
        KimiError: a rename, copy, binary or malformed section (names ``where`` and the line).
    """
    files: list[FileDiff] = []
    current: FileDiff | None = None
    hunk: Hunk | None = None
    remaining_old = remaining_new = 0
    lines = diff.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        raw = lines[i]
        line = raw.rstrip("\n").rstrip("\r")
        i += 1
        if line == NO_NEWLINE and hunk is not None:
            # the previous line of the hunk has no line end, on the side(s) it belongs to
            prev = lines[i - 2]
            if prev[:1] in (" ", "-") and hunk.old:
                hunk.old[-1] = hunk.old[-1].rstrip("\n")
            if prev[:1] in (" ", "+") and hunk.new:
                hunk.new[-1] = hunk.new[-1].rstrip("\n")
            continue
        if hunk is not None and (remaining_old > 0 or remaining_new > 0):
            tag, body = (raw[:1], raw[1:]) if raw not in ("\n", "\r\n") else (" ", raw)
            if tag == " ":
                hunk.old.append(body)
                hunk.new.append(body)
                remaining_old -= 1
                remaining_new -= 1
            elif tag == "-":
                hunk.old.append(body)
                remaining_old -= 1
            elif tag == "+":
                hunk.new.append(body)
                remaining_new -= 1
            else:
                raise KimiError(f"{where}: hunk {hunk.header!r} of {current.path} ends early at {line!r}")
            if remaining_old < 0 or remaining_new < 0:
                raise KimiError(f"{where}: hunk {hunk.header!r} of {current.path} is longer than its header says")
            continue
        match = _GIT.match(line)
        if match:
            current = FileDiff(path=match.group(2), old_path=match.group(1), new_path=match.group(2))
            files.append(current)
            hunk = None
            continue
        if current is None:
            continue  # text before the first diff (a header)
        if line.startswith(("rename ", "copy ", "similarity index", "Binary files", "GIT binary patch")):
            raise KimiError(f"{where}: {current.path}: renames, copies and binary diffs are not supported "
                            f"({line!r})")
        if line.startswith(("old mode", "new mode")):
            continue  # the mode of an existing file is left as it is
        if line.startswith(("index ", "new file mode", "deleted file mode")):
            continue
        if line.startswith("--- "):
            current.old_path = _strip_prefix(line[4:], "a/")
            continue
        if line.startswith("+++ "):
            current.new_path = _strip_prefix(line[4:], "b/")
            continue
        match = _HUNK.match(line)
        if match:
            old_start, old_len, new_start, new_len = match.groups()
            hunk = Hunk(header=line, old_start=int(old_start), new_start=int(new_start))
            remaining_old = 1 if old_len is None else int(old_len)
            remaining_new = 1 if new_len is None else int(new_len)
            current.hunks.append(hunk)
            continue
        if line.strip():
            raise KimiError(f"{where}: unexpected line in the diff of {current.path}: {line!r}")
    for fd in files:
        if fd.old_path is None and fd.new_path is None:
            raise KimiError(f"{where}: {fd.path}: both sides are /dev/null")
        if fd.new_path is not None:
            fd.path = fd.new_path
    return files


def _find(lines: list[str], block: list[str], expected: int, lo: int) -> int | None:
    """Index >= lo where ``block`` matches ``lines`` exactly, nearest to ``expected``; None if nowhere."""
    n = len(block)
    last = len(lines) - n
    if last < lo:
        return None
    expected = min(max(expected, lo), last)
    for delta in range(0, max(expected - lo, last - expected) + 1):
        for pos in (expected - delta, expected + delta) if delta else (expected,):
            if lo <= pos <= last and lines[pos:pos + n] == block:
                return pos
    return None


class HunkFailed(KimiError):
    """A hunk's expected lines are not in the file."""

    def __init__(self, path: str, hunk: Hunk) -> None:
        super().__init__(f"{path}: hunk {hunk.header} does not apply (its context or removed lines are not there)")
        self.path = path
        self.hunk = hunk


def apply(text: str | None, fd: FileDiff, reverse: bool = False) -> str | None:
    """The text after applying ``fd`` to ``text`` (None: the file does not exist / is deleted).

    Args:
        text: the file's current text, or None when it does not exist.
        fd: the file's diff.
        reverse: undo the diff instead (used to recognise a change already present).

    Raises:
        HunkFailed: a hunk's lines are not found.
        KimiError: a file to create exists, or a file to change or delete does not.
    """
    creates, deletes = (fd.deletes, fd.creates) if reverse else (fd.creates, fd.deletes)
    if creates and text is not None:
        raise KimiError(f"{fd.path}: the diff creates it, but it exists")
    if not creates and text is None:
        raise KimiError(f"{fd.path}: the diff changes it, but it does not exist")
    lines = [] if text is None else text.splitlines(keepends=True)
    out: list[str] = []
    pos = 0
    drift = 0  # how far the previous hunk was found from where its header said
    for hunk in fd.hunks:
        old, new = (hunk.new, hunk.old) if reverse else (hunk.old, hunk.new)
        start = hunk.new_start if reverse else hunk.old_start
        # a header's start is the first line of the hunk, or the line it inserts after when it expects none
        expected = (start - 1 if old else start) + drift
        found = _find(lines, old, expected, pos) if old else min(max(expected, pos), len(lines))
        if found is None:
            raise HunkFailed(fd.path, hunk)
        drift = found - (start - 1 if old else start)
        out.extend(lines[pos:found])
        out.extend(new)
        pos = found + len(old)
    out.extend(lines[pos:])
    if deletes:
        if out:
            raise KimiError(f"{fd.path}: the diff deletes it, but it holds more than the diff removes")
        return None
    return "".join(out)
