"""Which trained target to keep: its held-out loss and the quality of its greedy code.

A small target trained on more code generalises (lower held-out loss) but its greedy completions tend to end
in a loop; trained on little it memorises and never loops but is hard to predict. So several targets are
trained (``kimi models train-target`` with different ``--site-mb``), each records :func:`greedy_quality` in its
manifest, and ``kimi models pick-target`` keeps (:func:`pick_target`) the lowest held-out loss among those whose
completions clear :class:`QualityBar`. The selection prompts are held-out code too (:data:`SELECTION_PROMPTS`),
but not the ones ``benchmarks/acceptance.py`` measures, so the choice is not fitted to the recorded gates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kimi.errors import KimiError
from kimi.models.quality import distinct_n, loop_share

#: Prompts 17 to 32 of :func:`kimi.models.prompts.code_prompts` (other held-out files than the 16 that
#: ``benchmarks/acceptance.py`` serves).
SELECTION_PROMPTS = slice(16, 32)

#: New tokens per selection completion (as the acceptance benchmark's completions).
SELECTION_TOKENS = 64


@dataclass(frozen=True)
class QualityBar:
    """What a checkpoint's greedy completions must clear to be kept (the reference pair's gates, with a margin)."""

    max_loop_share: float = 0.125
    min_distinct_2: float = 0.55


def selection_prompt_ids(tokenizer) -> list[list[int]]:
    """The selection prompts as token ids of ``tokenizer`` (a ``tokenizers.Tokenizer``)."""
    from kimi.models.prompts import code_prompts

    prompts = code_prompts(SELECTION_PROMPTS.stop)[SELECTION_PROMPTS]
    return [enc.ids for enc in tokenizer.encode_batch(prompts)]


def greedy_completions(model, prompts: list[list[int]], max_new: int, pad_id: int) -> list[list[int]]:
    """Greedy continuations of ``prompts`` (token id lists) by a transformers causal LM, ``max_new`` tokens each.

    One left-padded batch through ``model.generate`` (an attention mask, positions counted from each prompt's
    first token), on the model's device, in eval mode and restored to the mode it had. Returns the new token ids
    per prompt, cut at ``max_new``.
    """
    import torch

    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new,
                                 min_new_tokens=max_new, do_sample=False, pad_token_id=pad_id)
    finally:
        model.train(was_training)
    return [row[width:width + max_new].tolist() for row in out.cpu()]


def greedy_quality(model, tokenizer, pad_id: int) -> dict:
    """Loop share and distinct-2 of ``model``'s greedy completions of the selection prompts (manifest field
    ``quality``)."""
    completions = greedy_completions(model, selection_prompt_ids(tokenizer), SELECTION_TOKENS, pad_id)
    return {"prompts": f"code_prompts[{SELECTION_PROMPTS.start}:{SELECTION_PROMPTS.stop}]",
            "tokens": SELECTION_TOKENS, "loop_share": round(loop_share(completions), 4),
            "distinct_2": round(distinct_n(completions), 4)}


def candidate_row(folder: Path, bar: QualityBar) -> dict:
    """One trained target's figures from its MANIFEST.json, and whether it clears ``bar``.

    Raises:
        KimiError: no manifest, or one without ``heldout_loss`` or ``quality`` (a target trained before them).
    """
    path = folder / "MANIFEST.json"
    try:
        manifest = json.loads(path.read_text())
        heldout = float(manifest["heldout_loss"])
        quality = {key: float(manifest["quality"][key]) for key in ("loop_share", "distinct_2")}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KimiError(f"{folder} is not a target trained with its quality recorded ({type(exc).__name__}: "
                        f"{exc}); train it with `kimi models train-target`") from None
    return {"target": str(folder), "site_bytes": manifest.get("training", {}).get("site_bytes", 0),
            "heldout_loss": heldout, "loop_share": quality["loop_share"], "distinct_2": quality["distinct_2"],
            "clears_bar": quality["loop_share"] <= bar.max_loop_share and quality["distinct_2"] >= bar.min_distinct_2}


def pick_target(candidates: list[Path], bar: QualityBar = QualityBar()) -> tuple[Path | None, list[dict]]:
    """The candidate with the lowest held-out loss among those clearing ``bar`` (None if none does), and every
    candidate's row (:func:`candidate_row`) in the order given."""
    rows = [candidate_row(folder, bar) for folder in candidates]
    cleared = [row for row in rows if row["clears_bar"]]
    best = min(cleared, key=lambda row: row["heldout_loss"]) if cleared else None
    return (Path(best["target"]) if best else None), rows
