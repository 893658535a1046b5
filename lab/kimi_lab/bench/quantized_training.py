"""A drafter trained against the quantized target that is served: the library of
``benchmarks/quantized_training.py``.

A site that serves a quantized target trains its drafter against that target, since the drafter learns to predict
from the target's aux hidden states and to agree with the target's answers, and quantization moves both. This run
measures what that is worth on the reference pair, with ``kimi train`` as a user runs it:

1. **Capture on the quantized target.** ``kimi train regenerate`` and ``kimi train capture`` on the quantized target
   (vLLM loads it as it loads the real checkpoints), then the bf16 target captured on the *same* samples: how far
   the quantized target's aux and final hidden states lie from the bf16 target's on identical tokens
   (:func:`compare_captures`).
2. **Fine-tuning on each.** The shipped drafter (trained on the bf16 target) warm-started and trained the same number
   of steps on the quantized target's answers and states, and, as the control, on the bf16 target's: what the
   quantized target's own data buys beyond more training.
3. **Served τ** (``kimi train report --drafter``, greedy, k = 3, held-out prompts) of each drafter on the quantized
   target, and of the shipped drafter on the bf16 target.

Every step is one ``python3 -m kimi train ...`` command in a child process (a fresh engine and GPU context each),
its output in ``<scratch>/logs``; :func:`plan` lists them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kimi_lab.bench.results import header


@dataclass(frozen=True)
class Settings:
    """What decides the run: the scheme (``kimi models quantize``), the answers regenerated per target
    (stdlib-corpus snippets, ``max_tokens`` each), the fine-tuning (epochs, batch, learning rate), and the served
    measurement (held-out prompts, output tokens, k = 3)."""

    scheme: str = "int4-experts"
    num_prompts: int = 2048
    max_tokens: int = 96
    epochs: int = 3
    batch: int = 32
    lr: float = 1e-3
    eval_prompts: int = 32
    eval_tokens: int = 128


@dataclass(frozen=True)
class Step:
    """One command of the run: ``name`` (its log is ``<name>.log``) and the ``kimi`` arguments; ``samples_from``: a
    work folder whose ``samples.jsonl`` is copied into ``work`` first; for a served measurement, ``served`` is the
    row it makes (drafter, target as the result names them) and ``work`` the folder whose ``report/served.json``
    it writes."""

    name: str
    args: list[str]
    work: Path | None = None
    served: tuple[str, str] | None = None
    samples_from: Path | None = None


def plan(s: Settings, scratch: Path, bf16: Path, quantized: Path, shipped: Path) -> list[Step]:
    """The commands of the run, in order (see the module docstring). ``bf16`` / ``quantized``: the target folders;
    ``shipped``: the drafter trained on the bf16 target, whose aux ids, draft vocabulary size and heads the
    captures and the fine-tuning keep. Work folders and drafters go under ``scratch``."""
    vocab = json.loads((shipped / "config.json").read_text())  # the shipped drafter's: its ids, vocabulary, heads
    ids = [str(i) for i in vocab["eagle_aux_hidden_state_layer_ids"]]
    steps: list[Step] = []
    targets = {"bf16": bf16, s.scheme: quantized}
    for name, target in targets.items():
        work, t = scratch / f"work-{name}", ["--target", str(target)]
        steps += [
            Step(f"regenerate-{name}", ["train", "regenerate", "--work", str(work), *t, "--num-prompts",
                                        str(s.num_prompts), "--max-tokens", str(s.max_tokens)]),
            Step(f"capture-{name}", ["train", "capture", "--work", str(work), *t, "--ids", *ids]),
            Step(f"vocab-{name}", ["train", "vocab", "--work", str(work), *t, "--draft-vocab",
                                   str(vocab["draft_vocab_size"])]),
            Step(f"train-{name}", ["train", "train", "--work", str(work), *t, "--init", str(shipped), "--epochs",
                                   str(s.epochs), "--batch", str(s.batch), "--lr", str(s.lr), "--heads",
                                   str(vocab["num_attention_heads"])]),
            Step(f"export-{name}", ["train", "export", str(scratch / f"drafter-{name}"), "--work", str(work), *t,
                                    "--force"]),
        ]
    same = scratch / "work-same-tokens"
    steps.append(Step("capture-bf16-on-quantized-samples",
                      ["train", "capture", "--work", str(same), "--target", str(bf16), "--ids", *ids],
                      work=same, samples_from=scratch / f"work-{s.scheme}"))
    served = [("shipped", shipped, "bf16", "bf16"), ("shipped", shipped, s.scheme, "bf16"),
              ("fine-tuned on bf16", scratch / "drafter-bf16", s.scheme, "bf16"),
              (f"fine-tuned on {s.scheme}", scratch / f"drafter-{s.scheme}", s.scheme, s.scheme)]
    for i, (label, drafter, on, trained) in enumerate(served):
        work = scratch / f"work-{trained}"  # any work folder with a training log; its report/served.json is read
        steps.append(Step(f"served-{i}", ["train", "report", "--work", str(work), "--target", str(targets[on]),
                                          "--drafter", str(drafter), "--prompts-count", str(s.eval_prompts),
                                          "--max-tokens", str(s.eval_tokens)], work=work, served=(label, on)))
    return steps


def compare_captures(quantized: Path, bf16: Path) -> dict:
    """How far the quantized target's captured states lie from the bf16 target's on the same tokens.

    ``quantized`` / ``bf16``: ``kimi train capture`` folders of the same samples (``capture/index.json`` and its
    shards: ``aux`` [T, n_aux * H], ``final`` [T, H]). Returns per aux id and for the final state the relative L2
    error ``||q - b|| / ||b||`` over all tokens and the mean cosine similarity per token, plus the token count.

    Raises:
        ValueError: the two captures hold other tokens, ids or widths.
    """
    import torch
    from safetensors.torch import load_file

    def load(folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
        index = json.loads((folder / "index.json").read_text())
        shards = [load_file(str(folder / s["file"])) for s in index["shards"]]
        return index, {k: torch.cat([sh[k] for sh in shards]) for k in ("aux", "final", "input_ids")}

    qi, q = load(quantized)
    bi, b = load(bf16)
    if qi["aux_layer_ids"] != bi["aux_layer_ids"] or qi["hidden"] != bi["hidden"]:
        raise ValueError(f"captures of other ids or widths: {qi['aux_layer_ids']}/{qi['hidden']} vs "
                         f"{bi['aux_layer_ids']}/{bi['hidden']}")
    if not torch.equal(q["input_ids"], b["input_ids"]):
        raise ValueError("the two captures hold other tokens: capture the same samples.jsonl")
    hidden = qi["hidden"]
    parts = {f"aux {i}": (slice(n * hidden, (n + 1) * hidden), "aux") for n, i in enumerate(qi["aux_layer_ids"])}
    parts["final"] = (slice(None), "final")
    out = {"tokens": int(q["input_ids"].numel())}
    for name, (cols, key) in parts.items():
        a, r = q[key][:, cols].float(), b[key][:, cols].float()
        out[name] = {"relative_l2": round(float((a - r).norm() / r.norm()), 4),
                     "cosine_mean": round(float(torch.nn.functional.cosine_similarity(a, r, dim=-1).mean()), 4)}
    return out


def markdown(result: dict) -> list[str]:
    """``quantized_training.md``: the settings (and ``notes``, lines added to a result after its run), the capture
    comparison and the served τ table, the steps' times."""
    s = result["settings"]
    lines = [*header("A drafter trained against the quantized target", result["command"],
                     result["date"]),
             f"- hardware: {result['device']}", f"- vLLM: {result['vllm_version']}",
             f"- targets: {result['targets']}",
             (f"- per target {s['num_prompts']} answers of {s['max_tokens']} tokens (stdlib-corpus snippets); the "
              f"shipped drafter fine-tuned {s['epochs']} epochs, batch {s['batch']}, lr {s['lr']}; served τ: k = 3, "
              f"greedy, {s['eval_prompts']} held-out prompts x {s['eval_tokens']} tokens"),
             *(f"- note: {n}" for n in result.get("notes", [])), ""]
    cmp_ = result.get("capture_comparison")
    if cmp_:
        lines += [f"States of the {s['scheme']} target against the bf16 target's on the same {cmp_['tokens']} tokens:",
                  "", "| state | relative L2 error | mean cosine |", "|---|---|---|"]
        lines += [f"| {k} | {v['relative_l2']} | {v['cosine_mean']} |" for k, v in cmp_.items() if k != "tokens"]
        lines.append("")
    lines += ["| drafter | target | τ | per-position acceptance |", "|---|---|---|---|"]
    lines += [f"| {r['drafter']} | {r['target']} | {r['tau']} | {r['per_position']} |" for r in result["served"]]
    failed = {k: v for k, v in result["steps"].items() if v["rc"] != 0}
    if failed:
        lines += ["", "Steps that failed:", ""]
        lines += [f"- `{k}`: exit {v['rc']} (log `{v['log']}`)" for k, v in failed.items()]
    lines += ["", "Seconds per step: " + ", ".join(f"{k} {v['seconds']}" for k, v in result["steps"].items())]
    return lines
