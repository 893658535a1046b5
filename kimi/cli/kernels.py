"""``kimi kernels build|check|prepare|build-vllm``: the fork's own CUDA kernels and vLLM's CUDA extensions."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kimi.cli.options import add_force, add_from, add_group, add_json, add_line, positive_int
from kimi.fork.layout import Layout
from kimi.kernels.build import DEFAULT_ARCHS

ARCH_DEFAULT = ";".join(DEFAULT_ARCHS)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``kernels`` and its subcommands to the ``kimi`` subparsers."""
    cmds = add_group(sub, "kernels", "build and check the fork's own CUDA kernels (EAGLE-3 draft head)")
    p = cmds.add_parser(
        "build", help="compile the draft-head kernels with nvcc (seconds; no GPU needed)",
        description="Compile kimi/kernels/csrc/draft_head.cu into libkimi_draft_head.so (C interface, static CUDA "
                    "runtime, no torch link) with one cubin per architecture, into .kimi/build/kernels (or "
                    "$KIMI_KERNELS_BUILD_DIR). A build of the same source, flags and nvcc is reused.")
    p.add_argument("--arch", default=ARCH_DEFAULT,
                   help="architectures as in TORCH_CUDA_ARCH_LIST (default: %(default)s)")
    p.add_argument("-j", "--jobs", type=positive_int, default=2,
                   help="architectures nvcc compiles in parallel (default: %(default)s)")
    _add_build_root(p)
    add_force(p, "rebuild even when an identical build exists")
    add_json(p, "print the build record as JSON")
    p.set_defaults(func=cmd_build)
    p = cmds.add_parser(
        "check", help="list the cubins of the built library (cuobjdump --list-elf)",
        description="Find the library built from the current source and list its cubins with a cuobjdump of CUDA 13 "
                    "or newer. Exit status 1 when an architecture of --arch is missing or nothing is built.")
    p.add_argument("--arch", default=ARCH_DEFAULT, help="architectures that must be there (default: %(default)s)")
    _add_build_root(p)
    add_json(p)
    p.set_defaults(func=cmd_check)
    p = cmds.add_parser(
        "prepare", help="vLLM's CMake external sources (*_SRC_DIR): fill .kimi/sources, report what is missing",
        description="Read the laid tree's CMake files for every *_SRC_DIR variable (CUTLASS, FlashMLA, "
                    "flash-attention, DeepGEMM, QuTLASS, MSA/fmha_sm100, tml-fa4, triton_kernels) with the repository "
                    "and revision it would clone, and report which local folders are complete ($VAR, else "
                    ".kimi/sources/<name>) and at which revision. --from DIR (offline) takes git checkouts "
                    "(DIR/<repository name>, linked), source archives (DIR/<repository name>-<revision>.tar.gz or "
                    ".zip) and the wheels below from DIR; --fetch gets what the package index has: CUTLASS headers "
                    "from the pinned vLLM CUDA wheel's copy and examples from the nvidia-cutlass wheel (neither the "
                    "pinned revision: reported), fmha_sm100, tml-fa4 and triton_kernels from the pinned vLLM CUDA "
                    "wheel (sha256 checked), a CUDA 13 cuobjdump. Exit "
                    "status 1 while a source is missing.")
    p.add_argument("--fetch", action="store_true", help="download what the package index has")
    add_from(p, "folder with checkouts, source archives and wheels (no network)")
    add_force(p, "prepare again sources that are already complete")
    add_line(p, "line whose pinned CUDA wheel to use")
    add_json(p)
    p.set_defaults(func=cmd_prepare)
    _add_build_vllm(cmds)


def _add_build_root(p: argparse.ArgumentParser) -> None:
    p.add_argument("--build-dir", type=Path, default=None, help="build root (default: .kimi/build/kernels)")


