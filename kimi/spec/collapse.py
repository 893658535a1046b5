"""One warning when a drafter's acceptance falls far below its recent level.

Acceptance here is accepted drafts per verified draft, over the whole engine (host numbers, one update per
step).  Two exponential averages weighted by verified drafts follow it: *recent* forgets with a half-life of
:data:`RECENT_HALF_LIFE` drafts, *current* with :data:`CURRENT_HALF_LIFE`.  Once *recent* has seen
:data:`MIN_DRAFTS` drafts, *current* falling below :data:`FALL_RATIO` x *recent* logs one warning naming the
drafter and both levels; the monitor warns again only after *current* has come back to :data:`REARM_RATIO` x
*recent* (a new episode).  The levels are documented constants, not config knobs: they decide a log line, not
what the engine does.
"""

from __future__ import annotations

import logging

#: Half-life of the recent level, in verified drafts.
RECENT_HALF_LIFE = 512.0
#: Half-life of the current level, in verified drafts.
CURRENT_HALF_LIFE = 32.0
#: Verified drafts the recent level needs before a fall is judged.
MIN_DRAFTS = 256.0
#: Current below this share of recent is a collapse.
FALL_RATIO = 0.5
#: Current back at this share of recent ends the episode (the next fall warns again).
REARM_RATIO = 0.8


class _Average:
    """Accepted per verified draft, each draft's weight halving every ``half_life`` drafts after it."""

    def __init__(self, half_life: float):
        self.half_life = half_life
        self.accepted = 0.0
        self.verified = 0.0
        self.seen = 0.0

    def add(self, verified: float, accepted: float) -> None:
        keep = 0.5 ** (verified / self.half_life)
        self.accepted = self.accepted * keep + accepted
        self.verified = self.verified * keep + verified
        self.seen += verified

    @property
    def level(self) -> float:
        return self.accepted / self.verified if self.verified > 0 else float("nan")


class CollapseMonitor:
    """Watches one drafter's acceptance; :meth:`observe` logs the warning (module docstring).

    Args:
        drafter: the drafter's name in the warning (its model path or id).
        logger: where the warning goes.
        emit: False on ranks that should stay quiet (every rank watches; one logs).
    """

    def __init__(self, drafter: str, logger: logging.Logger, emit: bool = True):
        self.drafter = drafter
        self.logger = logger
        self.emit = emit
        self.recent = _Average(RECENT_HALF_LIFE)
        self.current = _Average(CURRENT_HALF_LIFE)
        self.collapsed = False

    def observe(self, verified: float, accepted: float) -> bool:
        """Add one step's totals (drafts verified, of which accepted); True when this step starts a collapse."""
        if verified <= 0:
            return False
        before = self.recent.level
        self.recent.add(verified, accepted)
        self.current.add(verified, accepted)
        recent, current = self.recent.level, self.current.level
        if self.collapsed:
            self.collapsed = current < REARM_RATIO * recent
            return False
        if self.recent.seen < MIN_DRAFTS or not current < FALL_RATIO * recent:
            return False
        self.collapsed = True
        if self.emit:
            self.logger.warning(
                "EAGLE-3 drafter %s: draft acceptance fell to %.2f (last ~%d verified drafts) from a recent %.2f "
                "(last ~%d); requests whose drafts keep failing stop drafting and are probed again later",
                self.drafter, current, int(CURRENT_HALF_LIFE), before, int(RECENT_HALF_LIFE))
        return True
