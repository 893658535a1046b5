"""Offline from-source build of the laid vLLM tree's CUDA extensions (``kimi kernels build-vllm``): running a plan.

The build is four modules, one job each: :mod:`kimi.kernels.toolchain` finds the tools,
:mod:`kimi.kernels.cmake_tree` reads the laid tree's CMake files, :mod:`kimi.kernels.build_plan` makes the plan and
this module runs it (stand-ins, configure, build, install, the record).

vLLM's own ``setup.py`` (``cmake_build_ext.configure``) runs CMake on the tree with Ninja, a job pool
and ccache/sccache launchers; its CMake clones CUTLASS, FlashMLA, flash-attention, DeepGEMM, QuTLASS,
MSA (fmha_sm100), tml-fa4 and triton_kernels unless each ``*_SRC_DIR`` names a local folder. This
module makes the same configure with every ``*_SRC_DIR`` set to a local folder
(:mod:`kimi.kernels.sources`) and ``FETCHCONTENT_FULLY_DISCONNECTED=ON``, so no step reaches the
network, and builds one of three subsets:

* ``fork``: the fork's own kernels — the EAGLE-3 draft-head library (:mod:`kimi.kernels.build`,
  nvcc alone) plus any upstream CUDA unit the line's patch series changes (none today: then no
  CMake configure runs at all);
* ``sm100``: the sm_100-only group of ``_C_stable_libtorch``, read from the laid tree's
  ``CMakeLists.txt`` (lists ``SCALED_MM_SM100_SRCS``, ``CUTLASS_MOE_SM100_SRCS``, ``FP4_SM100_SRCS``,
  ``CUTLASS_MLA_SRCS``: scaled_mm sm100 fp8 and blockwise fp8, grouped MoE sm100, NVFP4/MXFP4 with the
  NVFP4 KV-cache kernels, CUTLASS MLA sm100; 13 units on the v0.26 line under ``csrc/libtorch_stable/``,
  14 on the v0.32 line under ``csrc/``, which adds ``nvfp4_ds_mla_cache_kernels.cu``), built as Ninja object targets;
* ``all``: everything upstream's CMake builds (``cmake --build``), optionally installed into the tree.

Every source must exist for CMake to configure at all, even for one object. For ``fork`` and
``sm100`` a source other than CUTLASS that is missing is replaced by a *configure-only stand-in*
(``BUILD/standins/<name>``: empty files where the CMake file lists sources, a ``CMakeLists.txt`` with
empty targets for flash-attention); those units are never built, and ``all`` refuses stand-ins.

Two more configure-only accommodations, each printed as a note and refused by ``all``:

* *compiler waivers*: a ``GCC >= X`` check of ``CMakeLists.txt`` that the host ``c++`` fails and whose
  message names only external sources (the v0.32 line: ``GCC >= 13 ... DeepGEMM and DeepSelect ... <format>``)
  does not concern ``fork``/``sm100``, which compile none of them; configure includes
  ``BUILD/kimi-waivers.cmake`` (``CMAKE_PROJECT_<project>_INCLUDE``), which turns exactly that
  ``FATAL_ERROR`` into a warning. A check about vLLM itself (``GCC >= 11.3``) stays a problem.
* a *toolkit overlay*: where the CUDA toolkit lacks what torch's CMake config links (cuBLAS headers,
  NVRTC, a ``libcuda.so``; :func:`kimi.kernels.toolchain.toolkit_gaps`) and the ``--python``
  environment's ``nvidia`` wheels have the headers and libraries, ``BUILD/cuda`` joins both (links, a copy
  of ``nvcc``, an empty ``libcuda.so`` stub) and is ``CUDA_HOME`` for the build
  (:func:`kimi.kernels.toolchain.make_toolkit_overlay`).

Jobs are sized to memory: a heavy CUTLASS unit takes ~11 GB and ~2 min on 2 cores (measured on the
project's 2-core, 24 GB machine; DESIGN.md), so ``jobs = max(1, min(cores, available // per_job_gb))``.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kimi.errors import KimiError
from kimi.kernels import build as fork_build
from kimi.kernels import sources as srcs
from kimi.kernels.build_plan import Plan, expand_env
from kimi.kernels.cmake_tree import WAIVERS_FILE, waivers_cmake
from kimi.kernels.toolchain import STANDIN_MARK, make_toolkit_overlay

_CODE_EXT = srcs.CODE_EXT


def make_standin(root: Path, source: dict, dest: Path) -> None:
    """A configure-only stand-in for the external source ``source`` (an ExternalSource dict) at
    ``dest``: an empty file for every ``${<name>_SOURCE_DIR}/<file>`` its CMake file lists, FlashMLA's
    interface (the laid tree's copy with vLLM's import line undone, so configure writes the same file
    back, else a module raising ImportError), and for flash-attention a ``CMakeLists.txt`` with its two
    targets empty. Marked with ``.kimi-standin``; never compiled (the subsets build named objects)."""
    from kimi.fork.fsutil import staged_folder

    text = (root / source["cmake_file"]).read_text(errors="replace")
    with staged_folder(dest) as staged:
        for rel in sorted(set(re.findall(r"\$\{[\w-]+_SOURCE_DIR\}/([\w./+-]+)", text))):
            if rel.endswith(_CODE_EXT) and ".." not in rel:
                (staged / rel).parent.mkdir(parents=True, exist_ok=True)
                (staged / rel).write_text("// configure-only stand-in (kimi kernels build-vllm); never compiled\n"
                                          if not rel.endswith(".py") else "")
        if source["variable"] == "FLASH_MLA_SRC_DIR":
            laid = root / "vllm" / "third_party" / "flashmla" / "flash_mla_interface.py"
            body = (laid.read_text().replace("import vllm._flashmla_C\n", "", 1) if laid.is_file() else
                    'raise ImportError("FlashMLA was not built: configure-only stand-in of kimi kernels build-vllm")\n')
            (staged / "flash_mla").mkdir(exist_ok=True)
            (staged / "flash_mla" / "flash_mla_interface.py").write_text(body)
        if source["variable"] == "VLLM_FLASH_ATTN_SRC_DIR":
            (staged / "CMakeLists.txt").write_text(
                "# configure-only stand-in (kimi kernels build-vllm): the FA2/FA3 targets, empty\n"
                "add_custom_target(_vllm_fa2_C)\nadd_custom_target(_vllm_fa3_C)\n")
            for sub in ("vllm_flash_attn", "flash_attn/cute"):
                (staged / sub).mkdir(parents=True, exist_ok=True)
        (staged / STANDIN_MARK).write_text(f"stand-in for {source['variable']} ({source['repository']} @ "
                                           f"{source['tag']}); configure only\n")


def _stream(cmd: list[str], env: dict[str, str], log, prefix: str) -> int:
    """Run ``cmd``, echoing and logging its output line by line; returns the exit status."""
    log.write(f"$ {shlex.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
        print(f"{prefix}{line}", end="", flush=True)
    return proc.wait()


@dataclass
class BuildRecord:
    """What a build did (``BUILD/kimi-build.json``)."""

    plan: dict
    configure_seconds: float | None = None
    build_seconds: float | None = None
    install_seconds: float | None = None
    fork_library: dict | None = None
    objects: list[str] = field(default_factory=list)
    cubins: dict[str, list[str]] = field(default_factory=dict)
    result: str = "not run"
    log: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def run(plan: Plan, *, configure_only: bool = False) -> BuildRecord:
    """Carry out ``plan``: the fork's library (subsets fork/all), stand-ins, configure, build
    (progress on stdout, everything in ``BUILD/build.log``), install; the record is written to
    ``BUILD/kimi-build.json`` atomically, also when a step fails.

    Raises KimiError when the plan has problems (each listed) or a step fails (with the log's path).
    """
    from kimi.fork.fsutil import write_json_atomic

    if plan.problems:
        raise KimiError("cannot build:\n  " + "\n  ".join(plan.problems))
    record = BuildRecord(plan=plan.as_dict())
    build_dir = Path(plan.build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    record.log = str(build_dir / "build.log")
    env = expand_env(plan.env)
    try:
        if plan.fork_library:
            result = fork_build.build(tuple(plan.archs), threads=min(2, plan.jobs))
            record.fork_library = result.as_dict()
            print(f"draft-head library: {result.library} ({'reused' if result.cached else f'{result.seconds} s'})")
        if not plan.configure:
            record.result = "ok"
            return record
        for source in plan.sources:
            if source["variable"] in plan.standins:
                make_standin(Path(plan.source_dir), source, Path(plan.env[source["variable"]]))
        if plan.waivers:
            (build_dir / WAIVERS_FILE).write_text(waivers_cmake(plan.waivers))
        if plan.overlay:
            make_toolkit_overlay(Path(plan.overlay["home"]), [Path(d) for d in plan.overlay["providers"]],
                                 Path(plan.overlay["path"]))
        with open(record.log, "a") as log:
            start = time.monotonic()
            print(f"configure: {len(plan.configure)} arguments, log {record.log}", flush=True)
            rc = _stream(plan.configure, env, log, "  ")
            record.configure_seconds = round(time.monotonic() - start, 1)
            if rc != 0:
                record.result = f"configure failed (exit {rc})"
                raise KimiError(f"CMake configure failed (exit {rc}) after {record.configure_seconds} s: "
                                f"see {record.log}")
            if configure_only:
                record.result = "configured"
                return record
            missing = _missing_objects(build_dir, plan.units)
            if missing:
                record.result = "objects not in build.ninja"
                raise KimiError("build.ninja has no rule for: " + ", ".join(missing) +
                                " (the unit is not compiled for --arch, or the upstream layout changed)")
            start = time.monotonic()
            print(f"build: {plan.jobs} job(s), {len(plan.units) or 'all'} target(s)", flush=True)
            rc = _stream(plan.build or [], env, log, "")
            record.build_seconds = round(time.monotonic() - start, 1)
            record.objects = [u["object"] for u in plan.units if (build_dir / u["object"]).is_file()]
            record.cubins = object_cubins(build_dir, record.objects)
            for obj, cubins in record.cubins.items():
                print(f"  {Path(obj).name}: {', '.join(cubins) or 'no cubin'}")
            if rc != 0:
                record.result = f"build failed (exit {rc})"
                failed = [Path(u["object"]).name for u in plan.units if u["object"] not in record.objects]
                raise KimiError(f"build failed (exit {rc}) after {record.build_seconds} s"
                                + (f"; not built: {', '.join(failed)}" if failed else "") + f": see {record.log}")
            if plan.install:
                start = time.monotonic()
                rc = _stream(plan.install, env, log, "  ")
                record.install_seconds = round(time.monotonic() - start, 1)
                if rc != 0:
                    record.result = f"install failed (exit {rc})"
                    raise KimiError(f"cmake --install failed (exit {rc}): see {record.log}")
        record.result = "ok"
        return record
    finally:
        write_json_atomic(build_dir / "kimi-build.json", record.as_dict())


def object_cubins(build_dir: Path, objects: list[str]) -> dict[str, list[str]]:
    """``cuobjdump --list-elf`` architectures of each built object (``{obj: ["sm_90a", "sm_100a"]}``);
    empty when no cuobjdump of CUDA 13 or newer is found (``kimi kernels prepare --fetch`` gets one)."""
    if not objects or fork_build.find_cuobjdump() is None:
        return {}
    found = {}
    for obj in objects:
        try:
            found[obj] = fork_build.list_cubins(build_dir / obj)
        except KimiError as exc:
            found[obj] = [f"error: {exc}"]
    return found


def _missing_objects(build_dir: Path, units: list[dict]) -> list[str]:
    """The unit objects ``build.ninja`` has no build statement for."""
    if not units:
        return []
    try:
        ninja = (build_dir / "build.ninja").read_text(errors="replace")
    except OSError:
        return [u["object"] for u in units]
    return [u["object"] for u in units if f"build {u['object']}:" not in ninja
            and f"build {u['object'].replace(':', '$:')}:" not in ninja]
