"""What an EAGLE-3 drafter was fed at each position, read inside a running engine, against what the target read.

The check: at an image position a multimodal target (Kimi-K2.5) reads the vision tower's merged
embedding, and an EAGLE-3 drafter must read the same row, not the embedding of the placeholder token.  Two
forward pre-hooks record the rows that were actually consumed, as float32 CPU copies:

* the target: the ``hidden_states`` entering the first decoder layer of its text model
  (``language_model.model.layers[0]``, DeepSeek-V3's ``DeepseekV2DecoderLayer``): the input rows, which vLLM's
  runners build by merging the image embeddings into the token embeddings (the text model's own ``forward``
  is behind vLLM's compile wrapper, which calls it without module hooks), keyed by position;
* the drafter: the ``embeds`` argument of its first decoder layer (both drafter styles, Llama-style
  ``LlamaDecoderLayer`` and MLA-style ``DeepseekV2Eagle3DecoderLayer``, take it so), keyed by position.

An EAGLE-3 drafter at position ``p`` reads the token at ``p + 1`` (with the target's state at ``p``), so its
row at ``p`` is compared with the target's row at ``p + 1``.

Use from the process that holds the engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) or through
``LLM.collective_rpc``: :func:`install` and :func:`take` take the worker as their only argument. Both model
runners are read: V1 keeps the drafter at ``model_runner.drafter.model``, V2 at
``model_runner.speculator.model``.  Needs torch (imported by the hooks' callers only).
"""

from __future__ import annotations

_ATTR = "_kimi_draft_inputs"


def _target_text_model(model):
    """The module whose forward gets the merged input rows: ``language_model.model`` of a multimodal target,
    ``model`` of a text one."""
    inner = getattr(model, "language_model", model)
    return getattr(inner, "model", inner)


def _target(runner):
    """The target model of a V1 (``get_model()``) or V2 (``model``) model runner."""
    return runner.get_model() if hasattr(runner, "get_model") else runner.model


