"""Whether drafting pays on an eager engine: the profiled step costs against the acceptance the engine observes.

Adaptive verification's budget (vLLM's ``AdaptiveVerificationManager``) decides how many drafts the target verifies
and treats the drafter as a cost already paid; whether to run the drafter at all is decided here, at the scale of
the batch.  A decode step of ``r`` requests gives ``r`` tokens in ``T(r)`` ms without drafting, and ``r (1 + a)``
tokens in ``T(r) + D(r) d / k + c v r`` with it, where ``a`` and ``v`` are the drafts accepted and verified per
request and step, ``D(r)`` the drafter's ``k`` passes for ``r`` requests, ``d`` the passes it ran and ``c`` the cost
of verifying one more token.  Drafting gives more tokens per ms iff ``a T(r) > D(r) d / k + c v r``.  The pass that
keeps the drafter's KV cache current runs either way (:mod:`kimi.spec.depth`) and is left out of both sides.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: The runner attribute that holds its profiled :class:`StepCosts`.
STEP_COSTS_ATTR = "_kimi_step_costs"


def by_size(curve: list[tuple[int, float]]) -> np.ndarray:
    """``curve`` (``(size, ms)``, sizes ascending) interpolated at every size from 0 to its last, as an array
    indexed by size (below the first size: the first point's cost)."""
    sizes, ms = np.asarray(curve, dtype=np.float64).T
    return np.interp(np.arange(int(sizes[-1]) + 1), sizes, ms)


@dataclass(frozen=True)
class StepCosts:
    """An eager engine's profiled step costs (:func:`kimi.spec.adaptive.profile_eager_costs`).

    Attributes:
        plain: ``[max_reqs + 1]`` ms of a decode step of ``r`` one-token requests, indexed by ``r``.
        drafter: ``[max_reqs + 1]`` ms of the drafter's ``k`` passes for ``r`` requests, indexed by ``r``.
        per_token: ms of verifying one more token.
        k: the drafter's ``num_speculative_tokens``.
    """

    plain: np.ndarray
    drafter: np.ndarray
    per_token: float
    k: int

    def pays(self, requests: float, accepted: float, verified: float, passes: float) -> bool:
        """Whether drafting gives more tokens per ms than a plain decode step (module docstring).

        Args:
            requests: requests in the step (rounded, clamped to the profiled range).
            accepted: drafts accepted per request and step.
            verified: drafts verified per request and step.
            passes: drafter passes per step.
        """
        r = int(min(max(round(requests), 1), len(self.plain) - 1))
        gain = accepted * self.plain[r]
        cost = self.drafter[r] * passes / self.k + self.per_token * verified * r
        return bool(gain > cost)