def _add_build_vllm(cmds: argparse._SubParsersAction) -> None:
    p = cmds.add_parser(
        "build-vllm", help="build vLLM's CUDA extensions from source offline: the fork's, the sm_100 group, or all",
        description="Configure the laid vLLM tree's CMake project as setup.py does (Ninja, a compile job pool, "
                    "ccache when present) with TORCH_CUDA_ARCH_LIST from --arch, every *_SRC_DIR set to a local "
                    "folder (kimi kernels prepare) and FETCHCONTENT_FULLY_DISCONNECTED=ON, then build a subset: "
                    "'fork' (the fork's draft-head library, plus upstream CUDA units the patch series changes), "
                    "'sm100' (the 13 sm_100-only units of _C_stable_libtorch: scaled_mm sm100, grouped MoE sm100, "
                    "NVFP4/MXFP4, CUTLASS MLA sm100, as Ninja object targets) or 'all'. For fork and sm100 a missing "
                    "source other than CUTLASS gets a configure-only stand-in; 'all' needs every source. Jobs: "
                    "max(1, min(cores, available memory // --per-job-gb)). Fails before running anything when a "
                    "source or tool is missing, naming each. Log and record in the build dir.")
    p.add_argument("--subset", choices=("fork", "sm100", "all"), default="sm100", help="what to build "
                   "(default: %(default)s)")
    p.add_argument("--arch", default=ARCH_DEFAULT, help="TORCH_CUDA_ARCH_LIST (default: %(default)s)")
    p.add_argument("-j", "--jobs", type=positive_int, default=None,
                   help="compile jobs (default: sized to cores and available memory)")
    p.add_argument("--per-job-gb", type=float, default=11.0,
                   help="GiB one compile job may take, for the default jobs (default: %(default)s)")
    p.add_argument("--build-dir", type=Path, default=None, help="CMake build folder (default: .kimi/build/vllm-SUBSET)")
    p.add_argument("--source-dir", type=Path, default=None,
                   help="the laid vLLM tree to build (default: this checkout; sources still from its .kimi/sources)")
    p.add_argument("--python", default=None, help="interpreter whose torch CMake uses (default: .venv/bin/python)")
    p.add_argument("--build-type", default="RelWithDebInfo",
                   help="CMAKE_BUILD_TYPE (default: %(default)s, as setup.py)")
    add_line(p, "line whose patch series the fork subset reads")
    p.add_argument("--cmake-arg", action="append", default=None, metavar="-DX=Y",
                   help="another configure argument (repeatable; default: $CMAKE_ARGS, as setup.py)")
    p.add_argument("--only", action="append", default=None, metavar="TEXT",
                   help="build only the subset's units whose path contains TEXT (repeatable)")
    p.add_argument("--install", action="store_true", help="with --subset all: cmake --install into the tree")
    p.add_argument("--configure-only", action="store_true", help="stop after CMake's configure step")
    p.add_argument("--keep-going", action="store_true", help="build every unit that can be built when one fails")
    p.add_argument("--dry-run", action="store_true", help="print the environment and the full configure/build "
                   "commands; run nothing (exit 1 if something is missing)")
    add_json(p, "print the plan (--dry-run) or the build record as JSON")
    p.set_defaults(func=cmd_build_vllm)


def cmd_build(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi kernels build``: compile (or reuse) the draft-head library."""
    from kimi.kernels import build

    archs = build.parse_archs(args.arch)
    result = build.build(archs, build_root=args.build_dir, threads=args.jobs, force=args.force)
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        how = "reused" if result.cached else f"built in {result.seconds:.1f} s"
        print(f"{result.library}: {how} for {', '.join(build.sm_name(a) for a in archs)} (nvcc {result.nvcc_release})")
    return 0


def cmd_check(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi kernels check``: 1 when an architecture of ``--arch`` is missing."""
    from kimi.kernels.inventory import check_library

    report = check_library(args.build_dir, args.arch)
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.render())
    return 1 if report.missing else 0


def cmd_prepare(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi kernels prepare``: 1 while an external source is missing."""
    from kimi.kernels.inventory import prepare_sources

    report = prepare_sources(layout.root, layout.cache, fetch=args.fetch, from_dir=args.from_dir, force=args.force,
                             line=args.line)
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.render())
    return 0 if report.complete else 1


def cmd_build_vllm(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi kernels build-vllm``: plan, then (unless ``--dry-run``) configure and build; 1 when the plan has
    problems."""
    from kimi.kernels import build, build_plan, sources, vllm_build

    root = (args.source_dir or layout.root).resolve()
    plan = build_plan.make_plan(
        root, args.subset, build.parse_archs(args.arch), build_dir=args.build_dir, jobs=args.jobs,
        per_job_gb=args.per_job_gb, python=args.python, build_type=args.build_type, install=args.install,
        line=args.line, cmake_args=args.cmake_arg, only=args.only, checkout=layout.root,
        sources_dir=sources.default_sources_dir(layout.root), keep_going=args.keep_going)
    if args.json and args.dry_run:
        print(json.dumps(plan.as_dict(), indent=2))
        return 1 if plan.problems else 0
    print(build_plan.render_plan(plan), flush=True)
    if args.dry_run:
        return 1 if plan.problems else 0
    record = vllm_build.run(plan, configure_only=args.configure_only)
    timing = ", ".join(f"{k} {v} s" for k, v in (("configure", record.configure_seconds),
                                                 ("build", record.build_seconds),
                                                 ("install", record.install_seconds)) if v is not None)
    print(f"kimi kernels build-vllm: {record.result}" + (f" ({timing})" if timing else "") +
          f"; record in {Path(plan.build_dir) / 'kimi-build.json'}")
    if args.json:
        print(json.dumps(record.as_dict(), indent=2))
    return 0
