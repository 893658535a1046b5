"""The laid vLLM tree's CMake files, read for ``kimi kernels build-vllm``: the units of a subset (the sm_100-only
lists of ``CMakeLists.txt``, the units the line's series changes) and the targets that compile them, the GCC checks
that stop configure, and the CMake include that waives those a subset does not need (:mod:`kimi.kernels.vllm_build`
says why)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from kimi.errors import KimiError

# CMakeLists.txt lists whose units compile for sm_100 only (the 10.0f/10.0a branches; the v0.26 and v0.32 lines).
SM100_LISTS = ("SCALED_MM_SM100_SRCS", "CUTLASS_MOE_SM100_SRCS", "FP4_SM100_SRCS", "CUTLASS_MLA_SRCS")


WAIVERS_FILE = "kimi-waivers.cmake"


@dataclass(frozen=True)
class Unit:
    """One translation unit: the CMake target it belongs to and its path relative to the tree."""

    target: str
    source: str
    group: str = ""

    @property
    def object(self) -> str:
        """The Ninja object target (``CMakeFiles/<target>.dir/<source>.o``)."""
        return f"CMakeFiles/{self.target}.dir/{self.source}.o"


def cmake_lists(text: str) -> dict[str, list[str]]:
    """``set(NAME "a" "b" ...)`` statements of a CMake file whose items are literal paths -> {NAME: [a, b]}."""
    found: dict[str, list[str]] = {}
    for match in re.finditer(r"\bset\(\s*([A-Za-z0-9_]+)\s+((?:\s*\"[^\"$]+\")+)\s*\)", text):
        found[match.group(1)] = re.findall(r"\"([^\"]+)\"", match.group(2))
    return found


def target_of_list(text: str, list_name: str) -> str:
    """The extension target whose sources receive ``list_name``: ``list(APPEND EXT "${list_name}")``
    then ``define_extension_target(TARGET ... SOURCES ${EXT}``.

    Raises KimiError when either link is missing (a new upstream layout: the subset needs updating).
    """
    appended = re.search(rf"list\(\s*APPEND\s+([A-Za-z0-9_]+)\s+\"?\$\{{{list_name}\}}\"?\s*\)", text)
    if not appended:
        raise KimiError(f"CMakeLists.txt appends {list_name} to no source list: update SM100_LISTS in {__file__}")
    ext = appended.group(1)
    target = _target_with_sources(text, ext)
    if not target:
        raise KimiError(f"no define_extension_target(... SOURCES ${{{ext}}}) in CMakeLists.txt")
    return target


def _target_with_sources(text: str, list_name: str) -> str | None:
    """The target of ``define_extension_target(TARGET ... SOURCES ${list_name}``, or None."""
    match = re.search(rf"define_extension_target\(\s*([A-Za-z0-9_]+)[^)]*?SOURCES\s+\$\{{{list_name}\}}", text, re.S)
    return match.group(1) if match else None


def sm100_units(root: Path) -> list[Unit]:
    """The sm_100-only units of ``root/CMakeLists.txt`` (lists :data:`SM100_LISTS`), each once.

    Raises KimiError when a list is not found (names it).
    """
    text = (root / "CMakeLists.txt").read_text(errors="replace")
    lists = cmake_lists(text)
    units: dict[str, Unit] = {}
    for name in SM100_LISTS:
        if name not in lists:
            raise KimiError(f"CMakeLists.txt has no set({name} ...): update SM100_LISTS in {__file__}")
        target = target_of_list(text, name)
        for source in lists[name]:
            units.setdefault(source, Unit(target, source, name))
    return list(units.values())


def owner_target(text: str, source: str) -> str:
    """The extension target of CMakeLists.txt ``text`` that compiles ``source``: the target of the
    ``set(...)`` list naming it; else by folder (``csrc/libtorch_stable/moe/`` -> ``_moe_C_stable_libtorch``,
    other -> ``_C_stable_libtorch``). A wrong guess is caught before building (no rule in build.ninja)."""
    for name, items in cmake_lists(text).items():
        if source in items:
            try:
                return _target_with_sources(text, name) or target_of_list(text, name)
            except KimiError:
                break
    return "_moe_C_stable_libtorch" if "/moe/" in source else "_C_stable_libtorch"


def series_cuda_units(checkout: Path, line: str, tree: Path | None = None) -> list[Unit]:
    """Upstream CUDA/C++ units under ``csrc/`` that the line's patch series changes
    (``CHECKOUT/kimi/lines/<line>/patches/*.patch``), each with the target of ``tree``'s (default:
    the checkout's) CMakeLists.txt that compiles it."""
    text = ((tree or checkout) / "CMakeLists.txt").read_text(errors="replace")
    changed: list[str] = []
    for patch in sorted((checkout / "kimi" / "lines" / line / "patches").glob("*.patch")):
        for path in re.findall(r"^diff --git a/(csrc/\S+\.(?:cu|cpp|cc))\s", patch.read_text(errors="replace"), re.M):
            if path not in changed:
                changed.append(path)
    return [Unit(owner_target(text, path), path, "series") for path in changed]


def cmake_minimum(root: Path) -> str:
    """``cmake_minimum_required(VERSION x.y)`` of the tree's CMakeLists.txt (``3.26`` on the v0.26 line)."""
    match = re.search(r"cmake_minimum_required\(\s*VERSION\s+([\d.]+)", (root / "CMakeLists.txt").read_text())
    return match.group(1) if match else "3.26"


@dataclass(frozen=True)
class CompilerCheck:
    """A ``GCC >= version`` check of ``CMakeLists.txt`` that stops configure (``message(FATAL_ERROR``)."""

    version: str
    message: str   # the message's text as written (``${...}`` left in)

    @property
    def prefix(self) -> str:
        """The message up to its first ``${``: what the configured message starts with."""
        return self.message.split("${", 1)[0]


_GCC_CHECK_RE = re.compile(
    r'if\s*\(([^()]*?CMAKE_CXX_COMPILER_ID\s+STREQUAL\s+"GNU"[^()]*?CMAKE_CXX_COMPILER_VERSION\s+'
    r'VERSION_LESS\s+"?([\d.]+)"?[^()]*)\)\s*message\(\s*FATAL_ERROR\s+((?:"(?:[^"\\]|\\.)*"\s*)+)\)')


def compiler_checks(root: Path) -> list[CompilerCheck]:
    """The GCC version checks of the tree's ``CMakeLists.txt`` (the v0.26 line: ``>= 11.3``; the v0.32 line
    adds ``>= 13`` for CUDA, for DeepGEMM's and DeepSelect's host code)."""
    text = (root / "CMakeLists.txt").read_text(errors="replace")
    return [CompilerCheck(m.group(2), "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(3))))
            for m in _GCC_CHECK_RE.finditer(text)]


def project_name(root: Path) -> str:
    """The ``project(NAME`` of the tree's ``CMakeLists.txt`` (``vllm_extensions``)."""
    match = re.search(r"^\s*project\(\s*([A-Za-z0-9_.-]+)", (root / "CMakeLists.txt").read_text(), re.M)
    return match.group(1) if match else "vllm_extensions"


def waivers_cmake(prefixes: list[str]) -> str:
    """A CMake file for ``CMAKE_PROJECT_<name>_INCLUDE`` that turns a ``message(FATAL_ERROR`` whose text
    starts with one of ``prefixes`` into a warning, and passes every other message on unchanged (each
    argument as given, through bracket arguments)."""
    items = " ".join(f"[==[{p}]==]" for p in prefixes)
    return f"""# kimi kernels build-vllm: configure-only compiler waivers (the subset builds none of what they are for)
include_guard(GLOBAL)
function(message)
  if(ARGC GREATER 1 AND "${{ARGV0}}" STREQUAL "FATAL_ERROR")
    set(_kimi_text "")
    math(EXPR _kimi_last "${{ARGC}} - 1")
    foreach(_kimi_i RANGE 1 ${{_kimi_last}})
      string(APPEND _kimi_text "${{ARGV${{_kimi_i}}}}")
    endforeach()
    foreach(_kimi_prefix IN ITEMS {items})
      string(FIND "${{_kimi_text}}" "${{_kimi_prefix}}" _kimi_at)
      if(_kimi_at EQUAL 0)
        _message(WARNING "kimi kernels build-vllm waived this check (its sources are not built here): ${{_kimi_text}}")
        return()
      endif()
    endforeach()
  endif()
  set(_kimi_call "_message(")
  if(ARGC GREATER 0)
    math(EXPR _kimi_last "${{ARGC}} - 1")
    foreach(_kimi_i RANGE 0 ${{_kimi_last}})
      string(APPEND _kimi_call " [==[${{ARGV${{_kimi_i}}}}]==]")
    endforeach()
  endif()
  string(APPEND _kimi_call ")")
  cmake_language(EVAL CODE "${{_kimi_call}}")
endfunction()
"""
