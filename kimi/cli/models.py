"""``kimi models make|train-target|train-pair``: the reference models, made here, never downloaded."""

from __future__ import annotations

import argparse
from pathlib import Path

from kimi.cli.options import add_force, add_group, positive_int
from kimi.fork.layout import Layout


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``models`` and its subcommands to the ``kimi`` subparsers."""
    cmds = add_group(sub, "models", "make the reference models (target, drafters, tokenizer), never downloaded")
    p = cmds.add_parser(
        "make", help="write the reference DeepSeek-V3-architecture target and its two EAGLE-3 drafters",
        description="Train a byte-level BPE tokenizer on the Python standard library, then write a small "
                    "DeepSeek-V3-architecture target (MLA, noaux_tc MoE, shared expert) and a Llama-style and an "
                    "MLA-style EAGLE-3 drafter with random weights from a seed, in the checkpoint layouts vLLM and "
                    "transformers load. Written atomically, with a MANIFEST.json of digests.")
    p.add_argument("out", nargs="?", type=Path, default=None, help="folder to write (default: .kimi/models/reference)")
    p.add_argument("--seed", type=int, default=0, help="weights seed (default: %(default)s)")
    add_force(p, "replace an existing folder")
    p.set_defaults(func=cmd_make)
    p = cmds.add_parser(
        "train-target", help="train the small DeepSeek-V3-architecture target on the stdlib's source (minutes)",
        description="Train transformers' DeepseekV3ForCausalLM (6 layers, 192 wide, MLA with Kimi's latent "
                    "geometry, 8-expert noaux_tc MoE, 8192 positions) on the reference tokenizer's stdlib corpus, "
                    "deterministic seeds, and write it in the DeepSeek-V3 checkpoint layout with a MANIFEST.json "
                    "(held-out loss included). --recipe h200 made the shipped target (models/pair/target) in about "
                    "7 minutes on one H200; the cpu recipe is minutes on 2 cores and a weak model.")
    p.add_argument("out", nargs="?", type=Path, default=None,
                   help="folder to write (default: .kimi/models/trained/target)")
    p.add_argument("--recipe", choices=("cpu", "h200"), default="cpu",
                   help="training settings: cpu (minutes on 2 cores) or h200 (the shipped target's, needs CUDA); "
                        "default: %(default)s")
    p.add_argument("--steps", type=positive_int, default=None, help="optimiser steps (default: the recipe's)")
    p.add_argument("--site-mb", type=positive_int, default=None,
                   help="also train on this many MB of the installed packages' Python code (default: none)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the batches (default: %(default)s)")
    add_force(p, "replace an existing folder")
    p.set_defaults(func=cmd_train_target)
    p = cmds.add_parser(
        "train-pair", help="the trained reference pair: train-target, then its drafter through `kimi train`",
        description="Train the target (as train-target) and its EAGLE-3 drafter with the kimi train stages "
                    "(regenerate, capture, vocab, train, export, report) into OUT/target, OUT/drafter and "
                    "OUT/work. Stages already done are skipped.")
    p.add_argument("out", nargs="?", type=Path, default=None, help="folder (default: .kimi/models/trained)")
    p.add_argument("--tiny", action="store_true", help="a minute-sized pair for tests (not a useful drafter)")
    add_force(p, "train again from scratch")
    p.set_defaults(func=cmd_train_pair)


def cmd_make(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi models make [OUT]``: the random-weight reference models."""
    from kimi.models.reference import ReferenceSpec, make_reference_models

    out = args.out or layout.private / "models" / "reference"
    make_reference_models(out, ReferenceSpec(seed=args.seed), force=args.force)
    return 0


def cmd_train_target(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi models train-target [OUT]``: the small trained target."""
    from dataclasses import replace

    from kimi.models.trained import RECIPES, train_target

    out = args.out or layout.private / "models" / "trained" / "target"
    recipe = replace(RECIPES[args.recipe], seed=args.seed, **({"steps": args.steps} if args.steps else {}),
                     **({"site_bytes": args.site_mb * 1_000_000} if args.site_mb else {}))
    train_target(out, cfg=recipe, force=args.force)
    return 0


def cmd_train_pair(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi models train-pair [OUT]``: the trained target and its drafter."""
    from kimi.train.pair import train_pair

    train_pair(args.out or layout.private / "models" / "trained", force=args.force, tiny=args.tiny)
    return 0
