"""Which model runner a DeepSeek-V3 target with an EAGLE-3 drafter takes (patch
``0013-eagle3-deepseek-v3-model-runner-v2``, the v0.26 line; the v0.32 line's vLLM takes V2 for every model itself).

``VllmConfig._is_default_v2_model_runner_model`` asks :func:`takes_v2` first.  V2 captures the drafting loop
(forward, logits, sampling) in CUDA graphs, where V1 runs each draft step as PIECEWISE graphs plus Python
(vLLM RFC 45258).  MLA drafters (Kimi-K2 style) stay on upstream's choice until measured on V2.
"""

from __future__ import annotations

from typing import Any

#: Targets that take V2 with a non-MLA EAGLE-3 drafter; DeepSeek-V3 shares DeepseekV2ForCausalLM's code.
ARCHITECTURES = frozenset({"DeepseekV3ForCausalLM"})


def takes_v2(vllm_config: Any) -> bool:
    """True when ``vllm_config`` serves a target of :data:`ARCHITECTURES` with an EAGLE-3 drafter whose
    attention is not MLA; False leaves the choice to upstream's rules (which may still pick V2)."""
    spec = vllm_config.speculative_config
    architectures = getattr(vllm_config.model_config, "architectures", None) or []
    return (
        spec is not None
        and spec.method == "eagle3"
        and spec.draft_model_config is not None
        and not spec.draft_model_config.use_mla
        and any(a in ARCHITECTURES for a in architectures)
    )
