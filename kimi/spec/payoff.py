"""Whether drafting pays on an eager engine, from the engine's own step times.

Adaptive verification's budget (vLLM's ``AdaptiveVerificationManager``) decides how many drafts the target verifies
and treats the drafter as a cost already paid; whether to run the drafter at all is decided here, at the scale of
the batch, by comparing token rates the engine measured on itself: a decode step of ``r`` requests without drafts
gives ``r`` tokens in ``P(r)`` ms, a drafting step gives the tokens it emitted (``r`` plus the accepted drafts) in
the time it took (the drafter's passes, the larger verification forward, the rejection sampler).  Drafting pays
over a window of steps iff ``sum(tokens) / sum(ms) > sum(r) / sum(P(r))``, the plain rate taken at the window's own
batch sizes.

On the host-synchronous CPU engine a step's time is the wall time between two consecutive calls of the runner's
draft hook (:mod:`kimi.spec.depth`): it covers the drafter's passes that made the step's drafts, scheduling, the
forward and the sampler.  ``P(r)`` comes from steps that decoded without drafts (a pause's, or a few taken on
purpose while drafting, :data:`RESAMPLE_EVERY`), kept per batch-size bucket (:func:`bucket`) as an exponential
average: no start-up profile prices it, so the decision follows the machine as it is while it serves (a profile
taken while other processes start can be off by an order of magnitude: ``benchmarks/results/adaptive.md``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

#: Weight of a new sample in a bucket's average plain-step time.
EMA_WEIGHT = 0.3
#: Steps after which a bucket's plain-step time is measured again while drafting.
RESAMPLE_EVERY = 64
#: A probe's rate must beat the plain rate by this factor to end a pause (one step's time is noisy).
RESUME_MARGIN = 1.05


def bucket(requests: int) -> int:
    """The batch-size bucket of ``requests``: itself below 8, else rounded down to a multiple of 8."""
    return requests if requests < 8 else requests - requests % 8


@dataclass(frozen=True)
class TimedStep:
    """One decode step as the engine ran it (no prefill in the batch).

    Attributes:
        requests: requests in the step.
        tokens: tokens the step emitted over all of them.
        ms: the step's wall time, ms.
    """

    requests: int
    tokens: int
    ms: float


@dataclass
class PlainSteps:
    """Average wall time of decode steps without drafts, per batch-size bucket (:func:`bucket`).

    Attributes:
        buckets: bucket -> ``[average ms, average requests, step of the last sample]``.
    """

    buckets: dict[int, list[float]] = field(default_factory=dict)

    def add(self, step: TimedStep, at: int) -> None:
        """Fold in a step that decoded without drafts, taken at step number ``at``."""
        held = self.buckets.get(bucket(step.requests))
        if held is None:
            self.buckets[bucket(step.requests)] = [step.ms, float(step.requests), float(at)]
            return
        held[0] += EMA_WEIGHT * (step.ms - held[0])
        held[1] += EMA_WEIGHT * (step.requests - held[1])
        held[2] = float(at)

    def ms(self, requests: int) -> float | None:
        """Expected ms of a plain step of ``requests``: its bucket's average scaled by the request count; None
        when the bucket has no sample."""
        held = self.buckets.get(bucket(requests))
        return None if held is None else held[0] * requests / held[1]

    def stale(self, requests: int, now: int) -> bool:
        """Whether ``requests``' bucket has no sample taken within :data:`RESAMPLE_EVERY` steps of ``now``."""
        held = self.buckets.get(bucket(requests))
        return held is None or now - held[2] >= RESAMPLE_EVERY

    def beaten_by(self, steps: Iterable[TimedStep], margin: float = 1.0) -> bool | None:
        """Whether ``steps`` emitted tokens faster than plain steps of the same batch sizes would have, by
        ``margin`` (module docstring); None when a step's bucket has no plain sample."""
        steps = list(steps)
        plain = [self.ms(s.requests) for s in steps]
        if not steps or any(p is None for p in plain):
            return None
        tokens, ms = sum(s.tokens for s in steps), sum(s.ms for s in steps)
        return tokens * sum(plain) > margin * sum(s.requests for s in steps) * ms
