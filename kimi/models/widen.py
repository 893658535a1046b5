"""A trained pair made wider without changing what it computes: block-FP8 needs whole 128-wide blocks.

vLLM (the v0.32 line's release) serves block-FP8 DeepSeek-V3 checkpoints on a GPU with CUTLASS or DeepGEMM (128 x 128
blocks) and on an AMX CPU with its block GEMM (``[32n, 128]``); the activations are quantized in whole groups of
``block_k`` along every input width. The shipped pair's 192-wide residual stream, 64-wide ``q_lora_rank`` and 48-wide
experts allow blocks of 16 at most, which no kernel takes (``kimi.models.quantize.fp8_gpu_refusal``).
:func:`widen_pair` pads those widths with zeros to multiples of 128, so the widened pair computes what the shipped one
does:

* every weight gets zero rows for padded outputs and zero columns for padded inputs, so the padded coordinates of
  every activation stay 0 (the embedding's padded columns are 0, every projection into a padded width writes 0,
  SiLU(0) * 0 = 0, the router's padded columns add nothing);
* an RMSNorm over a padded width divides by the root of a mean over more coordinates, ``n_new / n_old`` times
  smaller: its weight is multiplied by ``sqrt(n_old / n_new)``. A width under a norm is therefore padded to
  ``4^j`` times itself (:func:`normed`: 192 -> 768, 64 -> 256), so that factor is a power of two and the bf16 weights
  stay exact; the output is then the old one but for the ``eps``, now effectively ``eps * n_new / n_old``
  (rescaling by 0.866 instead, for 192 -> 256, moved the logits by up to 0.08 through bf16 rounding);
* the EAGLE-3 drafter is padded the same way: its ``fc`` reads the aux states per aux layer (each block of
  ``target_hidden`` columns padded), its attention reads ``[embedding, hidden]`` (each half padded), its own width
  follows the target's (it embeds with the target's table).

The widened pair is a reference for quantized serving only: its bf16 greedy output and τ equal the shipped pair's
up to floating-point order (benchmarks/results/quantized.md says what was measured).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from kimi.errors import KimiError
from kimi.fork.fsutil import check_replaceable, default_mode, sha256_file, staged_folder, write_atomic
from kimi.log import sayer
from kimi.models import OUTPUT_KEYS
from kimi.models.shipped import check_pair, pair_digests
from kimi.models.tokenizer import copy_tokenizer_files

#: Widths are padded to a multiple of this (the published block-FP8 block).
MULTIPLE = 128

# Target tensors by role: (regex, dims -> width name). Width names: "hidden", "q_lora", "moe".
_TARGET = [
    (r"(model\.embed_tokens|lm_head)\.weight", {1: "hidden"}),
    (r"model\.(norm|layers\.\d+\.(input_layernorm|post_attention_layernorm))\.weight", {0: "hidden"}),
    (r"model\.layers\.\d+\.self_attn\.q_a_proj\.weight", {0: "q_lora", 1: "hidden"}),
    (r"model\.layers\.\d+\.self_attn\.q_a_layernorm\.weight", {0: "q_lora"}),
    (r"model\.layers\.\d+\.self_attn\.q_b_proj\.weight", {1: "q_lora"}),
    (r"model\.layers\.\d+\.self_attn\.kv_a_proj_with_mqa\.weight", {1: "hidden"}),
    (r"model\.layers\.\d+\.self_attn\.(kv_a_layernorm|kv_b_proj)\.weight", {}),
    (r"model\.layers\.\d+\.self_attn\.o_proj\.weight", {0: "hidden"}),
    (r"model\.layers\.\d+\.mlp\.(gate_proj|up_proj)\.weight", {1: "hidden"}),
    (r"model\.layers\.\d+\.mlp\.down_proj\.weight", {0: "hidden"}),
    (r"model\.layers\.\d+\.mlp\.gate\.weight", {1: "hidden"}),
    (r"model\.layers\.\d+\.mlp\.gate\.e_score_correction_bias", {}),
    (r"model\.layers\.\d+\.mlp\.(experts\.\d+|shared_experts)\.(gate_proj|up_proj)\.weight", {0: "moe", 1: "hidden"}),
    (r"model\.layers\.\d+\.mlp\.(experts\.\d+|shared_experts)\.down_proj\.weight", {0: "hidden", 1: "moe"}),
]
# Drafter (Llama-style EAGLE-3) tensors: "hidden" is the drafter's width (= the target's); "aux" is the fc input
# (num_aux blocks of the target's width); "cat" the attention input ([embedding, hidden], two blocks).
_DRAFTER = [
    (r"(norm|midlayer\.(hidden_norm|input_layernorm|post_attention_layernorm))\.weight", {0: "hidden"}),
    (r"fc\.weight", {0: "hidden", 1: "aux"}),
    (r"midlayer\.self_attn\.(q_proj|k_proj|v_proj)\.weight", {1: "cat"}),
    (r"midlayer\.self_attn\.o_proj\.weight", {0: "hidden"}),
    (r"midlayer\.mlp\.(gate_proj|up_proj)\.weight", {1: "hidden"}),
    (r"midlayer\.mlp\.down_proj\.weight", {0: "hidden"}),
    (r"lm_head\.weight", {1: "hidden"}),
    (r"(d2t|t2d)", {}),
]


def padded(width: int) -> int:
    """``width`` rounded up to a multiple of :data:`MULTIPLE`."""
    return -(-width // MULTIPLE) * MULTIPLE


def normed(width: int) -> int:
    """The smallest ``width * 4^j`` (j >= 0) that is a multiple of :data:`MULTIPLE`: a width an RMSNorm runs over,
    whose weight then scales by ``2^-j``, exact in bf16."""
    new = width
    while new % MULTIPLE:
        new *= 4
    return new


def _pad(tensor, dims: dict[int, tuple[int, int, int]]):
    """``tensor`` with each dim in ``dims`` (dim -> (old block width, new block width, blocks)) split into its
    blocks and each block zero-padded at its end to the new width."""
    import torch

    out = tensor
    for dim, (old, new, blocks) in dims.items():
        if out.shape[dim] != old * blocks:
            raise KimiError(f"a tensor of shape {list(tensor.shape)} has {out.shape[dim]} along dim {dim}, not "
                            f"{blocks} x {old}: not the layout this widening knows")
        parts = out.split(old, dim=dim)
        shape = list(out.shape)
        shape[dim] = new - old
        zeros = torch.zeros(shape, dtype=out.dtype)
        out = torch.cat([t for p in parts for t in (p, zeros)], dim=dim)
    return out


def _widen(tensors: dict, rules: list, widths: dict[str, tuple[int, int, int]]) -> dict:
    """Every tensor padded by the first rule its name matches; norms over a padded width rescaled (the 1-D tensors a
    rule pads are the RMSNorm weights: the router's bias and ``d2t`` / ``t2d`` keep their widths)."""
    out = {}
    for name, tensor in tensors.items():
        rule = next((dims for pattern, dims in rules if re.fullmatch(pattern, name)), None)
        if rule is None:
            raise KimiError(f"widen: tensor {name} {list(tensor.shape)} has no rule: not a pair this widening knows")
        dims = {d: widths[w] for d, w in rule.items() if widths[w][0] != widths[w][1]}
        value = _pad(tensor, dims)
        if tensor.dim() == 1 and dims:
            old, new, _ = dims[0]
            value = (value.float() * math.sqrt(old / new)).to(tensor.dtype)
        out[name] = value
    return out


def widths_of(target_cfg: dict, drafter_cfg: dict) -> tuple[dict, dict]:
    """The (old, new, blocks) of each width name, for the target's tensors and for the drafter's."""
    hidden = target_cfg["hidden_size"]
    q_lora, moe = target_cfg["q_lora_rank"], target_cfg["moe_intermediate_size"]
    target = {"hidden": (hidden, normed(hidden), 1), "q_lora": (q_lora, normed(q_lora), 1),
              "moe": (moe, padded(moe), 1)}
    if drafter_cfg["hidden_size"] != hidden or drafter_cfg.get("target_hidden_size", hidden) != hidden:
        raise KimiError("widen: the drafter's hidden_size / target_hidden_size differ from the target's hidden_size")
    aux = len(drafter_cfg["eagle_aux_hidden_state_layer_ids"])
    drafter = {"hidden": target["hidden"], "aux": (*target["hidden"][:2], aux), "cat": (*target["hidden"][:2], 2)}
    return target, drafter


def widen_pair(source: Path, out: Path, force: bool = False) -> dict:
    """Write ``source`` (a pair folder: ``target/`` DeepSeek-V3 bf16, ``drafter/`` Llama-style EAGLE-3) widened to
    multiples of :data:`MULTIPLE` (see the module docstring) into ``out``, with configs, tokenizer files and a
    ``MANIFEST.json`` (``widened_from``: the source's manifest digest and the widths; ``files``: sha256s).
    Written whole or not at all. Returns the manifest.

    Raises:
        KimiError: ``source`` is not a complete pair, its drafter is not Llama-style EAGLE-3 or not as wide as the
            target, a tensor has a name or shape this widening does not know, or ``out`` may not be replaced
            (``source`` itself, a folder holding it or inside it, or not an earlier widened pair:
            ``OUTPUT_KEYS["widen"]``).
    """
    from safetensors.torch import load_file, save_file

    check_pair(source)
    target_cfg = json.loads((source / "target" / "config.json").read_text())
    drafter_cfg = json.loads((source / "drafter" / "config.json").read_text())
    if drafter_cfg.get("architectures") != ["LlamaForCausalLMEagle3"]:
        raise KimiError(f"widen: {source}/drafter is {drafter_cfg.get('architectures')}, not a Llama-style EAGLE-3 "
                        "drafter")
    check_replaceable(out, "MANIFEST.json", force, keep=(Path.cwd(),), inputs=(source,),
                      marker_keys=OUTPUT_KEYS["widen"])
    t_widths, d_widths = widths_of(target_cfg, drafter_cfg)
    say = sayer("models")
    say(f"widening {source}: " + ", ".join(f"{k} {o} -> {n}" for k, (o, n, _) in t_widths.items()))
    target = _widen(load_file(source / "target" / "model.safetensors"), _TARGET, t_widths)
    drafter = _widen(load_file(source / "drafter" / "model.safetensors"), _DRAFTER, d_widths)
    hidden = t_widths["hidden"][1]
    configs = {"target": {**target_cfg, "hidden_size": hidden, "q_lora_rank": t_widths["q_lora"][1],
                          "moe_intermediate_size": t_widths["moe"][1]},
               "drafter": {**drafter_cfg, "hidden_size": hidden, "target_hidden_size": hidden}}
    with staged_folder(out) as staging:
        for part, tensors in (("target", target), ("drafter", drafter)):
            (staging / part).mkdir()
            save_file(tensors, staging / part / "model.safetensors", metadata={"format": "pt"})
            (staging / part / "model.safetensors").chmod(default_mode())
            write_atomic(staging / part / "config.json", json.dumps(configs[part], indent=2) + "\n")
        copy_tokenizer_files(source / "target", staging / "target")
        manifest = {"widened_from": {"pair": str(source), "manifest_sha256": sha256_file(source / "MANIFEST.json"),
                                     "widths": {k: [o, n] for k, (o, n, _) in t_widths.items()}},
                    "aux_layer_ids": drafter_cfg["eagle_aux_hidden_state_layer_ids"],
                    "files": pair_digests(staging)}
        write_atomic(staging / "MANIFEST.json", json.dumps(manifest, indent=2) + "\n")
    say(f"wrote {out}")
    return manifest
