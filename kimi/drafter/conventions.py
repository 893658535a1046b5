"""Aux hidden-state layer ids of EAGLE-3: the two conventions, detection, translation, defaults, checks.

An EAGLE-3 drafter consumes hidden states of three (or more) target layers,
concatenated and projected by its ``fc`` layer.  Checkpoints name the layers
in one of two conventions:

* ``layer_input`` (vLLM): id ``k`` is the residual stream *entering* decoder
  layer ``k`` (equal to the output of layer ``k - 1``).  vLLM captures it in
  the target's layer loop, and id ``L`` is the output of the last layer
  (captured after the loop since vllm#46973; the v0.32 line and later serve it), so valid ids
  are ``0 .. L``; its default is
  ``(2, L // 2, L - 3)``, i.e. ``(2, 30, 58)`` for a 61-layer Kimi-K2
  (``vllm/model_executor/models/interfaces.py``,
  ``get_eagle3_default_aux_hidden_state_layers``).
* ``layer_output`` (SpecForge, NVIDIA modelopt): id ``k`` is the *output* of
  layer ``k``; ``[1, 29, 57]`` there is ``[2, 30, 58]`` in vLLM; valid ids
  are ``0 .. L-1`` (``L-1``, the last layer's output, is vLLM's ``L``).  SGLang adds
  one when the first id is 1 (sglang PR 25454).  Served literally, such a
  drafter sees the wrong layers and acceptance collapses without an error
  (vllm issues 50170: 1.2 % instead of 59 %; 43671).

Where the ids are written decides how they are read (first match wins):

1. ``eagle_aux_hidden_state_layer_ids_convention`` (written by ``kimi drafter
   convert``) states the convention of the top-level ids;
2. top-level ``eagle_aux_hidden_state_layer_ids`` (vLLM, speculators): ``layer_input``;
3. nested ``eagle_config.eagle_aux_hidden_state_layer_ids``: ``layer_output``
   for a modelopt export, or when the first id is 1 (SpecForge); otherwise
   read literally and reported as ambiguous;
4. none: vLLM's default ids for the target's depth (made distinct for
   shallow targets, where ``(2, L // 2, L - 3)`` collides: 4 layers give
   ``(2, 2, 1)``).

Both sources written at once (top-level and nested ids) are compared in vLLM's convention
(:func:`conflicting_ids`); :func:`convention_table` lists every rule with its valid range.
"""

from __future__ import annotations

from dataclasses import dataclass

from kimi.drafter.findings import Finding, finding
from kimi.fork.release import upstream_release

LAYER_INPUT = "layer_input"
LAYER_OUTPUT = "layer_output"
CONVENTIONS = (LAYER_INPUT, LAYER_OUTPUT)
IDS_FIELD = "eagle_aux_hidden_state_layer_ids"
CONVENTION_FIELD = "eagle_aux_hidden_state_layer_ids_convention"


@dataclass(frozen=True)
class AuxIds:
    """The aux layer ids of a drafter as written and as vLLM must use them.

    Attributes:
        written: ids as found in the config (None if absent).
        where: the config field they came from ('' if absent).
        convention: ``layer_input``, ``layer_output``, or ``default`` (none written).
        evidence: why that convention was chosen, in words.
        ambiguous: True when the convention is a guess the user should confirm.
        malformed: a description when a field is present but not a list of
            integers ('' otherwise); ``written`` is then None.
    """

    written: tuple[int, ...] | None
    where: str
    convention: str
    evidence: str
    ambiguous: bool = False
    malformed: str = ""

    def vllm_ids(self, num_target_layers: int | None) -> tuple[int, ...] | None:
        """The ids in vLLM's ``layer_input`` convention (defaults need the target's depth; None if malformed).

        Raises:
            ValueError: defaults are needed and the target has fewer than 3 layers.
        """
        if self.malformed:
            return None
        if self.written is None:
            return default_ids(num_target_layers) if num_target_layers else None
        shift = 1 if self.convention == LAYER_OUTPUT else 0
        return tuple(i + shift for i in self.written)


def _ids(value: object) -> tuple[int, ...] | None:
    """A non-empty list of plain integers as a tuple; anything else (bools, floats, strings) is None."""
    if isinstance(value, (list, tuple)) and value and all(type(i) is int for i in value):
        return tuple(value)
    return None


