"""The offline GPU host's install kit: one byte stream, cut into chunks that travel one per device call.

A device call carries at most 64 MiB of the working tree (tracked files, untracked files that git does
not ignore, and at most 8 carried ignored paths), and a machine left idle for ~30 s is given back, losing
``/tmp``.  So the kit (upstream vLLM's CUDA wheel, the wheels the host lacks, a newer torch stack where
the release pins one, optional payload folders such as a model pair) is packed as ONE uncompressed tar
stream, cut into chunks of a fixed size, and described by ``MANIFEST.json`` (chunk names, sizes and
sha256s, the stream's total size and sha256, the vLLM and torch versions).  Each call carries the
manifest and one chunk; the host stashes the chunk (checked against the manifest) in ``/tmp`` and, once
all are there, checks the total sha256 and unpacks the stream.

Build side (here, with the package index; ``benchmarks/gpu_kit.sh`` drives these)::

   python3 lab/kimi_lab/gpukit.py chunk-mib --root .   default chunk size for this working tree
   python3 lab/kimi_lab/gpukit.py line --lines kimi/lines [--line L] [--version V]   line, version, pinned wheel sha256
   python3 lab/kimi_lab/gpukit.py line-requires --lines kimi/lines LINE   what the line's gpu-kit.txt adds to its kit
   python3 lab/kimi_lab/gpukit.py kit-torch CUDA_WHEEL [--torch T]   the kit's torch (the wheel's, not the pin's)
   python3 lab/kimi_lab/gpukit.py wheel-pin WHEEL NAME   the ==version that WHEEL requires of NAME
   python3 lab/kimi_lab/gpukit.py torch-stack TORCH_WHEEL   what must travel with a torch the host lacks
   python3 lab/kimi_lab/gpukit.py host-pins WHEEL...   requirements the host's own packages may miss
   python3 lab/kimi_lab/gpukit.py host-broken VLLM_WHEEL WHEEL...   host packages the carried wheels break
   python3 lab/kimi_lab/gpukit.py pack --out KIT ...   the stream -> KIT/chunkNN + KIT/MANIFEST.json
   python3 lab/kimi_lab/gpukit.py calls --kit KIT   the device calls to make, in order

Device side (``benchmarks/gpu_call.sh``; ``python3 -S``, standard library only, no torch, no vLLM)::

    python3 -S lab/kimi_lab/gpukit.py stash --kit KIT --stash /tmp/kitparts --site /tmp/site
    python3 -S lab/kimi_lab/gpukit.py unpack --kit KIT --stash /tmp/kitparts --dest /tmp/site.bundle
    python3 lab/kimi_lab/gpukit.py check-reqs --site /tmp/site   (uses `packaging`, which the host has)
    python3 -S lab/kimi_lab/gpukit.py field FILE.json KEY

The stream holds ``kit.json`` (the build's metadata), ``vllm.tar.xz`` (the release's installed files, as
``build_kit.sh`` packs them), ``wheels/*.whl`` (installed with ``pip install --no-deps --target``) and
``payload/<path>`` for each payload folder (``<path>`` relative to the repository root).

This module is the command line; the work is done in :mod:`kimi_lab.kit`. Run by its path, it puts ``lab/``
(not ``lab/kimi_lab/``) first on its path, so the host needs nothing else there. Everything uses the standard
library only (``packaging`` is imported lazily by the requirement checks), so that it runs with the host's
python3 before anything is installed, and with Python >= 3.10.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

if __package__ in (None, ""):  # run by its path: ``lab/`` on the path, not ``lab/kimi_lab/`` (docs/gpu.md)
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from kimi_lab.kit.base import BROKEN, CALL_LIMIT_MIB, MARGIN_MIB, KitError, fmt_mib, norm, wheel_name
from kimi_lab.kit.device import stash, unpack
from kimi_lab.kit.plan import calls, default_chunk_mib, tree_bytes
from kimi_lab.kit.requirements import (
    NOT_AUTO_CARRIED,
    check_reqs,
    host_broken,
    host_pins,
    host_pins_report,
    packaging_api,
)
from kimi_lab.kit.stream import pack, rechunk
from kimi_lab.kit.wheels import (
    exact_pins,
    kit_line,
    kit_torch,
    line_requires,
    resolve_skip,
    torch_stack,
    wheel_requires,
)

# -- command line ------------------------------------------------------------------------------------------------

def _pairs(values: list[str] | None, what: str) -> list[tuple[str, Path]]:
    pairs = []
    for v in values or []:
        if "=" not in v:
            raise KitError(f"{what} wants NAME=PATH, not {v!r}")
        name, path = v.split("=", 1)
        pairs.append((name.strip("/"), Path(path)))
    return pairs


def main(argv: list[str] | None = None) -> int:
    """The ``gpukit`` command line; returns the exit code."""
    parser = argparse.ArgumentParser(prog="gpukit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("chunk-mib", help="default chunk size (MiB) for this working tree")
    p.add_argument("--root", type=Path, default=Path("."))
    p.add_argument("--limit-mib", type=int, default=CALL_LIMIT_MIB)
    p.add_argument("--margin-mib", type=int, default=MARGIN_MIB)
    p = sub.add_parser("wheel-pin", help="the ==version that WHEEL requires of NAME (empty if none)")
    p.add_argument("wheel", type=Path)
    p.add_argument("name")
    p = sub.add_parser("line", help="the kit's line, vLLM version and pinned CUDA-wheel sha256, one a line")
    p.add_argument("--lines", type=Path, required=True, help="kimi/lines")
    p.add_argument("--line")
    p.add_argument("--version")
    p = sub.add_parser("line-requires", help="requirements kimi/lines/LINE/gpu-kit.txt adds to the kit, one a line")
    p.add_argument("--lines", type=Path, required=True, help="kimi/lines")
    p.add_argument("line")
    p = sub.add_parser("kit-torch", help="the torch a GPU kit carries: the one the CUDA wheel requires")
    p.add_argument("wheel", type=Path)
    p.add_argument("--torch", help="KIMI_KIT_TORCH: must agree with the wheel; needed if it pins none")
    p = sub.add_parser("skip-names", help="resolve_wheels.py's DEFAULT_SKIP less the carried wheels, comma-separated")
    p.add_argument("resolve_wheels", type=Path)
    p.add_argument("--carried", type=Path, help="the folder of carried wheels")
    p = sub.add_parser("torch-stack", help="requirements that must travel with this torch wheel")
    p.add_argument("wheel", type=Path)
    p = sub.add_parser("host-broken", help="host packages the carried WHEELs break, as requirements to carry them by")
    p.add_argument("release", type=Path, help="the vllm wheel (its requirement on a broken package is used)")
    p.add_argument("wheels", type=Path, nargs="*")
    p = sub.add_parser("host-pins", help="requirements of WHEELs that the host's own packages may miss")
    p.add_argument("wheels", type=Path, nargs="+")
    p.add_argument("--host-packages", type=Path, required=True)
    p.add_argument("--skip", default="", help="comma-separated names left out on purpose")
    p.add_argument("--misses", action="store_true", help="print only the misses that may be carried, one a line")
    p = sub.add_parser("pack", help="write the stream as chunks and MANIFEST.json")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--chunk-mib", type=float, required=True)
    p.add_argument("--add", action="append", help="ARCNAME=PATH (a file or folder)")
    p.add_argument("--payload", action="append", help="REL=PATH: a folder unpacked at REL in the repo on the host")
    p.add_argument("--meta", action="append", help="KEY=VALUE, kept in the manifest and kit.json")
    p = sub.add_parser("rechunk", help="cut the kit's stream again into chunks that fit this working tree")
    p.add_argument("--kit", type=Path, required=True)
    p.add_argument("--root", type=Path, default=Path("."))
    p.add_argument("--chunk-mib", type=float, help="default: the largest that fits (chunk-mib)")
    p = sub.add_parser("stash", help="(host) verify and stash the carried chunks; say what is missing")
    p.add_argument("--kit", type=Path, required=True)
    p.add_argument("--stash", type=Path, required=True)
    p.add_argument("--site", type=Path)
    p.add_argument("--report", type=Path, help="also write the state as JSON here")
    p = sub.add_parser("unpack", help="(host) check the total sha256 and unpack the stashed stream")
    p.add_argument("--kit", type=Path, required=True)
    p.add_argument("--stash", type=Path, required=True)
    p.add_argument("--dest", type=Path, required=True)
    p = sub.add_parser("check-reqs", help="(host) requirements of the installed vllm that are not met")
    p.add_argument("--site", type=Path, required=True)
    p.add_argument("--kit-json", type=Path, help="kit.json: its 'skip' names are not checked")
    p.add_argument("--top", default="vllm")
    p = sub.add_parser("field", help="print one top-level value of a JSON file (lists one item a line)")
    p.add_argument("file", type=Path)
    p.add_argument("key")
    p = sub.add_parser("calls", help="the device calls to make, in order")
    p.add_argument("--kit", type=Path, required=True)
    p.add_argument("--root", type=Path, default=Path("."))
    p.add_argument("--command", default="bash benchmarks/gpu_call.sh")
    p.add_argument("--last-command", help="the command of the call with the last chunk (default: --command)")
    p.add_argument("--only", help="comma-separated chunk names (e.g. the missing ones a reply named)")
    p.add_argument("--json", action="store_true", help="one JSON object a line")
    a = parser.parse_args(argv)
    try:
        return _run(a)
    except KitError as e:
        print(f"gpukit: {e}", file=sys.stderr)
        return BROKEN


def _run(a: argparse.Namespace) -> int:
    if a.cmd == "chunk-mib":
        tree = tree_bytes(a.root)
        mib = default_chunk_mib(tree, a.limit_mib, a.margin_mib)
        print(f"gpukit: working tree {fmt_mib(tree)} -> chunks of {mib} MiB", file=sys.stderr)
        print(mib)
    elif a.cmd == "wheel-pin":
        print(exact_pins(wheel_requires(a.wheel)).get(norm(a.name), ""))
    elif a.cmd == "line":
        print("\n".join(kit_line(a.lines, a.line or None, a.version or None)))
    elif a.cmd == "line-requires":
        print("\n".join(line_requires(a.lines, a.line)))
    elif a.cmd == "kit-torch":
        print(kit_torch(a.wheel, a.torch or None))
    elif a.cmd == "skip-names":
        carried = {wheel_name(w.name) for w in a.carried.glob("*.whl")} if a.carried else set()
        print(",".join(n for n in resolve_skip(a.resolve_wheels) if n not in carried))
    elif a.cmd == "torch-stack":
        _, reqs, warnings = torch_stack(a.wheel)
        for w in warnings:
            print(f"gpukit: warning: {w}", file=sys.stderr)
        print("\n".join(reqs))
    elif a.cmd == "host-broken":
        if packaging_api() is None:
            raise KitError("host-broken needs `packaging`")
        print("\n".join(host_broken(a.release, a.wheels)))
    elif a.cmd == "host-pins":
        if packaging_api() is None:
            raise KitError("host-pins needs `packaging`")
        host = {norm(x) for x in a.host_packages.read_text().split() if not x.startswith("#")}
        entries = host_pins(a.wheels, host, {norm(x) for x in a.skip.split(",") if x})
        if a.misses:
            for e in entries:
                if e["state"] == "older" and not NOT_AUTO_CARRIED.match(e["name"]):
                    print(e["name"] + ",".join(spec for spec, _ in e["specs"]))
            return 0
        print("\n".join(host_pins_report(entries)))
    elif a.cmd == "pack":
        meta = dict(kv.split("=", 1) for kv in a.meta or [])
        for key in ("skip", "host_misses", "host_unverified"):
            if key in meta:
                meta[key] = [x for x in re.split(r"[,\n]", meta[key]) if x.strip()]
        man = pack(a.out, a.chunk_mib, _pairs(a.add, "--add"), _pairs(a.payload, "--payload"), meta)
        sizes = ", ".join(f"{c['name']} {fmt_mib(c['size'])}" for c in man["chunks"])
        print(f"kit {man['kit_id']}: {len(man['chunks'])} chunks, {fmt_mib(man['total_size'])} "
              f"(sha256 {man['total_sha256']}) in {a.out} [{man['pack_s']} s]\n  {sizes}")
    elif a.cmd == "rechunk":
        man = rechunk(a.kit, a.chunk_mib or default_chunk_mib(tree_bytes(a.root)))
        print(f"kit {man['kit_id']}: {len(man['chunks'])} chunks of {fmt_mib(man['chunk_size'])} in {a.kit}")
    elif a.cmd == "stash":
        return stash(a.kit, a.stash, a.site, a.report)
    elif a.cmd == "unpack":
        return unpack(a.kit, a.stash, a.dest)
    elif a.cmd == "check-reqs":
        skip = set()
        if a.kit_json and a.kit_json.is_file():
            skip = {norm(x) for x in json.loads(a.kit_json.read_text()).get("skip", [])}
        check_reqs(a.site, skip, a.top)
    elif a.cmd == "field":
        value = json.loads(a.file.read_text()).get(a.key, "")
        print("\n".join(map(str, value)) if isinstance(value, list) else value)
    elif a.cmd == "calls":
        only = [x for x in (a.only or "").replace(",", " ").split() if x] or None
        calls(a.kit, a.root, a.command, a.last_command, only, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
