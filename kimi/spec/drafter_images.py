"""EAGLE-3 drafters read the target's image embeddings at image positions (patch
``0017-eagle3-drafter-image-embeddings``, reached through ``kimi.hooks.eagle3_drafter_image_embeddings``).

At an image position a multimodal target (Kimi-K2.5, ``KimiK25ForConditionalGeneration``) reads the vision
tower's merged embedding, not the embedding of its placeholder token (``media_placeholder_token_id``).  Both
of the v0.32 line's model runners can hand those rows to a drafter: V1's proposer
(``SpecDecodeBaseProposer.build_model_inputs_first_pass``, ``vllm/v1/spec_decode/llm_base_proposer.py``) and
V2's speculator (``TargetDependentARSpeculator._run_model``,
``vllm/v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py``) call
``drafter.embed_input_ids(ids, multimodal_embeddings=..., is_multimodal=...)`` with the image rows gathered one
position ahead (the drafter at ``p`` reads the token at ``p + 1``) - but only for a drafter whose class declares
``supports_multimodal_embeddings``.  vLLM's EAGLE-3 drafters do not (``Eagle3LlamaForCausalLM``,
``Eagle3DeepseekV2ForCausalLM``: their ``embed_input_ids`` takes the arguments and drops them), so both runners
log "using text-only draft inputs" and the drafter reads the placeholder's embedding at every image position,
while the target's aux states there came from the image: its drafts on image prompts start from another input
than the one it was trained on (SGLang passes the image rows).

:func:`take_target_embeddings` is called by both runners right after the drafter is built and before they
decide: for an EAGLE-3 drafter whose input rows are as wide as the target's, it gives that drafter instance an
``embed_input_ids`` that merges the given image rows over the token embeddings (what vLLM's multimodal models
and ``EagleLlama4ForCausalLM`` do, with vLLM's own merge) and declares ``supports_multimodal_embeddings``, so the
runners' existing path passes the rows.  A drafter that cannot take them is named in a WARNING at start-up,
with what it costs.

``KIMI_DRAFT_IMAGE_EMBEDS``: ``auto`` (default) as above, ``upstream`` leaves every drafter as vLLM made it (the
warning still says what the drafter reads).
"""

from __future__ import annotations

import os
import types

import torch

MODE_ENV = "KIMI_DRAFT_IMAGE_EMBEDS"
MODES = ("auto", "upstream")

#: vLLM's EAGLE-3 drafter classes whose ``embed_input_ids(ids)`` is the token embedding alone and whose forward
#: takes ``inputs_embeds`` in place of it (``llama_eagle3.py``, ``deepseek_eagle3.py``).
EAGLE3_DRAFTERS = ("Eagle3LlamaForCausalLM", "Eagle3DeepseekV2ForCausalLM")


def _logger():
    from vllm.logger import init_logger

    return init_logger("vllm.kimi.drafter_image_embeddings")


def _mode() -> str:
    mode = os.environ.get(MODE_ENV, "auto")
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


def _row_widths(drafter: torch.nn.Module, vllm_config) -> tuple[int | None, int]:
    """(width of the drafter's input rows, width of the target's merged rows); the first None when unknown."""
    spec = getattr(vllm_config, "speculative_config", None)
    draft = spec.draft_model_config.get_inputs_embeds_size() if spec is not None else None
    return draft, vllm_config.model_config.get_inputs_embeds_size()


def _merging_embed_input_ids(drafter: torch.nn.Module):
    """``embed_input_ids(input_ids, multimodal_embeddings=None, *, is_multimodal=None) -> [T, H]`` for ``drafter``:
    the drafter's token embeddings (read at call time, so the target's shared table once the runner shares it),
    with the rows of ``multimodal_embeddings`` (a list of ``[n_i, H]``) written where ``is_multimodal``
    (``[T]`` bool, CPU or device) is true."""
    from vllm.model_executor.models.utils import _merge_multimodal_embeddings

    def embed_input_ids(self, input_ids: torch.Tensor, multimodal_embeddings=None, *,
                        is_multimodal: torch.Tensor | None = None) -> torch.Tensor:
        rows = self.model.embed_input_ids(input_ids)
        if multimodal_embeddings is None or is_multimodal is None or len(multimodal_embeddings) == 0:
            return rows
        return _merge_multimodal_embeddings(rows, multimodal_embeddings, is_multimodal)

    return types.MethodType(embed_input_ids, drafter)


