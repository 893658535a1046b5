"""``kimi models make|train-target|pick-target|train-pair|train-vision|pair-k25|quantize|widen``: the reference
models, made here, never downloaded."""

from __future__ import annotations

import argparse
from pathlib import Path

from kimi.cli.options import add_force, add_group, positive_float, positive_int
from kimi.fork.layout import Layout
from kimi.models.selection import QualityBar, pick_target


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
                    "(held-out loss included). --recipe h200-unlikelihood made the shipped target (models/pair/target) "
                    "on one H200 (benchmarks/results/logs/pair-unlikelihood-h200/); the cpu recipe is minutes on 2 "
                    "cores and a weak model.")
    p.add_argument("out", nargs="?", type=Path, default=None,
                   help="folder to write (default: .kimi/models/trained/target)")
    p.add_argument("--recipe", choices=("cpu", "h200", "h200-unlikelihood"), default="cpu",
                   help="training settings: cpu (minutes on 2 cores), h200 (next-token training only, the former "
                        "shipped target's; CUDA) or h200-unlikelihood (the shipped target's: more code, "
                        "then unlikelihood fine-tuning against greedy loops; CUDA); default: %(default)s")
    p.add_argument("--steps", type=positive_int, default=None, help="optimiser steps (default: the recipe's)")
    p.add_argument("--site-mb", type=positive_int, default=None,
                   help="also train on this many MB of the installed packages' Python code (default: none)")
    p.add_argument("--max-seconds", type=positive_float, default=None,
                   help="stop the next-token training after this many seconds (default: the recipe's)")
    p.add_argument("--unlikelihood-seconds", type=positive_float, default=None,
                   help="then fine-tune this long with sequence-level unlikelihood against greedy repeats "
                        "(default: none)")
    p.add_argument("--unlikelihood-weight", type=positive_float, default=None,
                   help="weight of the unlikelihood term (default: 1.0)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the batches (default: %(default)s)")
    add_force(p, "replace an existing folder")
    p.set_defaults(func=cmd_train_target)
    p = cmds.add_parser(
        "pick-target", help="keep the best of several trained targets (held-out loss, greedy code without loops)",
        description="Read each candidate's MANIFEST.json (train-target records its held-out loss and the loop share "
                    "and distinct-2 of its greedy completions of held-out prompts other than the benchmarks'), and "
                    "copy the candidate with the lowest held-out loss among those that clear the bar to --into. "
                    "Exit status 3 when none clears it (nothing is written), 1 on an error.")
    p.add_argument("candidates", nargs="+", type=Path, help="folders written by train-target")
    p.add_argument("--into", type=Path, required=True, help="folder to write the chosen target to")
    p.add_argument("--max-loop-share", type=float, default=QualityBar.max_loop_share,
                   help="most completions allowed to end in a loop (default: %(default)s)")
    p.add_argument("--min-distinct-2", type=float, default=QualityBar.min_distinct_2,
                   help="least distinct-2 of the completions (default: %(default)s)")
    add_force(p, "replace an existing --into folder")
    p.set_defaults(func=cmd_pick_target)
    p = cmds.add_parser(
        "train-pair", help="the trained reference pair: train-target, then its drafter through `kimi train`",
        description="Train the target (as train-target) and its EAGLE-3 drafter with the kimi train stages "
                    "(regenerate, capture, vocab, train, export, report) into OUT/target, OUT/drafter and "
                    "OUT/work. Stages already done are skipped.")
    p.add_argument("out", nargs="?", type=Path, default=None, help="folder (default: .kimi/models/trained)")
    p.add_argument("--recipe", choices=("cpu", "h200"), default="cpu",
                   help="drafter settings: cpu (the stages on 2 cores, about half an hour) or h200 (the shipped "
                        "drafter's: 24576 answers from the training corpus and transformers' source, the "
                        "trainer on the GPU); default: %(default)s")
    p.add_argument("--target", type=Path, default=None, metavar="DIR",
                   help="use this trained target (train-target / pick-target output) as OUT/target")
    p.add_argument("--tiny", action="store_true", help="a minute-sized pair for tests (not a useful drafter)")
    add_force(p, "train a pair made with another recipe again (its target too where the target settings differ)")
    p.set_defaults(func=cmd_train_pair)
    p = cmds.add_parser(
        "train-vision", help="train a small vision tower that shows the pair's target code lines as images (minutes)",
        description="Train the Kimi-K2.5 wrapper's vision tower and projector (kimi.models.vision) by distillation "
                    "through the frozen pair target: an image of a held-in stdlib def line, then a newline, should "
                    "make the target continue as after the line written out. The encoder blocks stay the "
                    "identity; the tower memorises a fixed set of snippets. Seeded; writes OUT/vision.safetensors "
                    "and OUT/MANIFEST.json (recipe, snippets, losses, seconds, sha256) atomically.")
    p.add_argument("out", nargs="?", type=Path, default=None,
                   help="folder to write (default: the shipped models/pair-vision)")
    p.add_argument("--target", type=Path, default=None, metavar="DIR",
                   help="the frozen target (default: models/pair/target)")
    p.add_argument("--steps", type=positive_int, default=None, help="optimiser steps (default: the recipe's)")
    p.add_argument("--snippets", type=positive_int, default=None, help="code lines to train on (default: the recipe's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the batches (default: %(default)s)")
    add_force(p, "replace an existing folder")
    p.set_defaults(func=cmd_train_vision)
    p = cmds.add_parser(
        "pair-k25", help="assemble the Kimi-K2.5 wrapper of the pair's target with the trained vision tower",
        description="Write OUT/model, a KimiK25ForConditionalGeneration checkpoint: the pair target's text weights "
                    "under language_model. and the trained tower of --vision (placeholder <|media_pad|> = id 2, "
                    "64 image tokens per 224 x 224 image), and OUT/MANIFEST.json. Serve it with the pair's drafter.")
    p.add_argument("out", nargs="?", type=Path, default=None, help="folder to write (default: .kimi/models/pair-k25)")
    p.add_argument("--pair", type=Path, default=None, metavar="DIR", help="the pair (default: models/pair)")
    p.add_argument("--vision", type=Path, default=None, metavar="DIR",
                   help="the trained tower (default: models/pair-vision)")
    add_force(p, "replace an existing folder")
    p.set_defaults(func=cmd_pair_k25)
    p = cmds.add_parser(
        "quantize", help="a bf16 target rewritten block-FP8 (DeepSeek-V3 / Kimi-K2) or INT4 experts (Kimi-K2.5)",
        description="Rewrite a bf16 DeepSeek-V3-architecture target in a served checkpoint layout: fp8-block "
                    "(e4m3 weights, float32 weight_scale_inv per block, quant_method fp8) or int4-experts (routed "
                    "experts W4A16 in compressed-tensors' pack-quantized format, group-wise scales). Block and "
                    "group are the published 128 and 32 where the target's widths allow, else the largest power "
                    "of two below that they do (16 for the shipped pair). Written atomically, with a MANIFEST.json.")
    p.add_argument("scheme", choices=("fp8-block", "int4-experts"), help="the layout to write")
    p.add_argument("out", nargs="?", type=Path, default=None,
                   help="folder to write (default: .kimi/models/quantized/SCHEME)")
    p.add_argument("--source", type=Path, default=None, metavar="DIR",
                   help="the bf16 target to quantize (default: the shipped pair's, models/pair/target)")
    add_force(p, "replace an existing folder")
    p.set_defaults(func=cmd_quantize)
    p = cmds.add_parser(
        "widen", help="the trained pair padded with zeros to 128-multiple widths (what block-FP8 kernels take)",
        description="Write a pair whose target and Llama-style drafter compute what the given pair's do, with the "
                    "widths under an RMSNorm padded to 4^j times themselves and the experts' to a multiple of 128 "
                    "(zero rows and columns, norm weights scaled by a power of two), so that `kimi models quantize "
                    "fp8-block` can use the published 128 x 128 blocks. Written atomically, with a MANIFEST.json.")
    p.add_argument("out", nargs="?", type=Path, default=None, help="folder to write (default: .kimi/models/pair-wide)")
    p.add_argument("--pair", type=Path, default=None, metavar="DIR", help="the pair to widen (default: models/pair)")
    add_force(p, "replace an existing folder")
    p.set_defaults(func=cmd_widen)


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
    given = {"steps": args.steps, "site_bytes": args.site_mb and args.site_mb * 1_000_000,
             "max_seconds": args.max_seconds, "unlikelihood_seconds": args.unlikelihood_seconds,
             "unlikelihood_weight": args.unlikelihood_weight}
    recipe = replace(RECIPES[args.recipe], seed=args.seed, **{k: v for k, v in given.items() if v is not None})
    train_target(out, cfg=recipe, force=args.force)
    return 0