def _malformed(config: dict) -> AuxIds | None:
    nested = config.get("eagle_config")
    fields = [(IDS_FIELD, config.get(IDS_FIELD))]
    if isinstance(nested, dict):
        fields.append((f"eagle_config.{IDS_FIELD}", nested.get(IDS_FIELD)))
    for where, value in fields:
        if value is not None and _ids(value) is None:
            return AuxIds(None, where, "malformed", "", malformed=f"{where} must be a non-empty list of integer "
                                                                  f"layer ids, not {value!r}")
    stated = config.get(CONVENTION_FIELD)
    if stated is not None and stated not in CONVENTIONS:
        return AuxIds(None, CONVENTION_FIELD, "malformed", "",
                      malformed=f"{CONVENTION_FIELD} must be one of {', '.join(CONVENTIONS)}, not {stated!r}")
    return None


def read_aux_ids(config: dict, modelopt: bool = False) -> AuxIds:
    """Find the aux ids in a drafter's ``config.json`` and decide their convention (see module docstring).

    Args:
        config: the drafter's config dict.
        modelopt: the checkpoint is an NVIDIA modelopt export (its ids are ``layer_output``).
    """
    bad = _malformed(config)
    if bad is not None:
        return bad
    top = _ids(config.get(IDS_FIELD))
    stated = config.get(CONVENTION_FIELD)
    if top is not None and stated in CONVENTIONS:
        return AuxIds(top, IDS_FIELD, stated, f"{CONVENTION_FIELD} says {stated}")
    if top is not None:
        return AuxIds(top, IDS_FIELD, LAYER_INPUT, "top-level ids are vLLM's convention (vLLM reads them literally)")
    nested_cfg = config.get("eagle_config")
    nested = _ids(nested_cfg.get(IDS_FIELD)) if isinstance(nested_cfg, dict) else None
    where = f"eagle_config.{IDS_FIELD}"
    if nested is not None and modelopt:
        return AuxIds(nested, where, LAYER_OUTPUT, "modelopt exports write the output of layer k")
    if nested is not None and nested[0] == 1:
        return AuxIds(nested, where, LAYER_OUTPUT,
                      "nested eagle_config ids starting at 1: SpecForge writes the output of layer k "
                      "(SGLang adds 1 in this case, sglang PR 25454)")
    if nested is not None:
        return AuxIds(nested, where, LAYER_INPUT,
                      "nested eagle_config ids not starting at 1: read literally, as vLLM 0.26 does", ambiguous=True)
    return AuxIds(None, "", "default", "no aux layer ids in the config: vLLM's defaults for the target's depth")


