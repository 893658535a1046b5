"""Synthetic EAGLE-3 drafters and targets mirroring the published formats.

Real dimensions (Kimi-K2: hidden 7168, target vocab 163840, draft vocab 32000,
61 layers) are written as *sparse* safetensors files: the header declares every
tensor at its real shape, the small vocabulary maps ``d2t`` / ``t2d`` hold real
values, and the big weights are holes of zeros that take no disk space.
Layout of a safetensors file (the format's specification): an 8-byte
little-endian header length, a JSON header mapping names to dtype, shape and
``data_offsets``, then the data.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

KIMI = {"hidden": 7168, "target_vocab": 163840, "draft_vocab": 32000, "layers": 61, "heads": 64, "kv_heads": 8,
        "head_dim": 128, "intermediate": 18432, "max_positions": 262144}
_SIZES = {"BF16": 2, "F32": 4, "I64": 8, "BOOL": 1}


def write_sparse_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], np.ndarray | None]]) -> None:
    """Write ``name -> (dtype, shape, values or None)``; None leaves a zero hole (sparse)."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, shape, _) in tensors.items():
        size = int(np.prod(shape)) * _SIZES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        base = 8 + len(raw)
        for name, (_, _, values) in tensors.items():
            if values is not None:
                fh.seek(base + header[name]["data_offsets"][0])
                fh.write(np.ascontiguousarray(values).tobytes())
        fh.truncate(base + offset)


