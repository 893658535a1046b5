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
from dataclasses import replace
from pathlib import Path

from kimi.fork.fsutil import write_atomic
from kimi.models.reference import ReferenceSpec, drafter_common, target_config

#: Layers of the full Kimi-K2 / K2.5 text model (the first dense, 60 MoE).
FULL_LAYERS = 61

#: Kimi-K2's dimensions in the reference models' spec (``layers`` is set per slice).
KIMI = ReferenceSpec(hidden=7168, heads=64, q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64,
                     qk_nope_head_dim=128, v_head_dim=128, intermediate=18432, moe_intermediate=2048, experts=384,
                     shared_experts=1, experts_per_token=8, groups=1, topk_groups=1, vocab=163840,
                     draft_vocab=32000)
#: The same structure, small enough for a CPU run of the benchmark's own logic.
TINY = replace(KIMI, hidden=256, heads=4, q_lora_rank=64, qk_nope_head_dim=32, v_head_dim=32, intermediate=512,
               moe_intermediate=64, experts=16, experts_per_token=4, vocab=8192, draft_vocab=2048)
#: Fields of Kimi-K2's config that the reference target writes otherwise.
KIMI_FIELDS = {"routed_scaling_factor": 2.827, "rope_theta": 50000.0}

#: Depth of the slice served with EAGLE-3 (one dense and three MoE layers, about 107 GB in bf16): the
#: drafter reads the inputs of layers 1, 2 and 3. Id 0 (the embedding output) would crash the v0.26 line's
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


def slice_target_config(layers: int, dims: ReferenceSpec = KIMI) -> dict:
    """``config.json`` of the slice's target with ``layers`` decoder layers (the first one dense)."""
    return {**target_config(replace(dims, layers=layers), bos=0, eos=1), **KIMI_FIELDS}


def drafter_config(layers: int, dims: ReferenceSpec = KIMI) -> dict:
    """``config.json`` of the slice's Llama-style EAGLE-3 drafter for a ``layers``-deep target: the target's
    query-head count, an eighth of it as KV heads (64 and 8 at Kimi's width), one layer."""
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
            **drafter_common(dims, tuple(aux_ids(layers))), "rope_theta": KIMI_FIELDS["rope_theta"],
            "num_attention_heads": dims.heads, "num_key_value_heads": max(1, dims.heads // 8),
            "head_dim": dims.hidden // dims.heads, "intermediate_size": dims.intermediate}


def write_slice(out: Path, layers: tuple[int, ...] = (SPEC_LAYERS,), drafter_layers: int = SPEC_LAYERS,
                dims: ReferenceSpec = KIMI) -> dict[str, str]:
    """Write ``out/target-L{n}/config.json`` for each ``n`` in ``layers`` and ``out/drafter/config.json`` (for a
    ``drafter_layers``-deep target); existing files are replaced atomically. Returns ``{name: folder}``.

    Raises:
        ValueError: ``drafter_layers`` below 4 (see :func:`aux_ids`) or a layer count below 1.
    """
    if min(layers) < 1:
        raise ValueError(f"layer counts must be >= 1, got {layers}")
    folders: dict[str, str] = {}
    configs = {f"target-L{n}": slice_target_config(n, dims) for n in layers}
    configs["drafter"] = drafter_config(drafter_layers, dims)
    for name, config in configs.items():
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / "config.json", json.dumps(config, indent=2) + "\n")
        folders[name] = str(folder)
    return folders
