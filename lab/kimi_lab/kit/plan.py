"""The chunk plan and the device calls: how big a chunk the working tree leaves room for, and the calls that
bring the kit one chunk each."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

from kimi_lab.kit.base import CALL_LIMIT_MIB, MANIFEST, MARGIN_MIB, MAX_CHUNK_MIB, KitError, MiB, fmt_mib, load_manifest


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
    """The names of ``count`` chunks, ``chunk00`` on, as wide as the count needs."""
    width = max(2, len(str(count - 1)))
    return [f"chunk{i:0{width}d}" for i in range(count)]


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