def default_ids(num_layers: int) -> tuple[int, ...]:
    """vLLM's default ``(2, L // 2, L - 3)``, or three distinct evenly spread ids where that collides.

    Raises:
        ValueError: the target has fewer than 3 layers (EAGLE-3 needs three distinct states).
    """
    if num_layers < 3:
        raise ValueError(f"an EAGLE-3 drafter needs 3 distinct target layers; the target has {num_layers}")
    upstream = (2, num_layers // 2, num_layers - 3)
    if len(set(upstream)) == 3 and all(0 <= i < num_layers for i in upstream):
        return upstream
    top = num_layers - 1
    low = 1 if num_layers > 3 else 0
    return (low, (low + top + 1) // 2, top)


def valid_range(convention: str, num_layers: int) -> tuple[int, int]:
    """(first, last) valid id as written in ``convention`` for a target of ``num_layers`` decoder layers: the
    states vLLM captures are the embedding output (vLLM id 0), each layer's input and the last layer's output
    (vLLM id ``num_layers``); a ``layer_output`` id ``k`` is vLLM's ``k + 1``, so it has no id for the embedding.
    The default (no ids written) is read as ``layer_input``."""
    return (0, num_layers - 1) if convention == LAYER_OUTPUT else (0, num_layers)


def check_ids(ids: tuple[int, ...], num_layers: int, fc_states: int | None) -> list[Finding]:
    """Problems with ids in vLLM's convention for a target of ``num_layers`` layers, each with its fix.

    Args:
        ids: aux layer ids (``layer_input`` convention; valid: :func:`valid_range`).
        num_layers: the target's decoder layer count.
        fc_states: how many hidden states the drafter's ``fc`` input holds
            (``fc.weight.shape[1] // target_hidden``), if known.

    Returns:
        Findings of kind ``ids`` (empty when the ids are usable).
    """
    problems = []
    low, high = valid_range(LAYER_INPUT, num_layers)
    outside = [i for i in ids if not low <= i <= high]
    if outside:
        problems.append(finding(
            "ids", f"aux layer ids {list(outside)} are outside the target's layers {low}..{high} ({num_layers} "
                   f"layers; {high} is the last layer's output)",
            f"write the ids of the layers the drafter was trained on, {low}..{high} in vLLM's convention (the state "
            f"entering layer k) or 0..{num_layers - 1} as 'output of layer k' ids with "
            f"{CONVENTION_FIELD}: {LAYER_OUTPUT}; a drafter trained on a deeper target needs that target"))
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        problems.append(finding(
            "ids", f"aux layer ids {list(ids)} repeat {repeated}: each id must name a different layer",
            "write each layer the drafter was trained on once (vLLM captures a repeated layer once, and the fc "
            "gets fewer states than it takes)"))
    if fc_states is not None and fc_states != len(ids):
        problems.append(finding(
            "ids", f"{len(ids)} aux layer ids {list(ids)} but the drafter's fc takes {fc_states} hidden states",
            f"write the {fc_states} ids the drafter's fc was trained on (one per state its fc.weight takes)"))
    return problems


def conflicting_ids(config: dict, modelopt: bool = False) -> str:
    """Top-level and nested ``eagle_config`` ids that name different layers in vLLM's convention, in words ('' when
    only one is written, a field is malformed, or both name the same layers). Upstream vLLM reads the top-level ids
    and ignores the nested ones without a word."""
    nested_cfg = config.get("eagle_config")
    top = _ids(config.get(IDS_FIELD))
    nested = _ids(nested_cfg.get(IDS_FIELD)) if isinstance(nested_cfg, dict) else None
    if top is None or nested is None or _malformed(config) is not None:
        return ""
    served = read_aux_ids(config, modelopt)
    alone = read_aux_ids({"eagle_config": nested_cfg}, modelopt)
    if served.vllm_ids(None) == alone.vllm_ids(None):
        return ""
    return (f"{served.where} {list(top)} ({served.convention}, vLLM ids {list(served.vllm_ids(None))}) and "
            f"{alone.where} {list(nested)} ({alone.convention}, vLLM ids {list(alone.vllm_ids(None))}) name "
            f"different layers: vLLM {upstream_release()} serves the top-level ids and ignores the nested ones "
            "without a word")


#: One example config per rule of :func:`read_aux_ids`, in its order, and the rule in words.
_RULES = (
    ({IDS_FIELD: [2], CONVENTION_FIELD: LAYER_INPUT}, f"top-level, {CONVENTION_FIELD}: {LAYER_INPUT}", False),
    ({IDS_FIELD: [2], CONVENTION_FIELD: LAYER_OUTPUT}, f"top-level, {CONVENTION_FIELD}: {LAYER_OUTPUT}", False),
    ({IDS_FIELD: [2]}, "top-level (vLLM, speculators)", False),
    ({"eagle_config": {IDS_FIELD: [2]}}, "nested eagle_config, modelopt export", True),
    ({"eagle_config": {IDS_FIELD: [1]}}, "nested eagle_config starting at 1 (SpecForge)", False),
    ({"eagle_config": {IDS_FIELD: [2]}}, "nested eagle_config otherwise (a guess: inspect asks to state it)", False),
    ({}, "none (vLLM's defaults, made distinct)", False),
)


def convention_table(num_layers: int | None = None) -> str:
    """A markdown table of every rule :func:`read_aux_ids` applies: where the ids are written, the convention it
    reads them in, the valid ids as written and as vLLM's, from :func:`valid_range` and :meth:`AuxIds.vllm_ids`
    (for ``L`` layers when ``num_layers`` is None, else for that target)."""
    layers = num_layers or 61  # any depth: the ranges are printed in terms of L when none is given

    def term(value: int) -> str:
        if num_layers:
            return str(value)
        return "L" if value == layers else f"L-{layers - value}" if value > layers // 2 else str(value)

    rows = ["| ids written | read as | valid ids as written | in vLLM's convention |", "|---|---|---|---|"]
    for config, where, modelopt in _RULES:
        aux = read_aux_ids(config, modelopt)
        if aux.written is None:
            depths = (num_layers,) if num_layers else (61, 6, 4)
            shown = "; ".join(f"{list(default_ids(n))} for {n} layers" for n in depths)
            rows.append(f"| {where} | {aux.convention} | - | {shown} |")
            continue
        low, high = valid_range(aux.convention, layers)
        first, last = AuxIds((low, high), aux.where, aux.convention, "").vllm_ids(layers)
        rows.append(f"| {where} | {aux.convention} | {term(low)}..{term(high)} | {term(first)}..{term(last)} |")
    return "\n".join(rows)
