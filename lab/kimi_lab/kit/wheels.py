"""What the kit reads from wheels and line pins: requirements, the torch stack that travels with a torch, the
kit's line and torch."""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Iterable
from pathlib import Path

from kimi_lab.kit.base import KitError, norm

# The torch releases tried on the host (/work/shared/gpu/README.md; 2.14.0 on the H100:
# benchmarks/results/gpu_e2e-0.34.0.md) and what had to travel with them. The versions are read from the
# torch wheel's own Requires-Dist; this table names the companions (a torch not listed gets triton and the
# NCCL wheel, with a warning) and cross-checks the versions the wheel pins exactly (2.14 asks triton~=3.8.0).
TORCH_STACKS: dict[str, dict[str, str]] = {
    "2.13.0": {"triton": "3.7.1", "nvidia-nccl-cu13": "2.29.7"},
    "2.14.0": {"triton": "3.8.0", "nvidia-nccl-cu13": "2.30.7"},
}
DEFAULT_COMPANIONS = ("triton", "nvidia-nccl-cu13")


def wheel_requires(wheel: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    return [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]


_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*\(?\s*([<>=!~][^;)]*?)\s*\)?\s*(?:;(.*))?$")


def requirement_specs(requires: Iterable[str]) -> dict[str, str]:
    """{normalized name: version specifier, spaces removed (``==2.13.0``, ``~=3.8.0``, ``<14,>=13.0.3``)} of the
    requirements that name versions and are not behind an extra."""
    specs = {}
    for req in requires:
        m = _REQ.match(req)
        if m and "extra" not in (m.group(3) or ""):
            specs.setdefault(norm(m.group(1)), re.sub(r"\s+", "", m.group(2)))
    return specs


def exact_pins(requires: Iterable[str]) -> dict[str, str]:
    """{normalized name: version} of the ``name==version`` requirements that are not behind an extra."""
    return {name: spec.lstrip("=") for name, spec in requirement_specs(requires).items()
            if re.fullmatch(r"===?[^,<>=!~*]+", spec)}


def torch_stack(torch_wheel: Path) -> tuple[str, list[str], list[str]]:
    """(torch version, [requirement] of the companions that must travel with it, [warning]).

    Each companion travels as the torch wheel requires it: ``triton==3.7.1`` (torch 2.13), ``triton~=3.8.0``
    (torch 2.14: the newest 3.8.x on the index); the table's versions are checked against exact pins only."""
    version = Path(torch_wheel).name.split("-")[1].split("+")[0]
    specs = requirement_specs(wheel_requires(torch_wheel))
    pins = exact_pins(wheel_requires(torch_wheel))
    table = TORCH_STACKS.get(version)
    warnings = []
    if table is None:
        warnings.append(f"torch {version} was not tried on the GPU host (tried: {', '.join(TORCH_STACKS)}); "
                        f"carrying {', '.join(DEFAULT_COMPANIONS)} as for those")
    reqs = []
    for name in table or DEFAULT_COMPANIONS:
        if name not in specs:
            raise KitError(f"torch {version}'s wheel pins no {name}: add it to TORCH_STACKS in "
                           "lab/kimi_lab/kit/wheels.py")
        if table and name in pins and table[name] != pins[name]:
            warnings.append(f"torch {version} requires {name}=={pins[name]}; the table says {table[name]} "
                            "(using the wheel's)")
        reqs.append(f"{name}{specs[name]}")
    return version, reqs, warnings


def resolve_skip(resolve_wheels_py: Path) -> list[str]:
    """DEFAULT_SKIP of the shared ``resolve_wheels.py`` (the packages the kit leaves out on purpose), read
    without importing it."""
    import ast
    for node in ast.walk(ast.parse(resolve_wheels_py.read_text())):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "DEFAULT_SKIP" for t in node.targets):
            return sorted(norm(x) for x in ast.literal_eval(node.value))
    raise KitError(f"no DEFAULT_SKIP in {resolve_wheels_py}")


# -- the kit's line and torch ----------------------------------------------------------------------------------

def kit_line(lines: Path, line: str | None = None, version: str | None = None) -> tuple[str, str, str]:
    """(line, vLLM version, sha256 of the CUDA wheel its pin names, or "") of a kit: ``line``
    (``kimi/lines/<line>``) at its pin's version, or else the line whose pin names ``version`` (the mainline
    first; the mainline, with no sha256, when none does), or else the mainline's pin.

    The line decides which series ``kimi install-into`` puts on the host's vLLM, so a kit of the v0.32 line's release
    installs the ``v0.32`` line, not the mainline's patches.

    Raises:
        KitError: no such line, or ``version`` is not the named line's.
    """
    def pin(name: str) -> dict:
        try:
            found = json.loads((lines / name / "pin.json").read_text())
        except (OSError, ValueError):
            found = {}
        if "version" not in found:
            raise KitError(f"no line {name!r} ({lines / name / 'pin.json'} missing or without a version)")
        return found

    def sha(found: dict) -> str:
        return found.get("artifacts", {}).get("cuda_wheel", {}).get("sha256", "")

    if line:
        found = pin(line)
        if version and version != found["version"]:
            raise KitError(f"line {line} pins vLLM {found['version']}, not {version}")
        return line, found["version"], sha(found)
    if not version:
        found = pin("mainline")
        return "mainline", found["version"], sha(found)
    names = ["mainline", *sorted(p.parent.name for p in lines.glob("*/pin.json") if p.parent.name != "mainline")]
    match = next((n for n in names if pin(n)["version"] == version), None)
    return (match, version, sha(pin(match))) if match else ("mainline", version, "")


def line_requires(lines: Path, line: str) -> list[str]:
    """The requirements ``kimi/lines/<line>/gpu-kit.txt`` adds to the line's GPU kit (one a line, ``#`` comments;
    none without the file): what the release needs that the shared resolver leaves out (the mainline's: the CuTe DSL,
    QuACK)."""
    path = lines / line / "gpu-kit.txt"
    if not path.is_file():
        return []
    return [r for r in (raw.split("#", 1)[0].strip() for raw in path.read_text().splitlines()) if r]


def kit_torch(cuda_wheel: Path, requested: str | None = None) -> str:
    """The torch a GPU kit carries: the one the release's CUDA wheel requires (``torch==X``).

    A line's ``pin.json`` names the torch of its CPU path (the mainline's says 2.13.0 while its release's CUDA
    wheel requires 2.14.0), so it never decides a GPU kit's torch. ``requested`` (``KIMI_KIT_TORCH``) must agree
    with the wheel, and names the torch when the wheel pins none.

    Raises:
        KitError: ``requested`` disagrees with the wheel, or neither names a torch.
    """
    pinned = exact_pins(wheel_requires(cuda_wheel)).get("torch")
    if pinned and requested and requested != pinned:
        raise KitError(f"{Path(cuda_wheel).name} requires torch=={pinned}, not KIMI_KIT_TORCH={requested}")
    if not (pinned or requested):
        raise KitError(f"{Path(cuda_wheel).name} pins no torch: name the one its kernels are built against with "
                       "KIMI_KIT_TORCH")
    return pinned or requested
