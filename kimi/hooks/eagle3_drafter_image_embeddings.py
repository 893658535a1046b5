"""Hook of patch ``eagle3-drafter-image-embeddings``: EAGLE-3 drafters read the target's image embeddings at image
positions; the logic is :mod:`kimi.spec.drafter_images`."""

from __future__ import annotations

from typing import Any


def take_target_embeddings(drafter: Any, vllm_config: Any, *, target_supports_mm: bool | None = None) -> bool:
    """Called by the speculator right after the drafter is built, before it decides whether to pass multimodal
    embeddings to it; see :func:`kimi.spec.drafter_images.take_target_embeddings`."""
    from kimi.spec.drafter_images import take_target_embeddings as take

    return take(drafter, vllm_config, target_supports_mm=target_supports_mm)
