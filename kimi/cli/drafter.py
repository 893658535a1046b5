"""``kimi drafter inspect|convert``: EAGLE-3 drafter checkpoints."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kimi.cli.options import add_force, add_group, add_json, positive_int
from kimi.fork.layout import Layout


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``drafter`` and its subcommands to the ``kimi`` subparsers."""
    cmds = add_group(sub, "drafter", "inspect and convert EAGLE-3 drafter checkpoints")
    p = cmds.add_parser(
        "inspect", help="report format, sizes, vocab maps, aux layer ids and their convention, and problems",
        description="Read config.json and the safetensors headers (no weights are loaded) and report the format, "
                    "the architecture vLLM will pick, hidden sizes, draft/target vocab and d2t/t2d sanity, the aux "
                    "layer ids as written, their convention and the evidence, the ids in vLLM's convention (state "
                    "entering layer k), RoPE length against the target's context, and problems. Exit status 1 "
                    "when problems are found.")
    p.add_argument("path", type=Path, help="drafter checkpoint folder")
    p.add_argument("--target", type=Path, help="target model folder or its config.json")
    p.add_argument("--max-model-len", type=positive_int, default=None,
                   help="context the drafter will be served at (default: the target's max_position_embeddings)")
    p.add_argument("--load-format", choices=("auto", "dummy"), default="auto",
                   help="as vLLM's --load-format: dummy (weights drawn at random) skips the weight-file checks")
    add_json(p)
    p.set_defaults(func=cmd_inspect)
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
    add_force(p, "replace DST if it exists")
    p.set_defaults(func=cmd_convert)
    p = cmds.add_parser(
        "conventions", help="print the aux layer id conventions the check reads and their valid ranges (markdown)",
        description="Print, as a markdown table, every rule by which the drafter check reads aux layer ids (where "
                    "they are written, the convention it reads them in) with the valid ids as written and in vLLM's "
                    "convention, for L target layers or for --layers N. docs/drafters.md holds the table for L.")
    p.add_argument("--layers", type=positive_int, default=None, help="the target's decoder layer count")
    p.set_defaults(func=cmd_conventions)


def cmd_inspect(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi drafter inspect``: 1 when the report names problems."""
    from kimi.drafter.inspect import inspect

    report = inspect(args.path, args.target, served_positions=args.max_model_len, load_format=args.load_format)
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.render())
    return 1 if report.problems else 0


def cmd_convert(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi drafter convert SRC DST``."""
    from kimi.drafter.convert import convert

    convert(args.src, args.dst, target=args.target, convention=args.convention, force=args.force)
    return 0


def cmd_conventions(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi drafter conventions [--layers N]``."""
    from kimi.drafter.conventions import convention_table

    print(convention_table(args.layers))
    return 0
