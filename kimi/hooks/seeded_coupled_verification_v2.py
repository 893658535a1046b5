"""Hook of patch ``seeded-coupled-verification-v2``: seeded requests verified by coupling on the V2 model runner;
the logic is :mod:`kimi.spec.coupled_v2` (the mode: :mod:`kimi.spec.seeded_mode`)."""

from __future__ import annotations

from typing import Any


def check_mode() -> None:
    """Called when the rejection sampler is built: :func:`kimi.spec.seeded_mode.check_mode`."""
    from kimi.spec.seeded_mode import check_mode as check

    check()


def coupled_requests_v2(seeds_set: Any, temperature: Any, idx_mapping_np: Any, has_draft_logits: bool,
                        synthetic: bool, watermark: bool) -> Any:
    """Which requests of a verification chunk are coupled: :func:`kimi.spec.coupled_v2.coupled_requests_v2`."""
    from kimi.spec.coupled_v2 import coupled_requests_v2 as coupled

    return coupled(seeds_set, temperature, idx_mapping_np, has_draft_logits, synthetic, watermark)


def couple_v2(samples: Any, drafts: Any, cu_num_logits: Any, coupled: Any, sampled: Any, num_sampled: Any
              ) -> tuple[Any, Any]:
    """The coupled requests' output of a verification chunk: :func:`kimi.spec.coupled_v2.couple_v2`."""
    from kimi.spec.coupled_v2 import couple_v2 as couple

    return couple(samples, drafts, cu_num_logits, coupled, sampled, num_sampled)
