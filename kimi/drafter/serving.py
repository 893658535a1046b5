"""EAGLE-3 drafter checks run by vLLM's ``SpeculativeConfig`` before any weight loads.

Reached through one hook call in ``vllm/config/speculative.py`` (patch
``0004-eagle3-drafter-checks``).  For ``method: eagle3`` it:

1. decides the aux layer ids in vLLM's convention (``kimi.drafter.conventions``):
   ids written as "output of layer k" are translated and the log says so; a
   drafter without ids gets vLLM's defaults made distinct for shallow targets,
   logged loudly with the ids used;
2. checks them against the target's layer count, for repeats, and against
   the number of hidden states the drafter's ``fc`` takes (from the
   safetensors header), and checks the drafter's target hidden size;
3. raises the drafter's ``max_position_embeddings`` to the served context
   where its RoPE only caches positions, or fails clearly where it does not;
4. writes the ids to the draft config's top-level
   ``eagle_aux_hidden_state_layer_ids`` and ``num_aux_hidden_states``, which
   both of vLLM's model runners and the drafter's ``fc`` read.

Every failure is a ``DrafterConfigError`` (a ``ValueError``) naming the ids,
the target's layer count and the fix, raised seconds into start-up instead
of as a shape error after the target's weights have loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kimi.drafter.checkpoint import Checkpoint
from kimi.drafter.conventions import LAYER_OUTPUT, check_ids, read_aux_ids
from kimi.drafter.inspect import CACHE_ONLY_ROPE, detect_format


class DrafterConfigError(ValueError):
    """The EAGLE-3 drafter does not fit the target; the message names the fix."""


def _logger():
    from vllm.logger import init_logger

    return init_logger("vllm.kimi.eagle3")


def _local_checkpoint(model: str, revision: str | None) -> Checkpoint | None:
    """The drafter's folder: a local path, or the Hugging Face cache's snapshot (no download)."""
    path = Path(model)
    if not path.is_dir():
        try:
            from huggingface_hub import snapshot_download

            path = Path(snapshot_download(model, revision=revision, local_files_only=True))
        except Exception:  # not cached: the checks that need the files are skipped
            return None
    return Checkpoint.open(path)


def prepare_eagle3_drafter(spec_config: Any) -> tuple[int, ...]:
    """Check and fix up the EAGLE-3 drafter of ``spec_config`` (see module docstring).

    Args:
        spec_config: ``vllm.config.SpeculativeConfig`` with ``method == "eagle3"``,
            its ``draft_model_config`` and ``target_model_config`` built.

    Returns:
        The aux layer ids (vLLM convention) the target will capture.

    Raises:
        DrafterConfigError: ids out of range, repeated, or not matching the
            drafter's ``fc``; a drafter made for another hidden size; a RoPE
            that cannot cover the served context.
    """
    log = _logger()
    draft, target = spec_config.draft_model_config, spec_config.target_model_config
    hf = draft.hf_config
    text = target.hf_text_config
    num_layers = int(text.num_hidden_layers)
    checkpoint = _local_checkpoint(draft.model, getattr(draft, "revision", None))
    config = checkpoint.config if checkpoint else hf.to_dict()
    fmt = detect_format(checkpoint)[0] if checkpoint else "unknown"
    aux = read_aux_ids(config, modelopt=fmt == "modelopt")
    name = draft.model

    try:
        ids = aux.vllm_ids(num_layers)
    except ValueError as exc:
        raise DrafterConfigError(f"EAGLE-3 drafter {name}: {exc}") from None
    target_hidden = int(getattr(hf, "target_hidden_size", None) or hf.hidden_size)
    problems = []
    if target_hidden != int(text.hidden_size):
        problems.append(f"the drafter takes target hidden states of width {target_hidden}, the target's hidden size "
                        f"is {text.hidden_size}: it was made for another model")
    fc = checkpoint.shape("fc.weight") if checkpoint else None
    fc_states = fc[1] // target_hidden if fc and fc[1] % target_hidden == 0 else None
    problems += check_ids(ids, num_layers, fc_states)
    if problems:
        written = f" (written {list(aux.written)} in {aux.where}, {aux.convention})" if aux.written else ""
        raise DrafterConfigError(
            f"EAGLE-3 drafter {name} does not fit the {num_layers}-layer target {target.model}: "
            + "; ".join(problems)
            + f". vLLM ids {list(ids)}{written}. Fix: give the ids of the layers the drafter was trained on, in "
            "vLLM's convention (state entering layer k, 0.." + str(num_layers - 1) + ") as "
            "eagle_aux_hidden_state_layer_ids in the drafter's config.json; `kimi drafter inspect "
            f"{name} --target {target.model}` shows what was found and `kimi drafter convert` writes them."
        )

    if aux.written is None:
        log.warning(
            "EAGLE-3 drafter %s names no aux layer ids: using the defaults %s for the %d-layer target. If the "
            "drafter was trained on other layers, acceptance collapses without an error; write the ids with "
            "`kimi drafter convert`.", name, list(ids), num_layers)
    elif aux.convention == LAYER_OUTPUT:
        log.warning(
            "EAGLE-3 drafter %s: aux layer ids %s in %s are 'output of layer k' (%s); translated to vLLM's "
            "'state entering layer k' ids %s.", name, list(aux.written), aux.where, aux.evidence, list(ids))
    else:
        log.info("EAGLE-3 drafter %s: aux layer ids %s (%s).", name, list(ids), aux.evidence)
    hf.eagle_aux_hidden_state_layer_ids = list(ids)
    hf.num_aux_hidden_states = len(ids)
    _fit_rope(hf, int(target.max_model_len), name, log)
    return ids


def _fit_rope(hf: Any, served: int, name: str, log: Any) -> None:
    """Raise a cache-only RoPE's length to ``served`` positions, or fail where the RoPE depends on it."""
    own = getattr(hf, "max_position_embeddings", None)
    if own is None or own >= served:
        return
    scaling = getattr(hf, "rope_scaling", None) or getattr(hf, "rope_parameters", None) or {}
    rope_type = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
    if rope_type not in CACHE_ONLY_ROPE:
        raise DrafterConfigError(
            f"EAGLE-3 drafter {name}: its {rope_type} RoPE covers {own} positions but the target serves {served}; "
            f"serve with --max-model-len {own}, or use a drafter made for the longer context")
    log.warning("EAGLE-3 drafter %s: max_position_embeddings %d < served context %d; its %s RoPE depends only on "
                "the position, so its length is raised to %d.", name, own, served, rope_type or "default", served)
    hf.max_position_embeddings = served