def vocab_maps(draft_vocab: int, target_vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``d2t`` (int64 offsets: target id = draft id + d2t[draft id]) and ``t2d`` (bool mask) for a random subset."""
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(target_vocab, size=draft_vocab, replace=False)).astype(np.int64)
    d2t = chosen - np.arange(draft_vocab, dtype=np.int64)
    t2d = np.zeros(target_vocab, dtype=bool)
    t2d[chosen] = True
    return d2t, t2d


def llama_layer_tensors(prefix: str, dims: dict) -> dict:
    h, q, kv, inter = dims["hidden"], dims["heads"] * dims["head_dim"], dims["kv_heads"] * dims["head_dim"], \
        dims["intermediate"]
    return {
        f"{prefix}input_layernorm.weight": ("BF16", (h,), None),
        f"{prefix}hidden_norm.weight": ("BF16", (h,), None),
        f"{prefix}post_attention_layernorm.weight": ("BF16", (h,), None),
        f"{prefix}self_attn.q_proj.weight": ("BF16", (q, 2 * h), None),
        f"{prefix}self_attn.k_proj.weight": ("BF16", (kv, 2 * h), None),
        f"{prefix}self_attn.v_proj.weight": ("BF16", (kv, 2 * h), None),
        f"{prefix}self_attn.o_proj.weight": ("BF16", (h, q), None),
        f"{prefix}mlp.gate_proj.weight": ("BF16", (inter, h), None),
        f"{prefix}mlp.up_proj.weight": ("BF16", (inter, h), None),
        f"{prefix}mlp.down_proj.weight": ("BF16", (h, inter), None),
    }


def head_tensors(dims: dict, num_states: int = 3, d2t: np.ndarray | None = None,
                 t2d: np.ndarray | None = None) -> dict:
    h = dims["hidden"]
    if d2t is None:
        d2t, t2d = vocab_maps(dims["draft_vocab"], dims["target_vocab"])
    return {
        "fc.weight": ("BF16", (h, num_states * h), None),
        "norm.weight": ("BF16", (h,), None),
        "lm_head.weight": ("BF16", (dims["draft_vocab"], h), None),
        "d2t": ("I64", tuple(d2t.shape), d2t),
        "t2d": ("BOOL", tuple(t2d.shape), t2d),
    }


def llama_config(dims: dict, **extra) -> dict:
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": dims["hidden"],
        "intermediate_size": dims["intermediate"], "num_attention_heads": dims["heads"],
        "num_key_value_heads": dims["kv_heads"], "head_dim": dims["head_dim"], "num_hidden_layers": 1,
        "vocab_size": dims["target_vocab"], "draft_vocab_size": dims["draft_vocab"],
        "max_position_embeddings": dims["max_positions"], "rms_norm_eps": 1e-5, "rope_theta": 50000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "target_hidden_size": dims["hidden"], **extra,
    }


def write_drafter(path: Path, config: dict, tensors: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    write_sparse_safetensors(path / "model.safetensors", tensors)
    return path


def specforge_drafter(path: Path, ids: list[int] | None = (1, 29, 57), dims: dict = KIMI) -> Path:
    """EAGLE/SpecForge Llama-style: ids (if any) nested in ``eagle_config``."""
    extra = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": list(ids)}} if ids else {}
    return write_drafter(path, llama_config(dims, **extra), {**llama_layer_tensors("midlayer.", dims),
                                                             **head_tensors(dims)})


def toplevel_drafter(path: Path, ids: list[int] | None = (2, 30, 58), dims: dict = KIMI, **extra) -> Path:
    """Llama-style with vLLM-convention top-level ids (or none)."""
    ids_field = {"eagle_aux_hidden_state_layer_ids": list(ids)} if ids else {}
    return write_drafter(path, llama_config(dims, **ids_field, **extra), {**llama_layer_tensors("midlayer.", dims),
                                                                         **head_tensors(dims)})


def speculators_drafter(path: Path, ids: list[int] = (2, 30, 58), dims: dict = KIMI) -> Path:
    """speculators format: ``transformer_layer_config``, ``layers.0.*``, top-level ids."""
    layer = llama_config(dims)
    for key in ("architectures", "draft_vocab_size", "target_hidden_size"):
        layer.pop(key)
    config = {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.2.0",
        "transformer_layer_config": layer, "draft_vocab_size": dims["draft_vocab"],
        "target_hidden_size": dims["hidden"], "norm_before_residual": True,
        "eagle_aux_hidden_state_layer_ids": list(ids),
        "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                               "verifier": {"name_or_path": "moonshotai/Kimi-K2-Instruct",
                                            "architectures": ["DeepseekV3ForCausalLM"]}},
    }
    return write_drafter(path, config, {**llama_layer_tensors("layers.0.", dims), **head_tensors(dims)})


def modelopt_drafter(path: Path, ids: list[int] = (1, 29, 57), dims: dict = KIMI) -> Path:
    """NVIDIA modelopt export: nested ``eagle_config`` with modelopt keys, ``hf_quant_config.json``."""
    extra = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": list(ids), "use_aux_hidden_state": True,
                              "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True}}
    drafter = write_drafter(path, llama_config(dims, **extra), {**llama_layer_tensors("midlayer.", dims),
                                                                **head_tensors(dims)})
    (drafter / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}}))
    return drafter


def mla_drafter(path: Path, ids: list[int] | None = (2, 30, 58), dims: dict = KIMI,
                model_type: str = "kimi_k2") -> Path:
    """MLA-style (``Eagle3DeepseekV3ForCausalLM``): one DeepSeek-V3 attention layer (query LoRA rank
    ``dims["q_lora"]``, Kimi's 1536 when absent)."""
    h, q_lora = dims["hidden"], dims.get("q_lora", 1536)
    config = {
        "architectures": ["Eagle3DeepseekV3ForCausalLM"], "model_type": model_type, "hidden_size": h,
        "num_hidden_layers": 1, "num_attention_heads": dims["heads"], "num_key_value_heads": dims["heads"],
        "kv_lora_rank": 512, "q_lora_rank": dims.get("q_lora", 1536), "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
        "v_head_dim": 128, "intermediate_size": dims["intermediate"], "vocab_size": dims["target_vocab"],
        "draft_vocab_size": dims["draft_vocab"], "max_position_embeddings": dims["max_positions"],
        "rms_norm_eps": 1e-6, "target_hidden_size": h, "torch_dtype": "bfloat16",
    }
    if ids:
        config["eagle_aux_hidden_state_layer_ids"] = list(ids)
    p = "midlayer."
    tensors = {
        f"{p}self_attn.q_a_proj.weight": ("BF16", (q_lora, 2 * h), None),
        f"{p}self_attn.q_a_layernorm.weight": ("BF16", (q_lora,), None),
        f"{p}self_attn.q_b_proj.weight": ("BF16", (dims["heads"] * 192, q_lora), None),
        f"{p}self_attn.kv_a_proj_with_mqa.weight": ("BF16", (576, 2 * h), None),
        f"{p}self_attn.kv_a_layernorm.weight": ("BF16", (512,), None),
        f"{p}self_attn.kv_b_proj.weight": ("BF16", (dims["heads"] * 256, 512), None),
        f"{p}self_attn.o_proj.weight": ("BF16", (h, dims["heads"] * 128), None),
        **{k: v for k, v in llama_layer_tensors(p, dims).items() if "self_attn" not in k},
        **head_tensors(dims),
    }
    return write_drafter(path, config, tensors)


def kimi_target(path: Path, layers: int = KIMI["layers"], wrapper: bool = False, dims: dict = KIMI) -> Path:
    """A Kimi-K2 target config (or the Kimi-K2.5 multimodal wrapper around it); config only."""
    text = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "hidden_size": dims["hidden"],
            "num_hidden_layers": layers, "vocab_size": dims["target_vocab"], "kv_lora_rank": 512,
            "max_position_embeddings": dims["max_positions"]}
    config = text if not wrapper else {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
                                       "text_config": text, "media_placeholder_token_id": 163605}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


def tiny_llama_pair(root: Path, target_layers: int, drafter_config: dict | None = None,
                    hidden: int = 256, vocab: int = 4096, draft_vocab: int = 1024) -> tuple[Path, Path]:
    """A runnable Llama target and Llama-style EAGLE-3 drafter with random bf16 weights (needs torch).

    ``drafter_config`` entries are added to the drafter's config.json.
    """
    import torch
    from safetensors.torch import save_file

    heads, inter, head_dim = 4, 512, 64
    gen = torch.Generator().manual_seed(0)

    def lin(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    common = {"hidden_size": hidden, "intermediate_size": inter, "num_attention_heads": heads,
              "num_key_value_heads": heads, "head_dim": head_dim, "vocab_size": vocab,
              "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
              "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    target, drafter = root / "target", root / "drafter"
    target.mkdir(parents=True)
    drafter.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": target_layers,
        "bos_token_id": 1, "eos_token_id": 2, **common}))
    weights = {"model.embed_tokens.weight": lin(vocab, hidden), "model.norm.weight": ones(hidden),
               "lm_head.weight": lin(vocab, hidden)}
    for i in range(target_layers):
        p = f"model.layers.{i}."
        weights.update({
            p + "input_layernorm.weight": ones(hidden), p + "post_attention_layernorm.weight": ones(hidden),
            p + "self_attn.q_proj.weight": lin(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": lin(heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": lin(heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": lin(hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": lin(inter, hidden), p + "mlp.up_proj.weight": lin(inter, hidden),
            p + "mlp.down_proj.weight": lin(hidden, inter)})
    save_file(weights, str(target / "model.safetensors"))
    (drafter / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
        "draft_vocab_size": draft_vocab, "target_hidden_size": hidden, **common, **(drafter_config or {})}))
    d2t, t2d = vocab_maps(draft_vocab, vocab)
    p = "midlayer."
    save_file({
        "fc.weight": lin(hidden, 3 * hidden), "norm.weight": ones(hidden), "lm_head.weight": lin(draft_vocab, hidden),
        "d2t": torch.from_numpy(d2t), "t2d": torch.from_numpy(t2d),
        p + "input_layernorm.weight": ones(hidden), p + "hidden_norm.weight": ones(hidden),
        p + "post_attention_layernorm.weight": ones(hidden),
        p + "self_attn.q_proj.weight": lin(heads * head_dim, 2 * hidden),
        p + "self_attn.k_proj.weight": lin(heads * head_dim, 2 * hidden),
        p + "self_attn.v_proj.weight": lin(heads * head_dim, 2 * hidden),
        p + "self_attn.o_proj.weight": lin(hidden, heads * head_dim),
        p + "mlp.gate_proj.weight": lin(inter, hidden), p + "mlp.up_proj.weight": lin(inter, hidden),
        p + "mlp.down_proj.weight": lin(hidden, inter)}, str(drafter / "model.safetensors"))
    return target, drafter
