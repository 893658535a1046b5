"""The target's input embedding and LM head, read from its safetensors without loading the model."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def target_head(target: str) -> dict[str, torch.Tensor]:
    """{"embed": [vocab, H], "lm_head": [vocab, H]} (float32) from ``target``'s (possibly sharded) files.

    Names are found by suffix (``embed_tokens.weight``, ``lm_head.weight``), so a multimodal wrapper's
    ``language_model.`` prefix is fine. The drafter shares the embedding (vLLM does too when the
    drafter ships none) and scores against the LM head.
    """
    from safetensors import safe_open

    folder = Path(target)
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else [
        "model.safetensors"]
    found: dict[str, torch.Tensor] = {}
    for name in files:
        with safe_open(str(folder / name), "pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                for short, suffix in (("embed", "embed_tokens.weight"), ("lm_head", "lm_head.weight")):
                    if key.endswith(suffix) and "vision" not in key and short not in found:
                        found[short] = f.get_tensor(key).float()
    missing = {"embed", "lm_head"} - set(found)
    if missing:
        raise KeyError(f"{target}: no {' or '.join(sorted(missing))} tensor found")
    return found
