"""A Kimi-K2-dimension slice: the 61-layer target's shapes in a few layers, for speed measurements.

Writes config-only model folders (no weights, no tokenizer) that vLLM serves with ``load_format="dummy"``
(random weights drawn on the device, ``vllm/model_executor/model_loader/dummy_loader.py``) and
``skip_tokenizer_init=True`` (prompts as token ids):

* ``target-L{n}/``: ``DeepseekV3ForCausalLM`` with Kimi-K2's dimensions (moonshotai/Kimi-K2-Instruct
  ``config.json``: hidden 7168, 64 MLA heads, q_lora_rank 1536, kv_lora_rank 512, head dims 128 + 64 rope,
  value 128, dense intermediate 18432, 384 routed experts of 2048 with top-8 and one shared expert,
  vocabulary 163840, first layer dense) and ``n`` layers instead of 61, unquantized bf16 (Kimi-K2 ships
  block-FP8), default RoPE (Kimi-K2 uses YaRN; the kernels are the same);
* ``drafter/``: a Llama-style EAGLE-3 drafter 7168 wide (``LlamaForCausalLMEagle3``: one layer, 64 query and
  8 KV heads of 128, intermediate 18432) with a 32000-token draft vocabulary over the 163840 target ids,
  reading three aux hidden states. The dummy loader leaves integer tensors at their initial zeros, so its
  ``d2t`` maps draft id ``i`` to target id ``i``.

Random weights accept about nothing: the slice measures step times (target, verification, draft), not
acceptance. One MoE layer is 384 x 3 x 7168 x 2048 bf16 weights (33.8 GB): ``target-L4`` (one dense and three
MoE layers) needs about 107 GB of device memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kimi.drafter.conventions import CONVENTION_FIELD, IDS_FIELD, LAYER_INPUT
from kimi.fork.fsutil import write_atomic

#: Layers of the full Kimi-K2 / K2.5 text model (the first dense, 60 MoE).
FULL_LAYERS = 61


@dataclass(frozen=True)
class SliceDims:
    """Dimensions of the slice; the defaults are Kimi-K2's."""

    hidden: int = 7168
    heads: int = 64
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    intermediate: int = 18432
    moe_intermediate: int = 2048
    experts: int = 384
    experts_per_token: int = 8
    vocab: int = 163840
    draft_vocab: int = 32000
    draft_heads: int = 64
    draft_kv_heads: int = 8
    max_positions: int = 4096


#: Same structure, small enough for a CPU run of the benchmark's own logic.
TINY = SliceDims(hidden=256, heads=4, q_lora_rank=64, qk_nope_head_dim=32,
                 v_head_dim=32, intermediate=512, moe_intermediate=64, experts=16, experts_per_token=4, vocab=8192,
                 draft_vocab=2048, draft_heads=4, draft_kv_heads=2)


#: Depth of the slice served with EAGLE-3 (one dense and three MoE layers, about 107 GB in bf16): the
#: drafter reads the inputs of layers 1, 2 and 3. Id 0 (the embedding output) would crash upstream 0.26.0's
#: DeepSeek-V3 forward (``hidden_states + residual`` with no residual yet; fixed in the fork by patch 0010),
#: and upstream runs the same drafter.
SPEC_LAYERS = 4


def aux_ids(layers: int) -> list[int]:
    """Three distinct aux layer ids >= 1 (vLLM's ``layer_input`` convention) for a ``layers``-deep slice:
    vLLM's default ``(2, L // 2, L - 3)`` collides below 6 layers, so the slice takes the last three inputs.

    Raises:
        ValueError: fewer than 4 layers.
    """
    if layers < 4:
        raise ValueError(f"a Kimi slice for EAGLE-3 needs at least 4 layers (got {layers}): the drafter reads "
                         "3 layer inputs other than the embedding output")
    return [layers - 3, layers - 2, layers - 1]


def target_config(layers: int, dims: SliceDims = SliceDims()) -> dict:
    """``config.json`` of the slice's target with ``layers`` decoder layers (the first one dense)."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": dims.hidden, "num_hidden_layers": layers, "num_attention_heads": dims.heads,
        "num_key_value_heads": dims.heads, "q_lora_rank": dims.q_lora_rank, "kv_lora_rank": dims.kv_lora_rank,
        "qk_nope_head_dim": dims.qk_nope_head_dim, "qk_rope_head_dim": dims.qk_rope_head_dim,
        "v_head_dim": dims.v_head_dim, "intermediate_size": dims.intermediate,
        "moe_intermediate_size": dims.moe_intermediate, "n_routed_experts": dims.experts, "n_shared_experts": 1,
        "num_experts_per_tok": dims.experts_per_token, "n_group": 1, "topk_group": 1,
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "routed_scaling_factor": 2.827,
        "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True,
        "vocab_size": dims.vocab, "max_position_embeddings": dims.max_positions, "rope_theta": 50000.0,
        "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False,
        "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16",
    }


def drafter_config(layers: int, dims: SliceDims = SliceDims()) -> dict:
    """``config.json`` of the slice's Llama-style EAGLE-3 drafter for a ``layers``-deep target."""
    ids = aux_ids(layers)
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
        "hidden_size": dims.hidden, "target_hidden_size": dims.hidden, "num_attention_heads": dims.draft_heads,
        "num_key_value_heads": dims.draft_kv_heads, "head_dim": dims.hidden // dims.draft_heads,
        "intermediate_size": dims.intermediate, "vocab_size": dims.vocab, "draft_vocab_size": dims.draft_vocab,
        "max_position_embeddings": dims.max_positions, "rms_norm_eps": 1e-6, "rope_theta": 50000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        IDS_FIELD: ids, CONVENTION_FIELD: LAYER_INPUT, "num_aux_hidden_states": len(ids),
    }


def write_slice(out: Path, layers: tuple[int, ...] = (SPEC_LAYERS,), drafter_layers: int = SPEC_LAYERS,
                dims: SliceDims = SliceDims()) -> dict[str, str]:
    """Write ``out/target-L{n}/config.json`` for each ``n`` in ``layers`` and ``out/drafter/config.json`` (for a
    ``drafter_layers``-deep target); existing files are replaced atomically. Returns ``{name: folder}``.

    Raises:
        ValueError: ``drafter_layers`` below 4 (see :func:`aux_ids`) or a layer count below 1.
    """
    if min(layers) < 1:
        raise ValueError(f"layer counts must be >= 1, got {layers}")
    folders: dict[str, str] = {}
    configs = {f"target-L{n}": target_config(n, dims) for n in layers}
    configs["drafter"] = drafter_config(drafter_layers, dims)
    for name, config in configs.items():
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / "config.json", json.dumps(config, indent=2) + "\n")
        folders[name] = str(folder)
    return folders
