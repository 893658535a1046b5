"""Hook of patch ``0022-eagle3-pipeline-parallel`` (the v0.32 line): EAGLE-3 with pipeline parallelism on
DeepSeek-V3 / Kimi targets, V1 model runner. ``DeepseekV2Model`` (:func:`upstream_aux_keys`, :func:`makes_aux_here`,
:func:`pack_aux`, :func:`gather_aux`), ``resolve_kv_cache_layout`` (:func:`agreed_kv_cache_layouts`), ``EngineCore``
(:class:`PendingDrafts`, :func:`in_flight`), the V1 drafter (:func:`holds_target_embedding`) and the V1 runner
(:func:`stage_new_tokens`, :func:`relays_aux_hidden_states`) call it; the logic is :mod:`kimi.spec.pipeline`."""

from __future__ import annotations

from typing import Any

from kimi.spec.pipeline import PendingDrafts

__all__ = ["PendingDrafts", "agreed_kv_cache_layouts", "gather_aux", "holds_target_embedding", "in_flight",
           "makes_aux_here", "pack_aux", "relays_aux_hidden_states", "stage_new_tokens", "upstream_aux_keys"]


def agreed_kv_cache_layouts(supported: list[list[str]]) -> list[str]:
    """Called by ``resolve_kv_cache_layout``: see :func:`kimi.spec.pipeline.agreed_kv_cache_layouts`."""
    from kimi.spec.pipeline import agreed_kv_cache_layouts as agreed

    return agreed(supported)


def upstream_aux_keys(aux_layers: tuple[int, ...], start_layer: int, is_first_rank: bool) -> list[str]:
    """Called by ``DeepseekV2Model.make_empty_intermediate_tensors``: see
    :func:`kimi.spec.pipeline.upstream_aux_keys`."""
    from kimi.spec.pipeline import upstream_aux_keys as keys

    return keys(aux_layers, start_layer, is_first_rank)


def makes_aux_here(aux_layers: tuple[int, ...], layer: int, start_layer: int, is_first_rank: bool) -> bool:
    """Called by ``DeepseekV2Model.forward`` before each layer: see :func:`kimi.spec.pipeline.makes_aux_here`."""
    from kimi.spec.pipeline import makes_aux_here as makes

    return makes(aux_layers, layer, start_layer, is_first_rank)


def pack_aux(aux_layers: tuple[int, ...], made: dict[int, Any], received: Any | None) -> dict[str, Any]:
    """Called by ``DeepseekV2Model.forward`` on a non-last stage: see :func:`kimi.spec.pipeline.pack_aux`."""
    from kimi.spec.pipeline import pack_aux as pack

    return pack(aux_layers, made, received)


def gather_aux(aux_layers: tuple[int, ...], start_layer: int, made: dict[int, Any], received: Any | None,
               is_first_rank: bool) -> list[Any]:
    """Called by ``DeepseekV2Model.forward`` on the last stage: see :func:`kimi.spec.pipeline.gather_aux`."""
    from kimi.spec.pipeline import gather_aux as gather

    return gather(aux_layers, start_layer, made, received, is_first_rank)


def relays_aux_hidden_states(vllm_config: Any) -> bool:
    """Called by the V1 runner's ``_setup_eagle3_aux_hidden_state_outputs``: see
    :func:`kimi.spec.pipeline.relays_aux_hidden_states`."""
    from kimi.spec.pipeline import relays_aux_hidden_states as relays

    return relays(vllm_config)


def stage_new_tokens(new_token_ids: list[int], num_new_tokens: int, drafts: list[int],
                     all_token_ids: list[int] | None = None, known: int = 0) -> list[int]:
    """Called by the V1 runner on a non-last stage as it updates a request's tokens (no async scheduling): see
    :func:`kimi.spec.pipeline.stage_new_tokens`."""
    from kimi.spec.pipeline import stage_new_tokens as new_tokens

    return new_tokens(new_token_ids, num_new_tokens, drafts, all_token_ids, known)


def in_flight(batch_queue: Any) -> set[str]:
    """Called by ``EngineCore._release_drafts`` with :class:`PendingDrafts`: see
    :func:`kimi.spec.pipeline.in_flight`."""
    from kimi.spec.pipeline import in_flight as queued

    return queued(batch_queue)


def holds_target_embedding(target_language_model: Any) -> bool:
    """Called by the V1 drafter's ``_maybe_share_embeddings``: see
    :func:`kimi.spec.pipeline.holds_target_embedding`."""
    from kimi.spec.pipeline import holds_target_embedding as holds

    return holds(target_language_model)
