"""While the draft depth pauses drafting, the drafter's KV cache is written in one batch at the next drafter
pass instead of one pass per step.

In a pause (:mod:`kimi.spec.depth`, depth 0) the EAGLE-3 drafter runs one prefill pass per step only so that
its KV cache holds every position when drafting resumes.  On an eager engine that pass is a fixed cost per step
(module calls, input preparation) whatever the batch, so a pause cost a fraction of a plain step.  For a drafter
of one attention layer the keys and values it writes at a position depend only on that position's inputs - the
token, the target's aux hidden states, the position - and not on the attention over earlier positions.  Those
inputs are kept instead (:class:`DeferredKV`), and before the drafter next runs they go through the drafter in
one forward pass with no attention metadata: the attention layers write the keys and values at the kept slots
and attend to nothing (vLLM's attention backends return early without metadata, as in a profile run).

A step is deferred only where its pass would have read nothing but one decoded token per request: no prefill
in the batch, no draft verified (drafts may have been scheduled: a pause's probe whose drafts the budget or the
draft back-off dropped), one token per request, the same requests as the rows kept so far, and drafts asked for
(a step asked for none is its requests' last, or has speculation off: its pass runs, so no finished request's
last keys and values wait for a later batch).  Any other step first writes what was kept and then runs the drafter
as before.

Reached through :func:`kimi.spec.depth.keep_for_later` (patch ``eagle3-adaptive-draft-depth``).
"""

from __future__ import annotations

import time
from typing import Any

import torch

#: The most token rows kept before they are written (bounded as well by the drafter's token buffers).
MAX_ROWS = 1024


def defers(speculator: Any, aux_hidden_states: list[torch.Tensor] | None) -> bool:
    """Whether ``speculator`` (vLLM's ``EagleSpeculator``) can have its paused passes deferred: an EAGLE-3
    drafter (aux hidden states) of one attention layer, without prefill context parallelism."""
    return (bool(aux_hidden_states) and len(getattr(speculator, "draft_attn_layer_names", ())) == 1
            and getattr(speculator, "pcp_manager", None) is None)


class DeferredKV:
    """The drafter inputs of the paused steps whose drafter pass was deferred.

    Rows are one per request and step: ``ids`` (the token the drafter takes at the position, the one sampled
    there), ``positions``, ``aux`` (``[rows, num_aux_layers * hidden]``, the target's aux hidden states,
    concatenated as the drafter's ``combine_hidden_states`` takes them) and ``slots`` (the drafter layer's KV
    slot of the position).
    """

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Forget every kept row (after warm-up; once written)."""
        self.ids: list[torch.Tensor] = []
        self.positions: list[torch.Tensor] = []
        self.aux: list[torch.Tensor] = []
        self.slots: list[torch.Tensor] = []
        self.req_ids: tuple[str, ...] = ()
        self.rows = 0

    def fits(self, input_batch: Any, layer: str, slot_mappings: dict[str, torch.Tensor]) -> bool:
        """Whether the step of ``input_batch`` read one decoded token per request (no prefill, no draft verified,
        though some may have been scheduled), of the kept requests (any, when nothing is kept), and its drafter
        layer's slots are known."""
        num_reqs = input_batch.num_reqs
        return (num_reqs > 0 and not input_batch.has_prefill and input_batch.num_tokens == num_reqs
                and layer in slot_mappings
                and (not self.rows or tuple(input_batch.req_ids[:num_reqs]) == self.req_ids))

    def keep(self, input_batch: Any, last_sampled: torch.Tensor, aux_hidden_states: list[torch.Tensor],
             slots: torch.Tensor) -> None:
        """Keep the drafter inputs of a step that :meth:`fits`.

        Args:
            input_batch: the step's ``InputBatch``.
            last_sampled: ``[max_num_reqs, 1]`` int64, the runner's last sampled token per request state.
            aux_hidden_states: per aux layer ``[>= num_tokens, hidden]``, the target's hidden states.
            slots: ``[>= num_tokens]`` int64, the drafter layer's slot mapping of the step.
        """
        n = input_batch.num_reqs
        self.ids.append(last_sampled.view(-1)[input_batch.idx_mapping[:n].to(torch.long)].clone())
        self.positions.append(input_batch.positions[:n].clone())
        self.aux.append(torch.cat([h[:n] for h in aux_hidden_states], dim=-1))
        self.slots.append(slots[:n].clone())
        self.req_ids = tuple(input_batch.req_ids[:n])
        self.rows += n

    def write(self, speculator: Any, layer: str) -> None:
        """Run the kept rows through ``speculator``'s drafter in one forward pass without attention metadata, so
        that its attention layer ``layer`` writes their keys and values; then forget them."""
        if not self.rows:
            return
        n = self.rows
        buffers = speculator.input_buffers
        buffers.input_ids[:n] = torch.cat(self.ids).to(buffers.input_ids.dtype)
        buffers.positions[:n] = torch.cat(self.positions).to(buffers.positions.dtype)
        speculator.hidden_states[:n].copy_(speculator.model.combine_hidden_states(torch.cat(self.aux)))
        speculator._run_model(n, None, {layer: torch.cat(self.slots)}, num_tokens_across_dp=None)
        self.clear()


def keep_for_later(runner: Any, state: Any, input_batch: Any, depth: int,
                   aux_hidden_states: list[torch.Tensor] | None,
                   slot_mappings: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """Before the drafter's pass of ``depth`` in a step of ``input_batch``: keep the step's drafter inputs and
    return the undrafted draft tokens (``[num_reqs, k]`` int64, all -1) where the pass can wait; else write what
    was kept and return None (the drafter then runs as before).

    Args:
        runner: vLLM's ``GPUModelRunner``.
        state: the runner's :class:`kimi.spec.depth.DraftDepth` (its ``deferred`` holds the rows; its
            ``drafts_asked`` tells whether the step asked for drafts; its ``clock`` moves forward by the time spent
            writing, which belongs to the pause, not to the next step).
        depth: the step's drafter passes.
        aux_hidden_states: the target's aux hidden states of the step.
        slot_mappings: the step's slot mapping per attention layer.
    """
    speculator = runner.speculator
    if not defers(speculator, aux_hidden_states):
        return None
    kept: DeferredKV = state.deferred
    (layer,) = speculator.draft_attn_layer_names
    if depth == 0 and state.drafts_asked and kept.fits(input_batch, layer, slot_mappings):
        if kept.rows + input_batch.num_reqs > min(MAX_ROWS, speculator.max_num_tokens):
            _write(kept, speculator, layer, state)
        kept.keep(input_batch, runner.req_states.last_sampled_tokens, aux_hidden_states, slot_mappings[layer])
        state.counts.deferred += 1
        state.counts.passes -= 1  # the step's one pass (counted by the rule's plan) does not run
        draft_tokens = speculator.draft_tokens[:input_batch.num_reqs]
        draft_tokens.fill_(-1)
        return draft_tokens
    _write(kept, speculator, layer, state)
    return None


def _write(kept: DeferredKV, speculator: Any, layer: str, state: Any) -> None:
    if not kept.rows:
        return
    began = time.perf_counter()
    kept.write(speculator, layer)
    state.counts.catch_ups += 1
    state.counts.passes += 1
    if state.clock is not None:
        state.clock += time.perf_counter() - began
