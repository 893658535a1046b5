"""The reference pair's files and their digests: what ``MANIFEST.json`` lists, and the check that a pair is whole.

A pair folder holds ``target/``, ``drafter/`` and ``MANIFEST.json``; the manifest's ``files`` maps each file of
``target/`` and ``drafter/`` (relative path) to its sha256, so a truncated copy, a Git LFS pointer or a hand-edited
config is named before any engine loads it.
"""

from __future__ import annotations

import json
from pathlib import Path

from kimi.errors import KimiError
from kimi.fork.fsutil import sha256_file

#: The folders of a pair whose files the manifest lists.
PARTS = ("target", "drafter")


def pair_digests(folder: Path) -> dict[str, str]:
    """``{"target/model.safetensors": sha256, ...}`` for every regular file of ``folder``'s :data:`PARTS`."""
    return {p.relative_to(folder).as_posix(): sha256_file(p) for part in PARTS
            for p in sorted((folder / part).rglob("*")) if p.is_file() and not p.is_symlink()}


def check_pair(folder: Path) -> dict:
    """The pair's manifest, after checking that every file it lists is there with its sha256 and none is extra.

    Raises:
        KimiError: no ``MANIFEST.json`` (not a pair), a manifest without ``files``, or a file missing, changed or
            not listed; the message names the files and the way back (``git checkout``, or train a pair).
    """
    manifest_path = folder / "MANIFEST.json"
    if not manifest_path.is_file():
        raise KimiError(f"{folder} is not a reference pair (no MANIFEST.json): use the shipped models/pair or make "
                        "one with `kimi models train-pair DIR`")
    manifest = json.loads(manifest_path.read_text())
    listed = manifest.get("files")
    if not listed:
        raise KimiError(f"{manifest_path} lists no files: it was written by an older kimi; train the pair again")
    found = pair_digests(folder)
    changed = sorted(name for name, digest in listed.items() if found.get(name) != digest)
    extra = sorted(set(found) - set(listed))
    if changed or extra:
        what = "; ".join(part for part in (f"missing or changed: {', '.join(changed)}" if changed else "",
                                           f"not in the manifest: {', '.join(extra)}" if extra else "") if part)
        raise KimiError(f"the pair in {folder} is not the one its MANIFEST.json describes ({what}); restore it "
                        f"(`git checkout -- {folder}` for the shipped pair) or train one with `kimi models train-pair`")
    return manifest
