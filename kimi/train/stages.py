"""``kimi train STAGE``: argparse namespace -> the stage functions."""

from __future__ import annotations

import argparse
import json

from kimi.errors import KimiError


def run(args: argparse.Namespace) -> None:
    """Run ``args.stage`` with the options of its subcommand (see ``kimi train STAGE --help``)."""
    target = str(args.target) if args.target else None
    if target and not (args.target / "config.json").is_file():
        raise KimiError(f"{args.target} has no config.json: give the target model folder")
    if args.stage == "regenerate":
        from kimi.train.regenerate import RegenerateOptions, regenerate

        regenerate(args.work, target, RegenerateOptions(num_prompts=args.num_prompts, max_tokens=args.max_tokens,
                                                        temperature=args.temperature, seed=args.seed), args.prompts)
    elif args.stage == "capture":
        from kimi.train.capture import capture

        capture(args.work, target, args.ids, args.dtype, args.shard_mb)
    elif args.stage == "vocab":
        from kimi.train.vocab import build_vocab

        config = json.loads((args.target / "config.json").read_text())
        build_vocab(args.work, int(config.get("text_config", config)["vocab_size"]), args.draft_vocab)
    elif args.stage == "train":
        from kimi.train.trainer import TrainOptions, train

        train(args.work, target, TrainOptions(epochs=args.epochs, batch=args.batch, lr=args.lr,
                                              ttt_steps=args.ttt_steps, heads=args.heads, seed=args.seed,
                                              save_every=args.save_every), resume=args.resume, init=args.init)
    elif args.stage == "export":
        from kimi.train.export import export

        export(args.work, args.out, target, force=args.force)
    elif args.stage == "report":
        from kimi.train.report import report

        served = None
        if args.drafter:
            if not target:
                raise KimiError("--drafter needs --target")
            from kimi.e2e.engine import tokenize
            from kimi.models.prompts import code_prompts
            from kimi.train.acceptance import served_acceptance

            served = served_acceptance(target, str(args.drafter), tokenize(target, code_prompts(args.prompts_count)),
                                       k=3, max_tokens=args.max_tokens)
        report(args.work, served)
