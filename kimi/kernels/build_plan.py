"""The plan of ``kimi kernels build-vllm``: the subset's units, the local source folders and stand-ins, the CMake
configure and build commands, the environment and the jobs sized to memory, and the problems that stop it, rendered
before anything runs (:mod:`kimi.kernels.vllm_build` describes the subsets)."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kimi.errors import KimiError
from kimi.kernels import build as fork_build
from kimi.kernels import sources as srcs
from kimi.kernels.cmake_tree import WAIVERS_FILE, compiler_checks, project_name, series_cuda_units, sm100_units
from kimi.kernels.toolchain import (
    LIBCUDA_GAP,
    OVERLAY_DIR,
    Toolchain,
    available_memory_gb,
    cpu_cores,
    find_toolchain,
    overlay_providers,
    toolkit_gaps,
    version_tuple,
)

SUBSETS = ("fork", "sm100", "all")


PER_JOB_GB = 11.0


def jobs_for_memory(cores: int, available_gb: float, per_job_gb: float = PER_JOB_GB) -> int:
    """Parallel compile jobs: ``max(1, min(cores, available_gb // per_job_gb))``.

    Args:
        cores: CPU cores this process may use.
        available_gb: memory available now, in GiB (``MemAvailable``).
        per_job_gb: peak memory of one heavy unit, GiB (~11 for a CUTLASS sm100 unit).

    Raises KimiError when ``per_job_gb`` is not positive.
    """
    if per_job_gb <= 0:
        raise KimiError(f"--per-job-gb must be positive, not {per_job_gb}")
    return max(1, min(cores, int(available_gb // per_job_gb)))


@dataclass
class Plan:
    """Everything a build will do, before it does it (printed by ``--dry-run``)."""

    subset: str
    archs: list[str]
    source_dir: str
    build_dir: str
    jobs: int
    cores: int
    available_gb: float
    per_job_gb: float
    build_type: str
    env: dict[str, str]
    configure: list[str] | None
    build: list[str] | None
    install: list[str] | None
    units: list[dict]
    fork_library: bool
    sources: list[dict]
    standins: list[str]
    warnings: list[str]
    problems: list[str]
    toolchain: dict
    waivers: list[str] = field(default_factory=list)  # FATAL_ERROR prefixes kimi-waivers.cmake makes warnings
    overlay: dict | None = None  # the CUDA toolkit overlay: {"path", "home", "providers"}

    def as_dict(self) -> dict:
        return asdict(self)


def _compiler_waivers(root: Path, subset: str, tc: Toolchain, found: list, cmake_args: list[str],
                      problems: list[str], warnings: list[str]) -> list[str]:
    """The GCC checks of the tree that the host compiler fails: a problem each, except, for a subset other
    than ``all``, a check whose message names only external sources (none of which the subset compiles),
    which is waived (a note). Returns the waived messages' prefixes. Nothing when the compiler is not GCC,
    unknown, or chosen with ``-DCMAKE_CXX_COMPILER``."""
    if not tc.cxx_gnu or not tc.cxx_version or any(a.startswith("-DCMAKE_CXX_COMPILER") for a in cmake_args):
        return []
    names = sorted({s.repo_name for s in found if s.repo_name})
    waived = []
    for check in compiler_checks(root):
        if version_tuple(tc.cxx_version) >= version_tuple(check.version):
            continue
        named = [n for n in names if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", check.message, re.I)]
        line = (f"the host C++ compiler {tc.cxx} is GCC {tc.cxx_version}, and CMakeLists.txt stops for GCC < "
                f"{check.version}: \"{check.prefix.strip()}\"")
        if subset != "all" and named:
            waived.append(check.prefix)
            warnings.append(f"{line}, for {', '.join(named)}, which the {subset} subset does not compile: waived "
                            f"(configure includes {WAIVERS_FILE}, which turns that FATAL_ERROR into a warning); "
                            f"--subset all needs GCC >= {check.version}")
        else:
            problems.append(f"{line}: install GCC >= {check.version} and set CXX and CC (or --cmake-arg "
                            "-DCMAKE_CXX_COMPILER=...)")
    return waived


def _toolkit_overlay(subset: str, tc: Toolchain, build_dir: Path, problems: list[str],
                     warnings: list[str]) -> dict | None:
    """Where the CUDA toolkit lacks what torch's CMake config links (``tc.toolkit_gaps``): for a subset
    other than ``all`` (which links, so needs a real toolkit) an overlay of the toolkit and the
    ``--python`` environment's CUDA wheels when they fill the gaps (a note), else a problem naming the fix."""
    if not tc.toolkit_gaps or not tc.cuda_home:
        return None
    home = Path(tc.cuda_home)
    providers = overlay_providers(tc.python_path)
    left = [g for g in toolkit_gaps(home, providers) if g != LIBCUDA_GAP]
    if providers and not left and subset != "all":  # all links the libraries: no empty stub there
        path = build_dir / OVERLAY_DIR
        warnings.append(f"the CUDA toolkit at {home} lacks {', '.join(tc.toolkit_gaps)}, which torch's CMake config "
                        f"links: CUDA_HOME is {path}, an overlay of it and {', '.join(map(str, providers))} "
                        "(an empty libcuda.so stub: nothing is linked)")
        return {"path": str(path), "home": str(home), "providers": [str(d) for d in providers]}
    problems.append(f"the CUDA toolkit at {home} lacks {', '.join(left or tc.toolkit_gaps)}, which torch's CMake "
                    "config links: install the full toolkit (cuBLAS, NVRTC, stubs) or point CUDA_HOME at a folder "
                    "that adds them, or use a --python whose environment has the nvidia-cublas / nvidia-cuda-nvrtc "
                    "wheels (torch's CUDA build brings them), which build-vllm then overlays")
    return None


def default_build_dir(root: Path, subset: str) -> Path:
    """``ROOT/.kimi/build/vllm-<subset>`` (git-ignored); ``all`` and the subsets keep separate caches."""
    return root / ".kimi" / "build" / f"vllm-{subset}"


def make_plan(root: Path, subset: str = "sm100", archs: tuple[str, ...] = fork_build.DEFAULT_ARCHS, *,
              build_dir: Path | None = None, jobs: int | None = None, per_job_gb: float = PER_JOB_GB,
              python: str | None = None, build_type: str = "RelWithDebInfo", install: bool = False,
              line: str | None = None, sources_dir: Path | None = None, toolchain: Toolchain | None = None,
              cores: int | None = None, available_gb: float | None = None,
              cmake_args: list[str] | None = None, only: list[str] | None = None,
              checkout: Path | None = None, keep_going: bool = False) -> Plan:
    """The configure/build commands and environment for ``subset`` of the vLLM tree at ``root``.

    Args:
        root: the laid vLLM tree (``CMakeLists.txt``, ``csrc/``, ``cmake/``) and the fork checkout.
        subset: one of :data:`SUBSETS`.
        archs: TORCH_CUDA_ARCH_LIST entries (``("9.0a", "10.0a")``).
        jobs: parallel compile jobs; default :func:`jobs_for_memory` of ``cores`` and ``available_gb``.
        per_job_gb: GiB one job may take (default 11).
        python: the interpreter whose torch CMake uses (default :func:`kimi.kernels.toolchain.default_python`).
        build_type: CMAKE_BUILD_TYPE (setup.py's default is RelWithDebInfo).
        install: after ``all``, install the libraries into ``root`` (``cmake --install``).
        checkout: the fork checkout whose ``kimi/lines/<line>/patches`` the fork subset reads
            (default: ``root``).
        keep_going: build every unit that can be built when one fails (Ninja ``-k 0``).
        only: keep the subset's units whose path contains one of these strings (one heavy unit alone).
        cmake_args: more configure arguments (``-DX=Y``), after ours; default: ``$CMAKE_ARGS`` split
            on spaces, as vLLM's setup.py reads it.
        toolchain, cores, available_gb: for tests; found on this machine otherwise.

    Problems (missing sources or tools) go to ``plan.problems``, each naming its fix; nothing is run.
    Raises KimiError for an unknown subset or a tree that is not laid.
    """
    from kimi.fork.layout import DEFAULT_LINE

    if subset not in SUBSETS:
        raise KimiError(f"unknown subset {subset!r}: one of {', '.join(SUBSETS)}")
    if not (root / "CMakeLists.txt").is_file():
        raise KimiError(f"no CMakeLists.txt at {root}: lay the upstream tree first with `python3 -m kimi sync`")
    build_dir = (build_dir or default_build_dir(root, subset)).resolve()
    cores = cores or cpu_cores()
    available_gb = available_memory_gb() if available_gb is None else available_gb
    jobs = jobs or jobs_for_memory(cores, available_gb, per_job_gb)
    problems: list[str] = []
    warnings: list[str] = []
    if available_gb < per_job_gb * jobs:
        warnings.append(f"{available_gb:.1f} GiB available for {jobs} job(s) of up to {per_job_gb:g} GiB: a heavy "
                        "CUTLASS unit may be killed for memory (free memory, or lower --jobs)")

    if subset == "sm100":
        units = sm100_units(root)
        if not any(a.startswith("10.") for a in archs):
            problems.append(f"the sm100 subset compiles for 10.x only, and --arch {';'.join(archs)} has none: "
                            "add 10.0a")
    elif subset == "fork":
        units = series_cuda_units(checkout or root, line or DEFAULT_LINE, root)
    else:
        units = []
    if only:
        kept = [u for u in units if any(s in u.source for s in only)]
        if not kept:
            problems.append(f"--only {' '.join(only)} matches none of the {subset} subset's {len(units)} units"
                            + (f": {', '.join(Path(u.source).name for u in units)}" if units else ""))
        units = kept or units
    needs_cmake = subset == "all" or bool(units)

    found = srcs.external_sources(root, sources_dir)
    waivers: list[str] = []
    overlay: dict | None = None
    standins: list[str] = []
    env: dict[str, str] = {}
    cmake_defs: list[str] = []
    tc = toolchain or (find_toolchain(root, python) if needs_cmake else Toolchain(python=python))
    if needs_cmake:
        problems += tc.problems
        for s in found:
            if s.present:
                path = s.path
                if s.revision_ok is False:
                    warnings.append(f"{s.variable}: {s.revision} ({s.origin}), not the pinned {s.tag}")
            elif subset != "all" and s.variable != "VLLM_CUTLASS_SRC_DIR":
                path = str(build_dir / "standins" / s.name)
                standins.append(s.variable)
            else:
                more = f" and {len(s.missing_files) - 6} more" if len(s.missing_files) > 6 else ""
                lacks = f" incomplete (lacks {', '.join(s.missing_files[:6])}{more})" if Path(s.path).exists() else ""
                problems.append(f"{s.variable}{lacks}: {s.how_to_provide()}")
                path = s.path
            env[s.variable] = path
            if s.variable != "TRITON_KERNELS_SRC_DIR":  # triton_kernels.cmake reads only the environment
                cmake_defs.append(f"-D{s.variable}={path}")
        cutlass = env.get("VLLM_CUTLASS_SRC_DIR", "")
        # vLLM reads these three from CUTLASS's own CMakeLists.txt, which a headers tree lacks;
        # for a checkout they are the values CUTLASS would set.
        cmake_defs += [f"-DCUTLASS_DIR={cutlass}", f"-DCUTLASS_INCLUDE_DIR={cutlass}/include",
                       f"-DCUTLASS_TOOLS_UTIL_INCLUDE_DIR={cutlass}/tools/util/include"]
        if standins:
            warnings.append("configure-only stand-ins (never compiled) for: " + ", ".join(standins))
        extra = cmake_args if cmake_args is not None else os.environ.get("CMAKE_ARGS", "").split()
        waivers = _compiler_waivers(root, subset, tc, found, extra, problems, warnings)
        if waivers:
            cmake_defs.append(f"-DCMAKE_PROJECT_{project_name(root)}_INCLUDE={build_dir / WAIVERS_FILE}")
        overlay = _toolkit_overlay(subset, tc, build_dir, problems, warnings)
    env["TORCH_CUDA_ARCH_LIST"] = ";".join(archs)
    nvcc = tc.nvcc
    if overlay:
        env["CUDA_HOME"] = overlay["path"]
        nvcc = str(Path(overlay["path"]) / "bin" / "nvcc")
    elif tc.cuda_home:
        env["CUDA_HOME"] = tc.cuda_home
    if nvcc:  # CMakeLists.txt: find_program(NVCC_EXECUTABLE nvcc)
        env["PATH"] = f"{Path(nvcc).parent}:$PATH"
    env["NINJA_STATUS"] = "[%f/%t %es] "

    configure = build = inst = None
    if needs_cmake:
        cmake = tc.cmake or "cmake"
        configure = [cmake, "-S", str(root), "-B", str(build_dir), "-G", "Ninja",
                     f"-DCMAKE_BUILD_TYPE={build_type}", "-DVLLM_TARGET_DEVICE=cuda",
                     f"-DVLLM_PYTHON_EXECUTABLE={tc.python}",
                     f"-DFETCHCONTENT_BASE_DIR={build_dir / 'deps'}", "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
                     "-DFETCHCONTENT_QUIET=OFF", "-DNVCC_THREADS=1",
                     "-DCMAKE_JOB_POOL_COMPILE:STRING=compile", f"-DCMAKE_JOB_POOLS:STRING=compile={jobs}"]
        python_path = [p for p in tc.python_path if p and Path(p).exists()]
        if python_path:  # as setup.py: machete's generator runs with it
            configure.append(f"-DVLLM_PYTHON_PATH={':'.join(python_path)}")
        if tc.ninja:
            configure.append(f"-DCMAKE_MAKE_PROGRAM={tc.ninja}")
        if nvcc:
            configure.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
        if tc.ccache:
            configure += [f"-DCMAKE_{lang}_COMPILER_LAUNCHER={tc.ccache}" for lang in ("C", "CXX", "CUDA")]
        configure += cmake_defs
        configure += cmake_args if cmake_args is not None else os.environ.get("CMAKE_ARGS", "").split()
        build = [cmake, "--build", str(build_dir), "-j", str(jobs)]
        if units:
            build += ["--target", *[u.object for u in units]]
        if keep_going:
            build += ["--", "-k", "0"]
        if subset == "all" and install:
            inst = [cmake, "--install", str(build_dir), "--prefix", str(root)]
    elif subset == "fork":
        if not tc.nvcc and fork_build.find_nvcc() is None:
            problems.append("no nvcc for the draft-head library: install the CUDA toolkit 13 and set CUDA_HOME or NVCC")
        warnings.append(f"the {line or DEFAULT_LINE} series changes no upstream CUDA unit: "
                        "no CMake configure is needed")

    return Plan(subset=subset, archs=list(archs), source_dir=str(root), build_dir=str(build_dir), jobs=jobs,
                cores=cores, available_gb=round(available_gb, 1), per_job_gb=per_job_gb, build_type=build_type,
                env=env, configure=configure, build=build, install=inst, units=[asdict(u) | {"object": u.object}
                                                                                  for u in units],
                fork_library=subset in ("fork", "all"), sources=[s.as_dict() for s in found] if needs_cmake else [],
                standins=standins, warnings=warnings, problems=problems, toolchain=asdict(tc), waivers=waivers,
                overlay=overlay)


_WITH_VALUE = ("-S", "-B", "-G", "-j", "--build", "--install", "--prefix")


def _shell(cmd: list[str]) -> str:
    """A command as shell text, one option (with its value) per line."""
    parts: list[str] = [shlex.quote(cmd[0])]
    i = 1
    while i < len(cmd):
        if cmd[i] in _WITH_VALUE and i + 1 < len(cmd):
            parts.append(f"{cmd[i]} {shlex.quote(cmd[i + 1])}")
            i += 2
        else:
            parts.append(shlex.quote(cmd[i]))
            i += 1
    return " \\\n    ".join(parts)


def expand_env(env: dict[str, str], base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default os.environ) updated with ``env``, where ``$PATH`` in a value is the base's PATH."""
    base = dict(os.environ if base is None else base)
    return {**base, **{k: v.replace("$PATH", base.get("PATH", "")) for k, v in env.items()}}


def render_plan(plan: Plan) -> str:
    """The plan as text: sizing, environment, the full commands (shell-quoted), warnings, problems."""
    lines = [f"subset {plan.subset}: TORCH_CUDA_ARCH_LIST={';'.join(plan.archs)}, build dir {plan.build_dir}",
             (f"jobs: {plan.jobs} (cores {plan.cores}, available memory {plan.available_gb:.1f} GiB, "
              f"{plan.per_job_gb:g} GiB per job: max(1, min(cores, available // per_job)))"),
             f"ccache: {plan.toolchain.get('ccache') or 'not found (builds do not reuse earlier objects)'}"]
    tc = plan.toolchain
    if plan.configure:
        lines.append(f"tools: cmake {tc.get('cmake_version')} ({tc.get('cmake')}), ninja {tc.get('ninja')}, "
                     f"nvcc {tc.get('cuda_release')} ({tc.get('nvcc')}), "
                     f"c++ {tc.get('cxx_version')} ({tc.get('cxx')}), python {tc.get('python')} "
                     f"(torch {tc.get('torch')}, CUDA {tc.get('torch_cuda')})")
    if plan.fork_library:
        lines.append(f"the fork's draft-head library: kimi kernels build --arch '{';'.join(plan.archs)}' "
                     f"({fork_build.SOURCE.name}, nvcc)")
    if plan.units:
        lines.append(f"{len(plan.units)} units:")
        lines += [f"  {u['group']:<24} {u['source']}" for u in plan.units]
    if plan.configure:
        lines.append("\nenvironment:")
        lines += [f"  export {k}={shlex.quote(v) if k != 'PATH' else v}" for k, v in plan.env.items()]
        lines.append("\nconfigure:\n  " + _shell(plan.configure))
        lines.append("\nbuild:\n  " + _shell(plan.build or []))
        if plan.install:
            lines.append("\ninstall:\n  " + _shell(plan.install))
    for w in plan.warnings:
        lines.append(f"note: {w}")
    for p in plan.problems:
        lines.append(f"MISSING: {p}")
    return "\n".join(lines)
