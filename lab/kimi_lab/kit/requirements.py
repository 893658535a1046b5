"""Requirement checks: at build time against the host's known versions, on the host against what is installed
(``packaging``, imported lazily)."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from pathlib import Path

from kimi_lab.kit.base import norm, wheel_name
from kimi_lab.kit.wheels import requirement_specs, wheel_requires

# Versions known on the host (the device docs' pip list and the shared README); a requirement on a host
# package that is not listed here is "unverified" at build time and checked on the host (check-reqs).
HOST_VERSIONS = {
    "accelerate": "1.15.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0",
    "sentencepiece": "0.2.2", "tiktoken": "0.14.0", "tokenizers": "0.23.2", "torch": "2.11.0",
    "torchaudio": "2.11.0", "torchvision": "0.26.0", "transformers": "5.17.0", "triton": "3.6.0",
    "nvidia-nccl-cu13": "2.28.9", "nvidia-cudnn-cu13": "9.19.0.56",
}
# What host packages (at HOST_VERSIONS) require of packages a kit may carry (read from their wheels' metadata).
# A carried version outside it breaks that host package: transformers 5.17.0 checks at import that
# huggingface-hub is <2.0, and the mainline's vLLM wants >=2.0.0, so transformers travels too (host_broken).
HOST_REQUIRES = {"transformers": {"huggingface-hub": "<2.0,>=1.5.0", "tokenizers": "<0.24.0,>=0.23.1"}}
# The CUDA libraries torch pins exactly: a miss is reported, never carried on its own (cuDNN is ~700 MB;
# torch 2.13 ran on the host with its cuDNN 9.19 for everything but cudnn convolutions).
NOT_AUTO_CARRIED = re.compile(r"^(nvidia-|cuda-)")


def packaging_api():
    """(Requirement, Version, default_environment) from ``packaging``, else from pip's vendored copy, else None."""
    try:
        from packaging.markers import default_environment
        from packaging.requirements import Requirement
        from packaging.version import Version
    except ImportError:
        try:
            from pip._vendor.packaging.markers import default_environment
            from pip._vendor.packaging.requirements import Requirement
            from pip._vendor.packaging.version import Version
        except ImportError:
            return None
    return Requirement, Version, default_environment


def _host_env() -> dict:
    _, _, default_environment = packaging_api()
    env = default_environment()
    env.update(python_version="3.12", python_full_version="3.12.3", platform_machine="x86_64",
               sys_platform="linux", platform_system="Linux", implementation_name="cpython",
               os_name="posix", platform_python_implementation="CPython")
    return env


def _applies(req, env: dict, extras: Iterable[str]) -> bool:
    return req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in extras)


def host_pins(wheels: list[Path], host_packages: set[str], skip: set[str]) -> list[dict]:
    """The requirements of ``wheels`` on packages that the kit does not carry but the host has, one entry a
    package: {name, specs: [(specifier, required by)], have: the host's version or None, state}, where
    state is "older" (the host's known version is below a requirement: carry the package), "newer" (it fails
    only upper bounds or exclusions: reported, not carried, since downgrading a host package under its
    other users is the greater risk; the v0.26 line's vLLM ran so with numpy 2.5.2), "unknown" (the host's version is
    not known here: checked on the host at install) or "ok".  Needs ``packaging``."""
    Requirement, Version, _ = packaging_api()
    env = _host_env()
    carried = {wheel_name(w.name) for w in wheels}
    found: dict[str, dict] = {}
    for wheel in wheels:
        for line in wheel_requires(wheel):
            req = Requirement(line)
            name = norm(req.name)
            if (not _applies(req, env, [""]) or name in carried or name in skip or name not in host_packages
                    or not str(req.specifier)):
                continue
            entry = found.setdefault(name, {"name": name, "specs": [], "have": HOST_VERSIONS.get(name)})
            entry["specs"].append((str(req.specifier), wheel_name(wheel.name)))
    for entry in found.values():
        if entry["have"] is None:
            entry["state"] = "unknown"
            continue
        have = Version(entry["have"])
        state = "ok"
        for spec, _ in entry["specs"]:
            for one in Requirement(f"x{spec}").specifier:
                if one.contains(have, prereleases=True):
                    continue
                v = Version(one.version.rstrip(".*"))
                lower = one.operator in (">=", ">", "~=") or (one.operator in ("==", "===") and have < v)
                state = "older" if lower else (state if state == "older" else "newer")
        entry["state"] = state
    return sorted(found.values(), key=lambda e: e["name"])


