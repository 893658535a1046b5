"""Stage e, export: a vLLM-ready ``LlamaForCausalLMEagle3`` drafter folder from the training checkpoint.

``config.json`` names the aux layer ids the states were captured at, top-level, with their convention
stated (``eagle_aux_hidden_state_layer_ids`` + ``..._convention: layer_input``, the fields
:mod:`kimi.drafter.conventions` reads and the fork's ``vllm serve`` checks), so training and serving use
the same layers. ``model.safetensors`` holds ``fc``, ``midlayer.*``, ``norm``, ``lm_head`` (bf16), ``d2t``
(int64) and ``t2d`` (bool); no ``embed_tokens`` - vLLM shares the target's, as in training.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from kimi.drafter.conventions import CONVENTION_FIELD, IDS_FIELD, LAYER_INPUT
from kimi.errors import KimiError
from kimi.fork.fsutil import check_replaceable, staged_folder, write_atomic
from kimi.train.engine import say


def drafter_config(shape: dict, ids: list[int], max_positions: int) -> dict:
    """The drafter's ``config.json`` (Llama-style EAGLE-3, explicit ids in vLLM's convention)."""
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
            "hidden_size": shape["hidden"], "target_hidden_size": shape["target_hidden"],
            "vocab_size": shape["vocab"], "draft_vocab_size": shape["draft_vocab"],
            "num_attention_heads": shape["heads"], "num_key_value_heads": shape["heads"],
            "head_dim": shape["head_dim"], "intermediate_size": shape["intermediate"],
            "max_position_embeddings": max_positions, "rms_norm_eps": shape["eps"], "rope_theta": shape["rope_theta"],
            "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            IDS_FIELD: list(ids), CONVENTION_FIELD: LAYER_INPUT, "num_aux_hidden_states": len(ids)}


def export(work: Path, out: Path, target: str, force: bool = False) -> Path:
    """Write ``out`` from ``work/train/checkpoint.pt`` and ``work/vocab.safetensors`` (atomically).

    Raises:
        KimiError: ``out`` exists (without ``force``) or is not an earlier export (its config.json names no aux
            layer ids with their convention: a target, another checkpoint), or there is no checkpoint.
    """
    from safetensors.torch import load_file, save_file

    check_replaceable(out, "config.json", force, keep=(Path.cwd(),), marker_keys=(IDS_FIELD, CONVENTION_FIELD))
    ckpt = work / "train" / "checkpoint.pt"
    if not ckpt.is_file():
        raise KimiError(f"no {ckpt}: run `kimi train train` first")
    state = torch.load(ckpt, weights_only=False, map_location="cpu")
    vocab = load_file(str(work / "vocab.safetensors"))
    meta = state["meta"]
    config = json.loads((Path(target) / "config.json").read_text())
    max_positions = int(config.get("text_config", config)["max_position_embeddings"])
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in state["model"].items()}
    tensors.update({"d2t": vocab["d2t"].to(torch.int64), "t2d": vocab["t2d"].to(torch.bool)})
    with staged_folder(out) as staging:
        write_atomic(staging / "config.json", json.dumps(drafter_config(meta["shape"], meta["aux_layer_ids"],
                                                                        max_positions), indent=2) + "\n")
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        write_atomic(staging / "training.json", json.dumps(
            {"step": state["step"], **{k: meta[k] for k in ("options", "target", "total_steps")}}, indent=2) + "\n")
    say(f"export: wrote {out} (aux layer ids {meta['aux_layer_ids']}, {LAYER_INPUT})")
    return out


def shifted_ids(ids: list[int], num_layers: int) -> list[int]:
    """The wiring guard's wrong ids: every id shifted up by one, or down by one where the top id has no layer
    above (``num_layers - 1``) - the same drafter fed its neighbours' states must lose acceptance.

    Raises:
        KimiError: no shift by one in either direction stays inside layers ``1 .. num_layers - 1`` (layer 0's
            input has no residual yet; vLLM's DeepSeek-V3 cannot capture it).
    """
    if max(ids) + 1 < num_layers:
        return [i + 1 for i in ids]
    if min(ids) - 1 >= 1:
        return [i - 1 for i in ids]
    raise KimiError(f"aux ids {list(ids)} cannot be shifted by one inside layers 1..{num_layers - 1}")


def with_ids(drafter: Path, ids: list[int], dest: Path) -> Path:
    """A copy of ``drafter`` (weights linked) whose config names other aux ids: the wiring check's control."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in drafter.iterdir():
        if f.name != "config.json" and not (dest / f.name).exists():
            os.symlink(f.resolve(), dest / f.name)
    config = json.loads((drafter / "config.json").read_text())
    config[IDS_FIELD] = list(ids)
    write_atomic(dest / "config.json", json.dumps(config, indent=2) + "\n")
    return dest
