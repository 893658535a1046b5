"""Hook of patch ``seeded-sampling-any-device`` (the v0.32 line): a discarded seeded sample undone on any device;
the logic is :mod:`kimi.spec.seeded_generators`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def keep_discarded_states(generators: Mapping[int, Any], discard: Any) -> dict[int, Any]:
    """Called before sampling: :func:`kimi.spec.seeded_generators.keep_discarded_states`."""
    from kimi.spec.seeded_generators import keep_discarded_states as keep

    return keep(generators, discard)


def rewind_discarded(generators: Mapping[int, Any], indices: Iterable[int], kept: Mapping[int, Any]) -> None:
    """Called after sampling: :func:`kimi.spec.seeded_generators.rewind_discarded`."""
    from kimi.spec.seeded_generators import rewind_discarded as rewind

    rewind(generators, indices, kept)
