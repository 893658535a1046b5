"""The Kimi-K2.5 multimodal wrapper of the reference target: same text model, small random vision tower.

Written in the layout of the released ``moonshotai/Kimi-K2.5`` checkpoint, which
vLLM (from the v0.26 line's release) loads as ``KimiK25ForConditionalGeneration``
(``model_executor/models/kimi_k25.py``, ``kimi_k25_vit.py``):

* ``config.json``: ``model_type: kimi_k25`` with ``text_config`` (``model_type:
  kimi_k2``, the reference target's DeepSeek-V3 fields), ``vision_config`` (MoonViT
  3-D tower + patch-merger projector) and ``media_placeholder_token_id``;
* tensors: the target's, each prefixed ``language_model.``
  (``language_model.model.layers.N...``, ``language_model.lm_head.weight``), plus
  ``vision_tower.patch_embed.*``, ``vision_tower.encoder.blocks.N.{wqkv,wo,norm0,norm1,
  mlp.fc0,mlp.fc1}.*``, ``vision_tower.encoder.final_layernorm.*`` and
  ``mm_projector.{pre_norm,proj.0,proj.2}.*``;
* ``preprocessor_config.json`` with the checkpoint's ``media_proc_cfg`` (read by
  vLLM's fused CPU image processor, which needs ``numba``);
* the target's tokenizer with its special token ``<|pad|>`` renamed ``<|media_pad|>``
  (same id; the real tokenizer's name for the image placeholder), so every text
  prompt tokenizes as for the target and vLLM finds the placeholder by name.

The vision config carries each size twice: under the released checkpoint's names
(``vt_hidden_size``, ``vt_num_hidden_layers``, ...) and under the names vLLM's
``KimiK25VisionConfig`` reads (``hidden_size``, ``num_hidden_layers``, ...); vLLM
ignores the ``vt_*`` names and would otherwise build its 1152-wide,
27-layer default tower.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kimi.models.tokenizer import SPECIAL_TOKENS

ARCHITECTURE = "KimiK25ForConditionalGeneration"
MEDIA_TOKEN = "<|media_pad|>"
REPLACED_TOKEN = SPECIAL_TOKENS[2]  # <|pad|>: a special token no text ever encodes to
TEXT_PREFIX = "language_model."


@dataclass(frozen=True)
class VisionSpec:
    """Dimensions of the vision tower and the image preprocessing.

    ``pos_emb`` equals the patch grid of an image at the patch limit
    (16 x 16 patches of 14 pixels: a 224 x 224 image, or vLLM's 3000 x 3000
    profiling image scaled down), so such images skip the tower's
    ``torch.compile``-d position-embedding interpolation.
    """

    hidden: int = 64
    layers: int = 2
    heads: int = 4
    intermediate: int = 128
    patch: int = 14
    merge: int = 2
    pos_emb: int = 16
    frames: int = 4
    patch_limit: int = 256

    @property
    def merged(self) -> int:
        """Width of one image token before the projector (merge x merge patches side by side)."""
        return self.hidden * self.merge * self.merge


def vision_config(vision: VisionSpec, text_hidden: int) -> dict:
    """``vision_config`` of the wrapper: the checkpoint's ``vt_*`` names and vLLM's names, same values."""
    sizes = {"hidden_size": vision.hidden, "intermediate_size": vision.intermediate,
             "num_attention_heads": vision.heads, "num_hidden_layers": vision.layers}
    return {
        "patch_size": vision.patch, "init_pos_emb_height": vision.pos_emb, "init_pos_emb_width": vision.pos_emb,
        "init_pos_emb_time": vision.frames, "pos_emb_type": "divided_fixed",
        "merge_kernel_size": [vision.merge, vision.merge], "merge_type": "sd2_tpool",
        "video_attn_type": "spatial_temporal", "mm_projector_type": "patchmerger",
        "mm_hidden_size": vision.hidden, "projector_hidden_act": "gelu", "projector_ln_eps": 1e-5,
        "text_hidden_size": text_hidden, **{f"vt_{k}": v for k, v in sizes.items()}, **sizes,
    }


def wrapper_config(text: dict, vision: VisionSpec, media_id: int) -> dict:
    """``config.json``: a ``kimi_k25`` config around ``text`` (the target's config.json as a dict)."""
    text_config = {**text, "model_type": "kimi_k2"}
    return {
        "architectures": [ARCHITECTURE], "model_type": "kimi_k25",
        "text_config": text_config, "vision_config": vision_config(vision, text["hidden_size"]),
        "media_placeholder_token_id": media_id, "ignore_index": -100,
        "bos_token_id": text["bos_token_id"], "eos_token_id": text["eos_token_id"],
        "pad_token_id": text["eos_token_id"], "use_unified_vision_chunk": True,
        "video_placeholder": "<|kimi_k25_video_placeholder|>", "tie_word_embeddings": False,
        "torch_dtype": text["torch_dtype"],
    }


def preprocessor_config(vision: VisionSpec) -> dict:
    """``preprocessor_config.json``: the checkpoint's ``media_proc_cfg`` with this tower's limits."""
    return {"media_proc_cfg": {
        "in_patch_limit": vision.patch_limit, "patch_size": vision.patch, "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5], "merge_kernel_size": vision.merge, "fixed_output_tokens": None,
        "patch_limit_on_one_side": vision.pos_emb * 2, "in_patch_limit_each_frame": vision.patch_limit,
        "in_patch_limit_video": None, "sample_fps": 2.0, "max_num_frames_each_video": None,
        "temporal_merge_kernel_size": vision.frames, "timestamp_mode": "hh:mm:ss.fff", "config_type": "image",
    }}


def text_weights(target: dict) -> dict:
    """The target's tensors under the checkpoint's names (``model.layers.0...`` -> ``language_model.model...``)."""
    return {TEXT_PREFIX + name: tensor for name, tensor in target.items()}


def _layer_norm(w, p: str, n: int) -> dict:
    torch = w.torch
    return {f"{p}.weight": w.norm(n), f"{p}.bias": torch.zeros(n, dtype=torch.bfloat16)}


def _linear(w, p: str, rows: int, cols: int) -> dict:
    torch = w.torch
    return {f"{p}.weight": w.matrix(rows, cols), f"{p}.bias": torch.zeros(rows, dtype=torch.bfloat16)}


def _vit_block(w, p: str, vision: VisionSpec) -> dict:
    d = vision.hidden
    return {**_layer_norm(w, f"{p}.norm0", d), **_linear(w, f"{p}.wqkv", 3 * d, d), **_linear(w, f"{p}.wo", d, d),
            **_layer_norm(w, f"{p}.norm1", d), **_linear(w, f"{p}.mlp.fc0", vision.intermediate, d),
            **_linear(w, f"{p}.mlp.fc1", d, vision.intermediate)}


def encoder_blocks(w, vision: VisionSpec) -> dict:
    """The tower's encoder blocks (``vision_tower.encoder.blocks.N.*``, bf16) from the weight source ``w``: its
    ``matrix(rows, cols)`` gives each linear weight, its ``norm(n)`` each layer-norm weight; biases are zero."""
    out: dict = {}
    for i in range(vision.layers):
        out.update(_vit_block(w, f"vision_tower.encoder.blocks.{i}", vision))
    return out


def vision_weights(w, vision: VisionSpec, text_hidden: int) -> dict:
    """Tower and projector tensors (bf16), named as in the checkpoint.

    Shapes: ``patch_embed.proj.weight`` [D, 3, P, P] (a P x P convolution),
    ``patch_embed.pos_emb.weight`` [G, G, D], ``wqkv`` [3D, D], ``mlp.fc0`` [I, D],
    ``mm_projector.proj.0`` [4D, 4D], ``mm_projector.proj.2`` [H, 4D] with D the
    tower width, G the position grid, I its MLP width, H the text hidden size.
    """
    d, p = vision.hidden, vision.patch
    out = {"vision_tower.patch_embed.proj.weight": w.matrix(d, 3 * p * p).reshape(d, 3, p, p),
           "vision_tower.patch_embed.proj.bias": w.torch.zeros(d, dtype=w.torch.bfloat16),
           "vision_tower.patch_embed.pos_emb.weight": w.matrix(vision.pos_emb**2, d).reshape(
               vision.pos_emb, vision.pos_emb, d)}
    out.update(encoder_blocks(w, vision))
    out.update(_layer_norm(w, "vision_tower.encoder.final_layernorm", d))
    out.update(_layer_norm(w, "mm_projector.pre_norm", d))
    out.update(_linear(w, "mm_projector.proj.0", vision.merged, vision.merged))
    out.update(_linear(w, "mm_projector.proj.2", text_hidden, vision.merged))
    return out


def media_tokenizer(tokenizer):
    """A copy of ``tokenizer`` (``tokenizers.Tokenizer``) whose ``<|pad|>`` is named ``<|media_pad|>``.

    Returns:
        (tokenizer, id of ``<|media_pad|>``): every other entry, merge and id unchanged.
    """
    from tokenizers import Tokenizer

    data = json.loads(tokenizer.to_str())
    media_id = data["model"]["vocab"].pop(REPLACED_TOKEN)
    data["model"]["vocab"][MEDIA_TOKEN] = media_id
    for entry in data["added_tokens"]:
        if entry["content"] == REPLACED_TOKEN:
            entry["content"] = MEDIA_TOKEN
    return Tokenizer.from_str(json.dumps(data)), media_id
