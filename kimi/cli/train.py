"""``kimi train STAGE``: train an EAGLE-3 drafter for a target, stage by stage (each resumable)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kimi.cli.options import add_force, add_group, positive_int
from kimi.fork.layout import Layout


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``train`` and its stages to the ``kimi`` subparsers."""
    cmds = add_group(sub, "train", "train an EAGLE-3 drafter for a target, stage by stage (each resumable)")

    def stage(name: str, help: str, description: str) -> argparse.ArgumentParser:
        p = cmds.add_parser(name, help=help, description=description)
        p.add_argument("--work", type=Path, required=True, help="work folder shared by the stages")
        p.add_argument("--target", type=Path, required=name not in ("report",), help="target model folder")
        p.set_defaults(func=cmd_train, stage=name)
        return p

    p = stage("regenerate", "the target's responses to prompts through vLLM -> WORK/samples.jsonl",
              "Answer prompts with the target through the fork's vLLM and keep input_ids and a loss mask (1 on "
              "response tokens). Prompts: --prompts FILE (JSONL of {\"prompt\": ...}) or stdlib training-corpus "
              "snippets. Prompts already answered are skipped.")
    p.add_argument("--prompts", type=Path, default=None, help="JSONL file of {\"prompt\": text} objects")
    p.add_argument("--num-prompts", type=positive_int, default=256, help="corpus snippets (default: %(default)s)")
    p.add_argument("--max-tokens", type=positive_int, default=128, help="response length (default: %(default)s)")
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
    p.add_argument("--shard-mb", type=positive_int, default=256, help="shard size (default: %(default)s)")
    p = stage("vocab", "draft vocabulary by frequency over response tokens -> WORK/vocab.safetensors (d2t, t2d)",
              "Count the loss-masked tokens of the samples and keep the most frequent as the draft vocabulary.")
    p.add_argument("--draft-vocab", type=positive_int, default=1024, help="draft vocabulary size (default: "
                                                                           "%(default)s)")
    p = stage("train", "train the drafter with the training-time test -> WORK/train/",
              "EAGLE-3 drafter (Llama-style midlayer) trained on the captured states: TTT unroll with "
              "position-weighted loss, AdamW, checkpoints.")
    p.add_argument("--epochs", type=positive_int, default=8, help="passes over the data (default: %(default)s)")
    p.add_argument("--batch", type=positive_int, default=8, help="sequences per step (default: %(default)s)")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default: %(default)s)")
    p.add_argument("--ttt-steps", type=positive_int, default=3, help="TTT unroll length (default: %(default)s)")
    p.add_argument("--heads", type=positive_int, default=4, help="drafter attention heads (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="init and batch-order seed (default: %(default)s)")
    p.add_argument("--save-every", type=positive_int, default=100, help="checkpoint interval (default: %(default)s)")
    p.add_argument("--resume", action="store_true", help="continue WORK/train/checkpoint.pt")
    p.add_argument("--init", type=Path, default=None, help="warm start from an exported drafter folder")
    p = stage("export", "write a vLLM-ready drafter folder (explicit aux ids and convention)",
              "LlamaForCausalLMEagle3 config with eagle_aux_hidden_state_layer_ids in vLLM's convention (stated), "
              "bf16 weights, d2t and t2d.")
    p.add_argument("out", type=Path, help="drafter folder to write")
    add_force(p, "replace OUT")
    p = stage("report", "training curves and served acceptance: PNG (with matplotlib) + markdown -> WORK/report/",
              "Charts of the TTT loss and per-step acceptance, and, with --drafter, the served per-position "
              "acceptance measured through vLLM on held-out code prompts.")
    p.add_argument("--drafter", type=Path, default=None, help="exported drafter to serve with --target (k = 3)")
    p.add_argument("--prompts-count", type=positive_int, default=8, help="held-out prompts (default: %(default)s)")
    p.add_argument("--max-tokens", type=positive_int, default=64, help="tokens per prompt (default: %(default)s)")


def cmd_train(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi train STAGE``: run ``args.stage`` (:func:`kimi.train.stages.run`)."""
    from kimi.train import stages

    stages.run(args)
    return 0
