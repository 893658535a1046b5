"""``KIMI_SEEDED_VERIFICATION``: whether seeded requests are verified by coupling (``coupled``, the default) or by
vLLM's ratio test (``upstream``). Read by both model runners' coupled verification
(:mod:`kimi.spec.coupled`, :mod:`kimi.spec.coupled_v2`)."""

from __future__ import annotations

import os

MODE_ENV = "KIMI_SEEDED_VERIFICATION"
MODES = ("coupled", "upstream")


def mode() -> str:
    """:data:`MODE_ENV`, ``coupled`` when unset.

    Raises:
        ValueError: a value not in :data:`MODES`.
    """
    value = os.environ.get(MODE_ENV, "coupled")
    if value not in MODES:
        raise ValueError(f"{MODE_ENV}={value!r}: expected one of {', '.join(MODES)}")
    return value


def check_mode() -> None:
    """At the rejection sampler's construction (the model runner's, before any weight loads): a bad
    :data:`MODE_ENV` fails the engine's start with the message of :func:`mode`, not its first seeded step.

    Raises:
        ValueError: as :func:`mode`.
    """
    mode()
