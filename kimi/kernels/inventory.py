"""What a checkout has for CUDA builds: the built draft-head library's cubins (``kimi kernels check``),
and the toolchain and vLLM's CMake external sources (``kimi kernels prepare``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kimi.errors import KimiError
from kimi.kernels import build, fill_sources, sources


@dataclass(frozen=True)
class LibraryCheck:
    """The draft-head library built from the current source, its cubins and those it lacks."""

    library: Path
    cubins: list[str]
    expected: list[str]
    missing: list[str]
    info: dict      # build.json of the library

    def as_dict(self) -> dict:
        """The ``--json`` object."""
        return {"library": str(self.library), "cubins": self.cubins, "expected": self.expected,
                "missing": self.missing, "build": self.info}

    def render(self) -> str:
        """The library, its cubins, how it was built and what is missing."""
        lines = [f"{self.library}", f"  cubins: {', '.join(self.cubins) or 'none'}"]
        if self.info:
            lines.append(f"  built by nvcc {self.info.get('nvcc_release')} in {self.info.get('seconds')} s on "
                         f"{self.info.get('host')}")
        if self.missing:
            lines.append(f"  missing: {', '.join(self.missing)} (rebuild with --arch)")
        return "\n".join(lines)


def check_library(build_dir: Path | None, arch: str) -> LibraryCheck:
    """List the cubins of the library built from the current source against the architectures ``arch``.

    Raises:
        KimiError: no library is built from the current source (names the build command).
    """
    library = build.find_library(build_dir)
    if library is None:
        raise KimiError("no draft-head library built from the current source: run `python3 -m kimi kernels build`")
    info_path = library.parent / "build.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    cubins = build.list_cubins(library)
    wanted = [build.sm_name(a) for a in build.parse_archs(arch)]
    return LibraryCheck(library, cubins, wanted, [sm for sm in wanted if sm not in cubins], info)


@dataclass(frozen=True)
class SourcesReport:
    """nvcc, cuobjdump, what was fetched and prepared, and every external source's state."""

    nvcc: Path | None
    cuobjdump: Path | None
    fetched: dict[str, str]
    prepared: list[fill_sources.Prepared]
    sources: list[sources.ExternalSource]

    @property
    def complete(self) -> bool:
        """Every external source is present."""
        return all(s.present for s in self.sources)

    def as_dict(self) -> dict:
        """The ``--json`` object."""
        return {"nvcc": str(self.nvcc) if self.nvcc else None,
                "cuobjdump": str(self.cuobjdump) if self.cuobjdump else None,
                "fetched": self.fetched, "prepared": [vars(d) for d in self.prepared],
                "sources": [s.as_dict() for s in self.sources]}

    def render(self) -> str:
        """The tools, what was done, and the table of :func:`kimi.kernels.sources.render`."""
        lines = [f"nvcc: {self.nvcc or 'MISSING'}",
                 f"cuobjdump (CUDA >= 13): {self.cuobjdump or 'MISSING (--fetch gets one)'}"]
        lines += [f"fetched {what}: {where}" for what, where in self.fetched.items()]
        lines += [f"{d.variable}: {d.action}: {d.detail}" for d in self.prepared if d.action != "missing"]
        lines.append(sources.render(self.sources))
        return "\n".join(lines)


def prepare_sources(root: Path, cache: Path, *, fetch: bool = False, from_dir: Path | None = None,
                    force: bool = False, line: str | None = None) -> SourcesReport:
    """With ``fetch`` get a CUDA 13 cuobjdump when there is none; with ``fetch`` or ``from_dir`` fill
    ``.kimi/sources`` (:func:`kimi.kernels.fill_sources.prepare`); then report what is there."""
    fetched = {}
    if fetch and build.find_cuobjdump() is None:
        fetched["cuobjdump"] = str(fill_sources.fetch_cuobjdump(root, cache))
    done = []
    if fetch or from_dir:
        done = fill_sources.prepare(root, fetch=fetch, from_dir=from_dir, cache=cache, force=force, line=line)
    found = sources.external_sources(root)
    return SourcesReport(build.find_nvcc(), build.find_cuobjdump(), fetched, done, found)