def why_not(drafter: torch.nn.Module, vllm_config) -> str | None:
    """Why ``drafter`` cannot read the target's image rows here, or None when it can be given them."""
    name = type(drafter).__name__
    if name not in EAGLE3_DRAFTERS:
        return f"{name} is not one of the EAGLE-3 drafters the fork can feed them to ({', '.join(EAGLE3_DRAFTERS)})"
    draft, target = _row_widths(drafter, vllm_config)
    if draft != target:
        return f"its input rows are {draft} wide and the target's image embeddings {target}"
    return None


def take_target_embeddings(drafter: torch.nn.Module, vllm_config, *, target_supports_mm: bool | None = None) -> bool:
    """Let ``drafter`` (the built draft model) read the target's image embeddings at image positions.

    Reads ``KIMI_DRAFT_IMAGE_EMBEDS`` first, for every target (a bad value stops the start-up whatever the
    model), then does nothing for a target without multimodal inputs (``target_supports_mm``, as the caller
    read it, so the target's ``model_config.supports_multimodal_inputs`` is asked once; None: asked here) or a
    drafter that already declares ``supports_multimodal_embeddings``.  Only ``model_config`` of ``vllm_config``
    is required: without a ``speculative_config`` (upstream's unit tests build speculators over partial
    configs) the drafter's class alone names it in the messages.  Otherwise, with
    ``KIMI_DRAFT_IMAGE_EMBEDS=auto`` and a drafter :func:`why_not` accepts, sets ``drafter.embed_input_ids``
    (merging) and ``drafter.supports_multimodal_embeddings = True`` on the instance and logs it at INFO; else
    logs a WARNING naming the drafter, that image positions are drafted from the placeholder token's embedding
    and that acceptance on image prompts drops.

    Returns:
        True when the drafter reads the target's image rows after the call (given here or already able).

    Raises:
        ValueError: ``KIMI_DRAFT_IMAGE_EMBEDS`` is not one of :data:`MODES`.
    """
    mode = _mode()
    model_config = vllm_config.model_config
    if target_supports_mm is None:
        target_supports_mm = model_config.supports_multimodal_inputs
    if not target_supports_mm:
        return False
    if getattr(drafter, "supports_multimodal_embeddings", False):
        return True
    reason = "KIMI_DRAFT_IMAGE_EMBEDS=upstream" if mode == "upstream" else why_not(drafter, vllm_config)
    spec = getattr(vllm_config, "speculative_config", None)
    draft_model = spec.draft_model_config.model if spec is not None else "?"
    if reason is None:
        drafter.embed_input_ids = _merging_embed_input_ids(drafter)
        drafter.supports_multimodal_embeddings = True
        _logger().info("Drafter %s (%s) reads the target's image embeddings at image positions.",
                    type(drafter).__name__, draft_model)
        return True
    _logger().warning(
        "DRAFTER WITHOUT IMAGE INPUTS: the drafter %s (%s) cannot take the target's image embeddings (%s). "
        "At every image position of a request it drafts from the embedding of the placeholder token %s, not "
        "from the image the target read, so acceptance on image prompts drops (output is unchanged: every "
        "draft is verified).", type(drafter).__name__, draft_model, reason, _placeholder(model_config))
    return False


def _placeholder(model_config) -> str:
    """The target's image placeholder token id as its config names it, or ``"(unknown id)"``."""
    config = getattr(model_config, "hf_config", None)
    for name in ("media_placeholder_token_id", "image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if value is not None:
            return f"{value} ({name})"
    return "(unknown id)"
