"""Hook of patch ``eagle3-greedy-draft-vocab``: greedy EAGLE-3 drafts from the draft vocabulary, without the
target-vocabulary scatter; the logic is :mod:`kimi.spec.draft_greedy`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kimi.spec.draft_greedy import DraftGreedy

__all__ = ["DraftGreedy", "draft_greedy"]


def draft_greedy(model: Any, *, in_cuda_graph: bool = False) -> Callable[[Any], Any] | None:
    """Called by the speculator once the drafter is loaded: the greedy draft function for ``model`` (its
    ``ids_and_logits`` also hands the draft-vocabulary logits to the acceptance estimator), or None where
    upstream's path stays; see :func:`kimi.spec.draft_greedy.greedy_for`."""
    from kimi.spec.draft_greedy import greedy_for

    return greedy_for(model, in_cuda_graph=in_cuda_graph)
