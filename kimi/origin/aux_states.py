"""EAGLE-3 auxiliary hidden states of DeepSeek-V2/V3 targets and of multimodal wrappers around them.

An EAGLE-3 drafter reads, per token, the target's residual stream at three
layers.  vLLM's id ``k`` names the stream *entering* decoder layer ``k``
(``hidden_states + residual`` before the layer runs; the embeddings for
``k = 0``).  ``DeepseekV2Model.forward`` (patched) collects these through
``residual_stream`` for the ids in ``aux_hidden_state_layers`` and then
returns ``(hidden_states, [aux_0, aux_1, aux_2])`` instead of
``hidden_states``, which is what vLLM's model runner expects from a target
that implements ``SupportsEagle3``.

Layout facts of the origin line's vLLM this relies on:

* ids are global layer indices, so on a pipeline-parallel rank only the
  chosen layers it holds are captured (the states are not sent between
  stages, as in upstream);
* between DeepSeek decoder layers the stream is complete on every
  tensor-parallel rank: the MoE's sequence-parallel path gathers its own
  output (``tensor_model_parallel_all_gather`` inside ``DeepseekV2MoE``), so
  the states need no gather here;
* in float16 the model keeps the stream divided by ``routed_scaling_factor``
  after layer 0 (upstream's overflow guard); the states are returned as the
  model holds them.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from vllm.model_executor.models.interfaces import SupportsEagle3

from kimi.drafter.conventions import default_ids


def residual_stream(hidden_states: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    """The residual stream entering a decoder layer, as a new tensor.

    Args:
        hidden_states: ``[num_tokens, hidden]``, the previous layer's output
            (the embeddings before the first layer).
        residual: ``[num_tokens, hidden]`` of the same dtype, or ``None``
            before the first layer.

    Returns:
        ``[num_tokens, hidden]``, same dtype and device; never a view of the
        inputs, which the next layer's fused norm updates in place.
    """
    return hidden_states.clone() if residual is None else hidden_states + residual


def checked_layers(layers: Iterable[int], num_layers: int) -> tuple[int, ...]:
    """``layers`` as a tuple of distinct ints in ``0 .. num_layers - 1``.

    Raises:
        ValueError: an id is not an int, is out of range, or repeats (each
            would silently give fewer states than the drafter's ``fc`` takes).
    """
    ids = tuple(layers)
    bad = [i for i in ids if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"EAGLE-3 aux layer ids {list(ids)}: {bad} are not layers of this "
                         f"{num_layers}-layer target (valid: 0..{num_layers - 1})")
    if len(set(ids)) != len(ids):
        raise ValueError(f"EAGLE-3 aux layer ids {list(ids)} repeat a layer; each id gives one state")
    return ids


class Eagle3AuxLayers(SupportsEagle3):
    """``SupportsEagle3`` for a causal LM whose ``self.model`` runs the decoder layers.

    Needs ``self.config.num_hidden_layers`` and a ``self.model`` whose forward
    collects ``residual_stream`` for the ids in
    ``self.model.aux_hidden_state_layers`` (DeepSeek-V2/V3 in the origin line's vLLM
    with the fork's patch).
    """

    def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
        """Capture the streams entering these layers on the next forward passes.

        Raises:
            ValueError: see ``checked_layers``.
        """
        self.model.aux_hidden_state_layers = checked_layers(layers, self.config.num_hidden_layers)

    def get_eagle3_aux_hidden_state_layers(self) -> tuple[int, ...]:
        """vLLM's default ids ``(2, L // 2, L - 3)``, e.g. (2, 30, 58) for 61 layers;
        three distinct spread ids where those collide (fewer than 6 layers)."""
        return default_ids(self.config.num_hidden_layers)


class Eagle3Delegate(SupportsEagle3):
    """``SupportsEagle3`` for a multimodal wrapper: both methods go to ``get_language_model()``.

    The wrapper's forward must return its language model's output unchanged
    (a ``(hidden_states, aux_states)`` tuple when aux layers are set), as
    ``KimiK25ForConditionalGeneration.forward`` does.
    """

    def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
        self.get_language_model().set_aux_hidden_state_layers(layers)

    def get_eagle3_aux_hidden_state_layers(self) -> tuple[int, ...]:
        return self.get_language_model().get_eagle3_aux_hidden_state_layers()
