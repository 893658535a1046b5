"""Per-request sampling generators: undoing a discarded sample on any device (patch
``0011-seeded-sampling-any-device``, the v0.32 line; the model runner calls both functions through
``kimi.hooks.seeded_sampling_any_device``).

vLLM's model runner samples a token for every request in the batch, also for a request whose prompt is
only partly prefilled this step (chunked prefill); that token is discarded. For a seeded request
(``SamplingParams(seed=...)``, a per-request ``torch.Generator``) the draw must not count, or the request's
output would depend on how the scheduler chunked its prompt. Upstream (the v0.26 line's release and later) rewinds
the generator with ``gen.set_offset(gen.get_offset() - 4)``: the Philox counter of a CUDA generator. A CPU
generator (Mersenne Twister) has no offset, so on vLLM's CPU backend the first discarded seeded sample
raises "RuntimeError: CPU Generator does not use offset" and the engine dies.

Here the state of each such generator that has no offset is kept before sampling
(:func:`keep_discarded_states`) and put back afterwards (:func:`rewind_discarded`); CUDA generators keep
upstream's offset rewind.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import torch


def _has_offset(gen: torch.Generator) -> bool:
    return gen.device.type == "cuda"


def keep_discarded_states(generators: Mapping[int, torch.Generator], discard: np.ndarray) -> dict[int, torch.Tensor]:
    """Before sampling: the states of the generators without an offset whose sample this step discards.

    Args:
        generators: batch index -> the request's generator (``InputBatch.generators``; seeded requests only).
        discard: bool [num_reqs], True where this step's sampled token will be discarded
            (``discard_request_mask``).

    Returns:
        batch index -> ``gen.get_state()`` (uint8 tensor), for :func:`rewind_discarded`.
    """
    kept = {}
    for i in np.flatnonzero(discard).tolist():
        gen = generators.get(i)
        if gen is not None and not _has_offset(gen):
            kept[i] = gen.get_state()
    return kept


def rewind_discarded(generators: Mapping[int, torch.Generator], indices: Iterable[int],
                     kept: Mapping[int, torch.Tensor]) -> None:
    """After sampling: undo the discarded samples' draws, as if those tokens had not been sampled.

    Args:
        generators: as for :func:`keep_discarded_states`.
        indices: batch indices whose sampled token is discarded.
        kept: what :func:`keep_discarded_states` returned for this step.

    Raises:
        RuntimeError: a generator without an offset whose state was not kept (the two calls disagree on
            which requests were discarded).
    """
    for i in (int(i) for i in indices):
        gen = generators.get(i)
        if gen is None:
            continue
        if _has_offset(gen):
            gen.set_offset(gen.get_offset() - 4)  # upstream's rewind of one Philox draw
        elif i in kept:
            gen.set_state(kept[i])
        else:
            raise RuntimeError(f"kimi.spec.seeded_generators: no kept state for the {gen.device.type} "
                               f"generator of discarded request {i}; keep_discarded_states must run before sampling")
