"""Hook of patch ``eagle3-adaptive-draft-depth``: under adaptive verification on an eager engine, the drafter runs
only as many passes as the draft budget has lately used; the logic is :mod:`kimi.spec.depth`."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any


def draft_depth(model_runner: Any, input_batch: Any, num_sampled: Any, num_rejected: Any,
                num_spec_tokens: int) -> int:
    """Called by the V2 model runner's ``sample_tokens`` before the drafter proposes; returns the drafter passes
    of the step: see :func:`kimi.spec.depth.before_propose`."""
    from kimi.spec.depth import before_propose

    return before_propose(model_runner, input_batch, num_sampled, num_rejected, num_spec_tokens)


def kept_for_later(model_runner: Any, input_batch: Any, depth: int, aux_hidden_states: Any,
                   slot_mappings_by_layer: dict[str, Any]) -> Any:
    """Called by ``sample_tokens`` in the drafter's scope before it proposes; the step's draft tokens where its
    drafter pass is deferred, else None (the drafter proposes): see :func:`kimi.spec.depth.keep_for_later`."""
    from kimi.spec.depth import keep_for_later

    return keep_for_later(model_runner, input_batch, depth, aux_hidden_states, slot_mappings_by_layer)


def drafter_scope(model_runner: Any, depth: int) -> AbstractContextManager:
    """Entered by ``sample_tokens`` around the drafter's ``propose`` of ``depth`` passes: see
    :func:`kimi.spec.depth.drafter_scope`."""
    from kimi.spec.depth import drafter_scope as scope

    return scope(model_runner, depth)


def confidences_recorded(model_runner: Any, input_batch: Any) -> None:
    """Called by ``sample_tokens`` after adaptive verification recorded the step's confidences: see
    :func:`kimi.spec.depth.after_record`."""
    from kimi.spec.depth import after_record

    after_record(model_runner, input_batch)


def bound_budget(model_runner: Any, num_tokens_per_req: dict[str, int], num_tokens: int) -> int:
    """Called by ``gather_batch_req_state`` after adaptive verification chose the step's draft budget; returns
    the step's token count: see :func:`kimi.spec.depth.budget_chosen`."""
    from kimi.spec.depth import budget_chosen

    return budget_chosen(model_runner, num_tokens_per_req, num_tokens)
