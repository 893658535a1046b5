"""Aux hidden-state layer ids of EAGLE-3: the two conventions, detection, translation, defaults, checks.

An EAGLE-3 drafter consumes hidden states of three (or more) target layers,
concatenated and projected by its ``fc`` layer.  Checkpoints name the layers
in one of two conventions:

* ``layer_input`` (vLLM): id ``k`` is the residual stream *entering* decoder
  layer ``k`` (equal to the output of layer ``k - 1``).  vLLM captures it in
  the target's layer loop, so valid ids are ``0 .. L-1``; its default is
  ``(2, L // 2, L - 3)``, i.e. ``(2, 30, 58)`` for a 61-layer Kimi-K2
  (``vllm/model_executor/models/interfaces.py``,
  ``get_eagle3_default_aux_hidden_state_layers``).
* ``layer_output`` (SpecForge, NVIDIA modelopt): id ``k`` is the *output* of
  layer ``k``; ``[1, 29, 57]`` there is ``[2, 30, 58]`` in vLLM.  SGLang adds
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
"""

from __future__ import annotations

from dataclasses import dataclass

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


def check_ids(ids: tuple[int, ...], num_layers: int, fc_states: int | None) -> list[str]:
    """Problems with ids in vLLM's convention for a target of ``num_layers`` layers.

    Args:
        ids: aux layer ids (``layer_input`` convention).
        num_layers: the target's decoder layer count (valid ids: ``0 .. num_layers - 1``).
        fc_states: how many hidden states the drafter's ``fc`` input holds
            (``fc.weight.shape[1] // target_hidden``), if known.

    Returns:
        One sentence per problem (empty when the ids are usable).
    """
    problems = []
    outside = [i for i in ids if not 0 <= i < num_layers]
    if outside:
        problems.append(f"aux layer ids {list(outside)} are outside the target's layers 0..{num_layers - 1} "
                        f"({num_layers} layers)")
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        problems.append(f"aux layer ids {list(ids)} repeat {repeated}: each id must name a different layer")
    if fc_states is not None and fc_states != len(ids):
        problems.append(f"{len(ids)} aux layer ids {list(ids)} but the drafter's fc takes {fc_states} hidden states")
    return problems
