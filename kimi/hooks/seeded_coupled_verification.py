"""Hook of patch ``0018-seeded-coupled-verification`` (the v0.32 line): seeded requests verified by coupling on the V1
model runner, so a seeded request's output does not depend on the drafts. ``RejectionSampler.__init__`` calls
:func:`check_mode`; ``RejectionSampler.forward`` calls :meth:`CoupledVerification.start` and the returned object's
``uncoupled`` and ``finish``. The logic is :mod:`kimi.spec.coupled` (the mode: :mod:`kimi.spec.seeded_mode`)."""

from __future__ import annotations

from kimi.spec.coupled import CoupledVerification

__all__ = ["CoupledVerification", "check_mode"]


def check_mode() -> None:
    """Called by ``RejectionSampler.__init__``: see :func:`kimi.spec.seeded_mode.check_mode`."""
    from kimi.spec.seeded_mode import check_mode as check

    check()
