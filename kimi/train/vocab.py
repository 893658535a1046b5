"""Stage c, vocab: the draft vocabulary = the most frequent response tokens (loss mask 1) of the samples.

Writes ``vocab.safetensors``: ``d2t`` int64 [draft_vocab] (target id = draft id + d2t[draft id]), ``t2d``
bool [vocab] and the ``counts`` int64 [vocab] they came from (ties broken by id, as the reference
models do: :func:`kimi.models.reference.draft_vocabulary`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kimi.errors import KimiError
from kimi.models.reference import draft_vocabulary
from kimi.train.engine import say
from kimi.train.store import read_samples, write_shard


def masked_counts(samples: list[dict], vocab: int) -> np.ndarray:
    """int64 [vocab]: occurrences of each token where the loss mask is 1."""
    counts = np.zeros(vocab, dtype=np.int64)
    for sample in samples:
        ids, mask = np.asarray(sample["input_ids"], dtype=np.int64), np.asarray(sample["loss_mask"], dtype=bool)
        counts += np.bincount(ids[mask], minlength=vocab)[:vocab]
    return counts


def build_vocab(work: Path, vocab: int, draft_vocab: int) -> dict:
    """Write ``work/vocab.safetensors``; returns {"draft_vocab", "coverage": share of masked tokens covered}."""
    import torch

    samples = read_samples(work / "samples.jsonl")
    if not samples:
        raise KimiError(f"no samples in {work / 'samples.jsonl'}: run `kimi train regenerate` first")
    if not 0 < draft_vocab <= vocab:
        raise KimiError(f"--draft-vocab must be in 1..{vocab}, not {draft_vocab}")
    counts = masked_counts(samples, vocab)
    d2t, t2d = draft_vocabulary(counts, draft_vocab)
    coverage = float(counts[t2d].sum() / max(1, counts.sum()))
    write_shard(work / "vocab.safetensors", {"d2t": torch.from_numpy(d2t), "t2d": torch.from_numpy(t2d),
                                             "counts": torch.from_numpy(counts)})
    say(f"vocab: {draft_vocab} of {vocab} tokens cover {coverage:.1%} of {int(counts.sum())} response tokens")
    return {"draft_vocab": draft_vocab, "coverage": coverage}