def _slots(layer, count: int):
    """``[count]`` int64, the KV cache slot each row of this forward pass writes (-1: none, a row a runner pads its
    batch with, whose positions and inputs are whatever its buffers held), read from vLLM's forward context: the
    slot mapping of ``layer``'s attention module (``layer_name``). None where the context does not say."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return None
    slots = get_forward_context().slot_mapping
    if not isinstance(slots, dict):
        return None
    for module in layer.modules():
        mapping = slots.get(getattr(module, "layer_name", None))
        if mapping is not None and mapping.shape[0] >= count:
            return mapping[:count]
    return None


def _record(into: list, layer, positions, rows) -> None:
    """Append CPU copies of ``positions`` [T], the first T rows of ``rows`` (float32) and their KV slots [T] (None
    where the forward context does not say, :func:`_slots` of ``layer``) to ``into``, without the rows that write
    no KV (slot -1)."""
    count = positions.shape[-1]
    positions, rows, slots = positions[:count], rows[:count], _slots(layer, count)
    if slots is not None:
        keep = slots >= 0
        positions, rows, slots = positions[keep], rows[keep], slots[keep].detach().cpu().clone()
    into.append((positions.detach().cpu().clone(), rows.detach().float().cpu().clone(), slots))


def _drafter(runner):
    """The drafter module of a V1 (``drafter.model``) or V2 (``speculator.model``) model runner, or None."""
    for owner in ("drafter", "speculator"):
        holder = getattr(runner, owner, None)
        if holder is not None and getattr(holder, "model", None) is not None:
            return holder.model
    return None


def install(worker) -> dict:
    """Hook the worker's target and drafter; returns ``{"target": class name, "drafter": class name}``.

    Records go to ``worker._kimi_draft_inputs`` (``{"target": [...], "drafter": [...]}``, each entry
    ``(positions [T] int64, rows [T, H] float32)`` on the CPU).  Installing twice replaces nothing: the
    second call only clears the records.

    Raises:
        RuntimeError: the runner has no drafter, or the drafter has no decoder layers.
    """
    runner = worker.model_runner
    target = _target(runner)
    drafter = _drafter(runner)
    if drafter is None or not getattr(getattr(drafter, "model", None), "layers", None):
        raise RuntimeError(f"no EAGLE drafter with decoder layers on {type(runner).__name__}")
    if getattr(worker, _ATTR, None) is not None:
        getattr(worker, _ATTR).update(target=[], drafter=[])
        return {"target": type(target).__name__, "drafter": type(drafter).__name__}
    records: dict = {"target": [], "drafter": []}
    setattr(worker, _ATTR, records)
    text = _target_text_model(target)

    def on_target(module, args, kwargs):
        names = ("positions", "hidden_states", "residual")
        given = {**dict(zip(names, args, strict=False)), **kwargs}
        _record(records["target"], module, given["positions"], given["hidden_states"])

    def on_drafter(module, args, kwargs):
        _record(records["drafter"], module, kwargs["positions"], kwargs["embeds"])

    text.layers[text.start_layer].register_forward_pre_hook(on_target, with_kwargs=True)
    drafter.model.layers[0].register_forward_pre_hook(on_drafter, with_kwargs=True)
    return {"target": type(target).__name__, "drafter": type(drafter).__name__}


def take(worker) -> dict:
    """The records since :func:`install` or the last :func:`take` (then cleared): ``{"target": [(positions,
    rows, slots)], "drafter": [(positions, rows, slots)]}``, one entry per forward pass, tensors on the CPU
    (``slots`` None where vLLM's forward context did not give them)."""
    records = getattr(worker, _ATTR)
    out = {key: list(value) for key, value in records.items()}
    records.update(target=[], drafter=[])
    return out


def token_row(worker, token_id: int):
    """``[H]`` float32 CPU copy of the target's embedding of ``token_id`` (the row a drafter that shares the
    target's embeddings reads for it)."""
    import torch

    text = _target_text_model(_target(worker.model_runner))
    ids = torch.tensor([token_id], device=next(text.parameters()).device)
    return text.embed_input_ids(ids)[0].detach().float().cpu().clone()


def _last_rows(records: list) -> dict:
    """``{position: row}`` from ``[(positions [T], rows [T, H], slots)]``, later records replacing earlier ones."""
    out: dict = {}
    for positions, rows, _ in records:
        for i, pos in enumerate(positions.tolist()):
            out[pos] = rows[i]
    return out


def _drafter_rows(drafter: list, target: list) -> dict:
    """``{position: row}``: for each position, the drafter row whose K/V its attention reads there, i.e. the last
    drafter row written into the KV slot the target's row for that position went to. Both share the slot
    numbering (V1's proposer and V2's speculator run the drafter on the target's slot mapping; on CPU V1 every
    position's slot was seen equal for both drafter styles), and the slot, unlike the recorded position, cannot
    be stale: V2 runs the rows of a request's rejected draft positions with whatever its position and token
    buffers held (the last prefill pass's, placeholder ids included) and writes them past the accepted length.
    Without slots (no forward context) the last row recorded at each position."""
    slot_of: dict = {}
    for positions, _, slots in target:
        if slots is not None:
            slot_of.update(zip(positions.tolist(), slots.tolist(), strict=True))
    if not slot_of:
        return _last_rows(drafter)
    by_slot: dict = {}
    for _, rows, slots in drafter:
        if slots is not None:
            by_slot.update(zip(slots.tolist(), rows, strict=True))
    return {pos: by_slot[slot] for pos, slot in slot_of.items() if slot in by_slot}


def history(records: list, position: int, target_row, placeholder_row, atol: float = 1e-5) -> list[dict]:
    """Every drafter row recorded at ``position``, in the order of the passes: ``{"pass": index of the forward
    pass among ``records``, "pass_rows": rows that pass kept, "pass_first": its first position, "slot": the KV
    slot the row wrote (None: not known), "row": "target" (equal to ``target_row``), "placeholder" (equal to
    ``placeholder_row``) or "other"}``. Tells which pass left a wrong row and whether it wrote the drafter's KV."""
    import torch

    out = []
    for index, (positions, rows, slots) in enumerate(records):
        for i in (positions == position).nonzero().flatten().tolist():
            row = rows[i]
            kind = ("target" if target_row is not None and torch.allclose(row, target_row, atol=atol, rtol=0) else
                    "placeholder" if torch.allclose(row, placeholder_row, atol=atol, rtol=0) else "other")
            out.append({"pass": index, "pass_rows": int(positions.shape[0]), "pass_first": int(positions[0]),
                        "slot": None if slots is None else int(slots[i]), "row": kind})
    return out


def compare(records: dict, prompt_ids: list[int], media_id: int, placeholder_row, atol: float = 1e-5) -> dict:
    """The drafter's rows against the target's for ONE request's prompt (records of that request alone).

    Args:
        records: :func:`take`'s result for a run of one request.
        prompt_ids: the request's prompt token ids (the placeholder repeated over each image).
        media_id: the image placeholder token id.
        placeholder_row: ``[H]`` the embedding of ``media_id`` (what a drafter reads without the target's
            image embeddings).
        atol: the largest absolute difference counted as equal.

    Returns:
        ``{"image_positions": prompt positions holding an image row that the drafter read,
        "image_equal": of them, the drafter's row equal to the target's, "image_placeholder": of them, the
        drafter's row equal to the placeholder's embedding, "image_not_read": image positions the drafter never
        read (prefix-cached), "image_target_is_placeholder": image positions where the target's own row was the
        placeholder's (the test would then prove nothing), "text_positions", "text_equal", "max_image_diff",
        "image_unequal_at": the positions of the image tokens read where the drafter's row was not the target's,
        "image_placeholder_at": of them, those where it was the placeholder's, "image_unequal_history": for each
        of them (a string key), the drafter's rows recorded there pass by pass (:func:`history`)}``.
        Each position counts once, with the drafter row left in its KV slot (:func:`_drafter_rows`; during a
        chunked prefill the drafter's discarded draft steps run at the next chunk's first positions, whose
        slots that chunk's pass then writes again); padding rows are not recorded (:func:`_record`).
    """
    import torch

    target, drafter = _last_rows(records["target"]), _drafter_rows(records["drafter"], records["target"])
    placeholder = placeholder_row.float().cpu()
    out = dict.fromkeys(("image_positions", "image_equal", "image_placeholder", "image_not_read",
                         "image_target_is_placeholder", "text_positions", "text_equal"), 0)
    out["max_image_diff"] = 0.0
    out["image_unequal_at"], out["image_placeholder_at"], out["image_unequal_history"] = [], [], {}
    for read in range(1, len(prompt_ids)):
        mine, theirs = drafter.get(read - 1), target.get(read)
        kind = "image" if prompt_ids[read] == media_id else "text"
        if mine is None or theirs is None:
            out["image_not_read"] += kind == "image"
            continue
        equal = bool(torch.allclose(mine, theirs, atol=atol, rtol=0))
        out[f"{kind}_positions"] += 1
        out[f"{kind}_equal"] += equal
        if kind == "image":
            is_placeholder = bool(torch.allclose(mine, placeholder, atol=atol, rtol=0))
            out["image_placeholder"] += is_placeholder
            out["image_unequal_at"] += [] if equal else [read]
            if not equal:
                out["image_unequal_history"][str(read)] = history(records["drafter"], read - 1, theirs, placeholder,
                                                                  atol)
            out["image_placeholder_at"] += [read] if is_placeholder else []
            out["image_target_is_placeholder"] += bool(torch.allclose(theirs, placeholder, atol=atol, rtol=0))
            out["max_image_diff"] = max(out["max_image_diff"], float((mine - theirs).abs().max()))
    return out
