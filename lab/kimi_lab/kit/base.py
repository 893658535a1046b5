"""What the kit's modules share: sizes and names, the kit's error and exit codes, project names, the manifest."""

from __future__ import annotations

import hashlib
import json
import re
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

#: The exit codes of the kit's commands (``stash`` returns them; a :class:`KitError` exits BROKEN).
COMPLETE, INCOMPLETE, REFUSED, BROKEN, INSTALLED = 0, 1, 2, 3, 4


def norm(name: str) -> str:
    """PEP 503 normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(filename: str) -> str:
    """The normalized project name of a wheel file name."""
    return norm(Path(filename).name.split("-", 1)[0])


def fmt_mib(n: int) -> str:
    """``n`` bytes in MiB, one decimal."""
    return f"{n / MiB:.1f} MiB"


def sha256_file(path: Path) -> str:
    """The sha256 of a file, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            h.update(block)
    return h.hexdigest()


class KitError(Exception):
    """A problem with the kit that the message explains; the command exits 3."""


def load_manifest(path: Path) -> dict:
    """The kit's manifest at ``path``; :class:`KitError` when it is missing, not JSON or not a kit's."""
    try:
        man = json.loads(path.read_text())
    except FileNotFoundError:
        raise KitError(f"no {path}: carry the kit's {MANIFEST} with every call") from None
    except ValueError as e:
        raise KitError(f"{path} is not valid JSON ({e}): carry it again") from None
    if man.get("format") != FORMAT or not man.get("chunks") or not man.get("total_sha256"):
        raise KitError(f"{path} is not a {FORMAT} manifest")
    return man