def host_broken(release: Path, wheels: list[Path]) -> list[str]:
    """The host packages that the carried ``wheels`` break (:data:`HOST_REQUIRES`), each as the requirement to
    carry it by: the release wheel's own on it (``transformers<5.23.0,>=5.16.1``: the newest it accepts), else any
    version. Needs ``packaging``."""
    _, Version, _ = packaging_api()
    from_release = requirement_specs(wheel_requires(release))
    carried = {wheel_name(w.name): w.name.split("-")[1] for w in wheels}
    out = []
    for host, needs in HOST_REQUIRES.items():
        if host in carried:
            continue
        if any(name in carried and not _spec_contains(spec, Version(carried[name])) for name, spec in needs.items()):
            out.append(host + from_release.get(host, ""))
    return out


def _spec_contains(spec: str, version) -> bool:
    Requirement, _, _ = packaging_api()
    return Requirement(f"x{spec}").specifier.contains(version, prereleases=True)


def host_pins_report(entries: list[dict]) -> list[str]:
    """The lines ``gpukit host-pins`` prints of :func:`host_pins`' entries that are not "ok"."""
    lines = []
    for e in entries:
        specs = ", ".join(f"{spec} ({by})" for spec, by in e["specs"])
        if e["state"] == "older":
            tag = "reported only" if NOT_AUTO_CARRIED.match(e["name"]) else "carried"
            lines.append(f"host misses, {tag}: {e['name']} {e['have']} on the host; wanted {specs}")
        elif e["state"] == "newer":
            lines.append(f"host newer, reported only: {e['name']} {e['have']} on the host; wanted {specs}")
        elif e["state"] == "unknown":
            lines.append(f"unverified (checked on the host at install): {e['name']} {specs}")
    return lines


def check_reqs(site: Path, skip: set[str], top: str = "vllm") -> int:
    """On the host, with ``site`` first on the path: walk ``top``'s requirements (and theirs) through the
    installed distributions and print the ones that are missing or at a version the requirement excludes.
    Packages left out of the kit on purpose (``skip``) are not followed.  Returns the number of problems."""
    pk = packaging_api()
    if pk is None:
        print("check-reqs: `packaging` is not importable here; skipped")
        return 0
    Requirement, Version, _ = pk
    from importlib import metadata
    env = _host_env()
    env.update(python_full_version=sys.version.split()[0],
               python_version=".".join(map(str, sys.version_info[:2])))
    found: dict[str, metadata.Distribution] = {}
    for dist in metadata.distributions(path=[str(site), *[p for p in sys.path if p and p != str(site)]]):
        name = dist.metadata["Name"]
        if name:
            found.setdefault(norm(name), dist)
    problems: dict[tuple[str, str], list[str]] = {}  # (kind, name + what is there) -> [spec (required by)]
    checked = 0
    queue: list[tuple[str, tuple[str, ...]]] = [(norm(top), ("",))]
    seen: set[tuple[str, tuple[str, ...]]] = set()
    while queue:
        name, extras = queue.pop(0)
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        dist = found.get(name)
        if dist is None:
            continue
        for line in dist.requires or []:
            req = Requirement(line)
            if not _applies(req, env, extras):
                continue
            rname = norm(req.name)
            if rname in skip:
                continue
            checked += 1
            have = found.get(rname)
            where = dist.metadata["Name"]
            wanted = f"{req.specifier or 'any'} ({where})"
            if have is None:
                problems.setdefault(("missing", rname), []).append(wanted)
                continue
            if str(req.specifier) and not req.specifier.contains(Version(have.version), prereleases=True):
                loc = Path(str(have.locate_file(""))).as_posix()
                problems.setdefault(("unmet", f"{rname} {have.version} in {loc}"), []).append(wanted)
            queue.append((rname, tuple(sorted({"", *req.extras}))))
    print(f"check-reqs: {checked} requirements of {top} and its dependencies checked against {site} and "
          f"the host; {len(problems)} packages fall short (left out on purpose and not checked: {len(skip)})")
    for (kind, what), wanted in sorted(problems.items(), key=lambda kv: (kv[0][0] != "unmet", kv[0][1])):
        print(f"  {kind:8} {what}; wanted {', '.join(dict.fromkeys(wanted))}")
    return len(problems)
