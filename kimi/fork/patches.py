"""Patch files of a series: header format, parsing, validation, writing.

A patch is ``kimi/lines/<line>/patches/NNNN-slug.patch``; the series is the
files in name order.  Each file is a header followed by a git diff::

    Subject: vllm --help works on a machine without a GPU
    What: the CLI builds its parsers on the CPU platform when only help is asked.
    Why: `vllm serve --help` with the CUDA build on a host without a GPU fails
      with "Failed to infer device type".
    Upstream: fork-only
    Forwarded: no - ready to send
    Tests: tests/patches/test_cli_help_without_gpu.py

    diff --git a/vllm/entrypoints/cli/main.py b/vllm/entrypoints/cli/main.py
    ...

Fields are ``Key: value``; an indented line continues the previous field.
``Upstream`` is ``fork-only``, an upstream reference (``issue vllm#45258``,
``PR vllm#12345``), or ``absorbed in X.Y[.Z]``; free text may follow after
`` - ``.  ``Forwarded`` says whether the change was sent upstream, as DEP-3's field
does: ``no``, ``not-needed`` (fork machinery upstream would not take) or the
URL of the PR or issue; free text may follow after `` - `` (a generic bug fix
says ``no - ready to send``).  ``git apply`` ignores the header.

Optional: ``Absorbed-check`` names the tests (comma separated) that show the
patch's symptom gone; for a patch ``absorbed in X.Y.Z`` they pass on that
release without the patch (``kimi rebase`` lists them when it drops the
patch; default: ``Tests``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from kimi.errors import KimiError
from kimi.fork.fsutil import read_exact, sha256_file, write_atomic

FIELDS = ("Subject", "What", "Why", "Upstream", "Forwarded", "Tests")
PLACEHOLDER = "TODO:"
_NAME = re.compile(r"^\d{4}-[a-z0-9][a-z0-9-]*\.patch$")
_UPSTREAM = re.compile(
    r"^(fork-only|(issue|PR|RFC) [\w.-]+#\d+(, (issue|PR|RFC) [\w.-]+#\d+)*|absorbed in \d+\.\d+(\.\d+)?)( - .+)?$"
)
_FORWARDED = re.compile(r"^(no|not-needed|https?://\S+)( - .+)?$", re.S)
_FIELD = re.compile(r"^([A-Z][A-Za-z-]*):\s?(.*)$")


@dataclass(frozen=True)
class Patch:
    """One patch of a series.

    Attributes:
        path: the patch file.
        header: field name -> value (continuation lines joined with newlines).
        diff: the git diff, starting at the first ``diff --git`` line.
    """

    path: Path
    header: dict[str, str]
    diff: str

    @property
    def name(self) -> str:
        """File name without ``.patch``, e.g. ``0001-cli-help-without-gpu``."""
        return self.path.stem

    @property
    def digest(self) -> str:
        """sha256 of the patch file's bytes, to notice edits since the last sync."""
        return sha256_file(self.path)

    def files(self) -> list[str]:
        """Paths the diff touches (``b/`` side; the ``a/`` side for deletions)."""
        return sorted(set(re.findall(r"^diff --git a/(\S+) b/\S+$", self.diff, re.M)))


def split(text: str) -> tuple[str, str]:
    """Split a patch file's text into (header, diff)."""
    match = re.search(r"^diff --git ", text, re.M)
    if match is None:
        return text, ""
    return text[: match.start()], text[match.start():]


def parse_header(text: str, where: Path) -> dict[str, str]:
    """Parse the ``Key: value`` header block; raises KimiError on a stray line."""
    header: dict[str, str] = {}
    key = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            key = None
            continue
        if line[0] in " \t" and key is not None:
            header[key] += "\n" + line.strip()
            continue
        match = _FIELD.match(line)
        if match is None:
            raise KimiError(f"{where}:{lineno}: header line is not 'Key: value': {line!r}")
        key = match.group(1)
        header[key] = match.group(2).strip()
    return header


def validate(patch: Patch) -> None:
    """Check the header fields and that there is a diff.

    Raises:
        KimiError: naming the patch file and the missing or malformed field.
    """
    where = patch.path
    if not _NAME.match(where.name):
        raise KimiError(f"{where}: patch files are named NNNN-lowercase-slug.patch")
    for key in FIELDS:
        value = patch.header.get(key, "")
        if not value:
            raise KimiError(f"{where}: header field {key!r} is missing (fields: {', '.join(FIELDS)})")
        if value.startswith(PLACEHOLDER):
            raise KimiError(f"{where}: header field {key!r} still says TODO (fill it in)")
    if not _UPSTREAM.match(patch.header["Upstream"]):
        raise KimiError(
            f"{where}: Upstream must be 'fork-only', 'issue vllm#N', 'PR vllm#N' or 'absorbed in X.Y', "
            f"not {patch.header['Upstream']!r}"
        )
    if not _FORWARDED.match(patch.header["Forwarded"]):
        raise KimiError(
            f"{where}: Forwarded must be 'no', 'not-needed' or the URL of the upstream PR or issue "
            f"(then ' - ' and free text), not {patch.header['Forwarded']!r}"
        )
    if not patch.diff:
        raise KimiError(f"{where}: no 'diff --git' section")


def read_patch(path: Path) -> Patch:
    """Parse one patch file (without validating it)."""
    header_text, diff = split(read_exact(path))
    return Patch(path=path, header=parse_header(header_text, path), diff=diff)


def load_series(patches_dir: Path) -> list[Patch]:
    """All patches of a line in application order, each validated.

    Raises:
        KimiError: a patch fails validation, or two patches share a number.
    """
    if not patches_dir.is_dir():
        return []
    series = [read_patch(p) for p in sorted(patches_dir.glob("*.patch"))]
    seen: dict[str, Path] = {}
    for patch in series:
        validate(patch)
        number = patch.path.name[:4]
        if number in seen:
            raise KimiError(f"{patch.path} and {seen[number]} share the number {number}")
        seen[number] = patch.path
    return series


def render(header: dict[str, str], diff: str) -> str:
    """The text of a patch file: header fields in the standard order, a blank line, the diff."""
    ordered = [k for k in FIELDS if k in header] + [k for k in header if k not in FIELDS]
    lines = []
    for key in ordered:
        first, *rest = header[key].split("\n")
        lines.append(f"{key}: {first}")
        lines.extend(f"  {more}" for more in rest)
    return "\n".join(lines) + "\n\n" + diff


def template_header(subject: str) -> dict[str, str]:
    """Header of a new patch made by ``kimi refresh --new``; the TODOs must be filled in."""
    return {
        "Subject": subject,
        "What": f"{PLACEHOLDER} what the patch changes",
        "Why": f"{PLACEHOLDER} the failing input it fixes",
        "Upstream": f"{PLACEHOLDER} fork-only | issue vllm#N | PR vllm#N | absorbed in X.Y",
        "Forwarded": f"{PLACEHOLDER} no | not-needed | URL of the upstream PR or issue",
        "Tests": f"{PLACEHOLDER} tests that cover it",
    }


def write_patch(path: Path, header: dict[str, str], diff: str) -> None:
    """Write a patch file atomically."""
    write_atomic(path, render(header, diff))