def cmd_pick_target(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi models pick-target CANDIDATE... --into OUT``: the best trained target, copied; 3 if none clears."""
    from kimi.fork.fsutil import check_replaceable, copy_folder
    from kimi.log import sayer
    from kimi.models import OUTPUT_KEYS

    say = sayer("models")
    check_replaceable(args.into, "MANIFEST.json", args.force, keep=(Path.cwd(),), inputs=tuple(args.candidates),
                      marker_keys=OUTPUT_KEYS["train-target"])  # a copy of one: what train-target writes
    chosen, rows = pick_target(args.candidates, QualityBar(args.max_loop_share, args.min_distinct_2))
    for row in rows:
        say(f"{row['target']}: site {row['site_bytes'] / 1e6:.0f} MB, held-out loss {row['heldout_loss']:.3f}, "
            f"loop share {row['loop_share']:.2f}, distinct-2 {row['distinct_2']:.2f}"
            + ("" if row["clears_bar"] else " (below the bar)"))
    if chosen is None:
        say("no candidate clears the bar: nothing written (exit 3)")
        return 3
    copy_folder(chosen, args.into)
    say(f"kept {chosen} as {args.into}")
    return 0


def cmd_train_pair(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi models train-pair [OUT]``: the trained target and its drafter."""
    from kimi.train.pair import PAIR_RECIPES, train_pair

    train_pair(args.out or layout.private / "models" / "trained", None if args.tiny else PAIR_RECIPES[args.recipe],
               force=args.force, tiny=args.tiny, target_from=args.target)
    return 0


def cmd_train_vision(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi models train-vision [OUT]``: the trained vision tower (kimi.models.vision, kimi.models.pair_k25)."""
    from dataclasses import replace

    from kimi.fork.fsutil import check_replaceable
    from kimi.log import sayer
    from kimi.models import OUTPUT_KEYS, SHIPPED_PAIR
    from kimi.models.pair_k25 import SHIPPED_VISION, write_vision
    from kimi.models.vision import VisionRecipe, check_target, train_vision

    out = args.out or SHIPPED_VISION
    target = args.target or SHIPPED_PAIR / "target"
    recipe = replace(VisionRecipe(), seed=args.seed, **({"steps": args.steps} if args.steps else {}),
                     **({"snippets": args.snippets} if args.snippets else {}))
    check_target(target)  # these before minutes of training
    check_replaceable(out, "MANIFEST.json", args.force, keep=(Path.cwd(),), inputs=(target,),
                      marker_keys=OUTPUT_KEYS["train-vision"])
    tensors, record = train_vision(target, recipe, say=sayer("models"))
    write_vision(out, tensors, record, recipe, force=True)
    return 0


def cmd_pair_k25(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi models pair-k25 [OUT]``: the wrapper of the pair's target with the trained tower."""
    from kimi.models import SHIPPED_PAIR
    from kimi.models.pair_k25 import SHIPPED_VISION, assemble

    assemble(args.out or layout.private / "models" / "pair-k25", args.pair or SHIPPED_PAIR,
             args.vision or SHIPPED_VISION, force=args.force)
    return 0


def cmd_quantize(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi models quantize SCHEME [OUT]``: a quantized copy of a bf16 target (kimi.models.quantize)."""
    from kimi.models import SHIPPED_PAIR
    from kimi.models.quantize import quantize_target

    quantize_target(args.source or SHIPPED_PAIR / "target", args.out or layout.private / "models" / "quantized" /
                    args.scheme, args.scheme, force=args.force)
    return 0


def cmd_widen(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi models widen [OUT]``: the pair padded to 128-multiple widths (kimi.models.widen)."""
    from kimi.models import SHIPPED_PAIR
    from kimi.models.widen import widen_pair

    widen_pair(args.pair or SHIPPED_PAIR, args.out or layout.private / "models" / "pair-wide", force=args.force)
    return 0
