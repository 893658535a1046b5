"""EAGLE-3 with pipeline parallelism on DeepSeek-V3 / Kimi targets, V1 model runner (the runner of vLLM's CPU
backend), the v0.32 line; patch ``0022-eagle3-pipeline-parallel`` calls it through
:mod:`kimi.hooks.eagle3_pipeline_parallel`.

Upstream (the v0.32 line's vLLM) cannot serve EAGLE-3 at ``pipeline_parallel_size > 1`` on these targets. The patch
calls this logic where a pipeline stage differs from the last one:

* :func:`agreed_kv_cache_layouts`: the stages run different attention backends (only the last holds the drafter),
  so their supported KV cache layouts differ, and the engine core's ``resolve_kv_cache_layout`` asserted that they
  agree; it now takes the layouts every worker supports.
* :func:`upstream_aux_keys`, :func:`makes_aux_here`, :func:`pack_aux`, :func:`gather_aux`: ``DeepseekV2Model``
  makes the aux hidden states of its own stage's layers, sends them on in the intermediate tensors with those of
  the stages before, and the last stage hands the drafter all of them in aux-id order (upstream dropped those of
  earlier stages, vllm#45985).
* :func:`relays_aux_hidden_states`: the V1 runner of a non-last stage sets the aux layers on its model though it
  has no drafter (upstream built the drafter on the last stage only and touched it on every stage, vllm#30436).
* :func:`stage_new_tokens`: a non-last stage recovers the drafts the last stage accepted, which the scheduler
  does not send it.
* :class:`PendingDrafts`, :func:`in_flight`: the engine core holds the drafts of a batch still in its batch queue
  until that batch's output is processed.
* :func:`holds_target_embedding`: the last stage keeps the target's input embedding for the drafter to share.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


def agreed_kv_cache_layouts(supported: list[list[str]]) -> list[str]:
    """The KV cache layouts every worker supports (each worker's list most preferred first), the one most workers
    prefer first, ties in the first worker's order.

    Raises:
        ValueError: no layout is supported by every worker; the message lists each worker's layouts.
    """
    if all(names == supported[0] for names in supported[1:]):
        return list(supported[0])
    firsts = Counter(names[0] for names in supported if names)
    common = [name for name in supported[0] if all(name in names for names in supported[1:])]
    if not common:
        raise ValueError(f"No KV cache layout is supported by every worker (pipeline stages run different "
                         f"attention backends): {supported}.")
    return sorted(common, key=lambda name: -firsts[name])


#: Key prefix of an aux hidden state in the intermediate tensors a stage sends on, ``{AUX_KEY}{slot}`` with the slot
#: the id's index among the sorted aux ids (the prefix is upstream's ``EagleModelMixin.AUX_HIDDEN_STATE_KEY``).
AUX_KEY = "aux_hidden_states_"


def aux_slot(aux_layers: tuple[int, ...], layer: int) -> int:
    """The slot of aux id ``layer``: its index among the sorted aux ids."""
    return sorted(aux_layers).index(layer)


def upstream_aux_keys(aux_layers: tuple[int, ...], start_layer: int, is_first_rank: bool) -> list[str]:
    """Keys of the aux hidden states a stage starting at ``start_layer`` receives from earlier stages: every id
    ``<= start_layer`` (the state entering layer ``start_layer`` is the previous stage's output, sent as an aux state
    by that stage); none on the first stage."""
    if is_first_rank:
        return []
    return [f"{AUX_KEY}{aux_slot(aux_layers, k)}" for k in sorted(aux_layers) if k <= start_layer]


def makes_aux_here(aux_layers: tuple[int, ...], layer: int, start_layer: int, is_first_rank: bool) -> bool:
    """Whether this stage records the state entering ``layer`` before running it: an aux id that is not this stage's
    first layer, or is (id 0, the embedding output) on the first stage. The state entering a later stage's first layer
    is recorded by the stage that computes it, at its end."""
    return layer in aux_layers and (layer > start_layer or is_first_rank)


def pack_aux(aux_layers: tuple[int, ...], made: dict[int, Any], received: Any | None) -> dict[str, Any]:
    """The aux entries a non-last stage sends on: those it ``received`` from earlier stages (an
    ``IntermediateTensors`` or None), then the ones it ``made`` (aux id -> tensor), each under its slot's key."""
    out = {key: value for key, value in (received.tensors.items() if received is not None else ())
           if key.startswith(AUX_KEY)}
    out.update({f"{AUX_KEY}{aux_slot(aux_layers, layer)}": state for layer, state in made.items()})
    return out


def gather_aux(aux_layers: tuple[int, ...], start_layer: int, made: dict[int, Any], received: Any | None,
               is_first_rank: bool) -> list[Any]:
    """Every aux hidden state in aux-id order on the last stage: those of earlier stages from ``received`` (their
    keys, :func:`upstream_aux_keys`), then the ones this stage ``made``.

    Raises:
        RuntimeError: an earlier stage's state is missing from ``received``, naming the keys there.
    """
    keys = upstream_aux_keys(aux_layers, start_layer, is_first_rank)
    tensors = received.tensors if received is not None else {}
    missing = [key for key in keys if key not in tensors]
    if missing:
        raise RuntimeError(f"EAGLE-3 aux hidden states {missing} of earlier pipeline stages are missing from the "
                           f"intermediate tensors {sorted(tensors)}.")
    return [tensors[key] for key in keys] + [made[layer] for layer in sorted(made)]


def relays_aux_hidden_states(vllm_config: Any) -> bool:
    """Whether this worker is a non-last pipeline stage of an EAGLE-3 target whose drafter reads aux hidden states:
    it has no drafter (vLLM builds it on the last stage only) but makes and sends on its part of the aux states."""
    from vllm.distributed.parallel_state import get_pp_group

    spec = vllm_config.speculative_config
    if spec is None or spec.method != "eagle3" or get_pp_group().is_last_rank:
        return False
    eagle_config = getattr(spec.draft_model_config.hf_config, "eagle_config", None) or {}
    return bool(eagle_config.get("use_aux_hidden_state", True))


def stage_new_tokens(new_token_ids: list[int], num_new_tokens: int, drafts: list[int],
                     all_token_ids: list[int] | None = None, known: int = 0) -> list[int]:
    """The tokens a non-last pipeline stage appends to a request this step, oldest first, ``num_new_tokens`` of
    them.

    Without async scheduling the scheduler sends such a stage the tokens to compute next (``new_token_ids``,
    ``Scheduler._make_cached_request_data``), which leave out the drafts the last stage accepted in the previous
    step: this stage computed them as draft positions and never learns they were kept. Where the scheduler also
    sent the request's ``all_token_ids`` (a request not scheduled in the previous step, which the stage has dropped
    from its input batch with its drafts) they are read from there after the ``known`` tokens the stage has;
    otherwise they are the first ``num_new_tokens - len(new_token_ids)`` of the drafts it verified (``drafts``).

    Raises:
        RuntimeError: more tokens are missing than can be recovered (the stages disagree on the request).
    """
    missing = num_new_tokens - len(new_token_ids)
    if missing <= 0:
        return list(new_token_ids[len(new_token_ids) - num_new_tokens:]) if num_new_tokens > 0 else []
    if all_token_ids is not None and len(all_token_ids) >= known + num_new_tokens:
        return list(all_token_ids[known:known + num_new_tokens])
    if missing > len(drafts):
        raise RuntimeError(f"A pipeline stage is missing {missing} accepted tokens of a request but verified only "
                           f"{len(drafts)} drafts in its previous step and was not sent the request's tokens.")
    return [*drafts[:missing], *new_token_ids]


class PendingDrafts:
    """Drafts of requests whose batch is still in the engine core's batch queue (pipeline parallelism without async
    scheduling), held until that batch's output is processed.

    Upstream's ``EngineCore.post_step`` hands the drafts the last stage made to the scheduler right after a batch is
    scheduled, before its output is processed; the scheduler then schedules those requests again at once, with the
    drafts but without the token sampled with them, and the last stage fails (``IndexError`` in
    ``hidden_states[logits_indices]``). The drafts are those of the latest batch each request was in (a request is
    in one batch at a time).
    """

    def __init__(self) -> None:
        self.by_request: dict[str, list[int]] = {}

    def release(self, drafts: Any | None, in_flight: set[str]) -> Any | None:
        """Add ``drafts`` (a ``DraftTokenIds`` or None) and return, as one ``DraftTokenIds`` (None if empty), the
        held drafts of requests not ``in_flight`` (request ids of the batches still queued), which are dropped from
        the hold."""
        from vllm.v1.outputs import DraftTokenIds

        if drafts is not None:
            self.by_request.update(zip(drafts.req_ids, drafts.draft_token_ids, strict=True))
        ready = [req_id for req_id in self.by_request if req_id not in in_flight]
        if not ready:
            return None
        return DraftTokenIds(ready, [self.by_request.pop(req_id) for req_id in ready])


def in_flight(batch_queue: Any) -> set[str]:
    """Request ids of the batches in an engine core's batch queue (``(future, scheduler_output, exec_future)``)."""
    return {req_id for _, scheduler_output, _ in batch_queue for req_id in scheduler_output.num_scheduled_tokens}


def holds_target_embedding(target_language_model: Any) -> bool:
    """Whether the target on this pipeline stage has its input embedding (a last stage that keeps it for an EAGLE
    drafter, ``spec_decode_needs_target_embed``), which the drafter shares as on a single stage; without it vLLM
    the v0.32 line's V1 drafter "loads its embedding separately" even when its checkpoint has none, and drafts from
    uninitialised embeddings."""
    from vllm.model_executor.models.utils import PPMissingLayer

    inner = getattr(target_language_model, "model", None)
    embedding = getattr(inner, "embed_tokens", None)
    return embedding is not None and not isinstance(embedding, PPMissingLayer)
