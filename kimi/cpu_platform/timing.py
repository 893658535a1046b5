"""Step timing on the torch-only CPU platform.

vLLM's CPU worker replaces ``torch.cuda.Event`` with a placeholder whose ``record`` does nothing
(``vllm/v1/worker/cpu/shm.py``), so the V2 runner's ``StepTimingCollector`` (which adaptive verification
profiles its cost curves with) has no ``elapsed_time`` to read.  On a CPU every torch op has finished when
the call returns, so the host clock at ``record`` is the event's time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class HostClockEvent:
    """A ``torch.cuda.Event`` stand-in for a CPU device: ``record`` reads ``time.perf_counter``."""

    def __init__(self, *args, **kwargs) -> None:
        self._at: float | None = None

    def record(self, *args, **kwargs) -> None:
        self._at = time.perf_counter()

    def synchronize(self) -> None:
        """Nothing to wait for: CPU ops are done when they return."""

    def wait(self, *args, **kwargs) -> None:
        """Nothing to wait for: CPU ops are done when they return."""

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: HostClockEvent) -> float:
        """Milliseconds from this event's ``record`` to ``end``'s.

        Raises:
            RuntimeError: either event was never recorded.
        """
        if self._at is None or end._at is None:
            raise RuntimeError("elapsed_time between events that were not both recorded")
        return (end._at - self._at) * 1e3


@contextmanager
def host_clock_events() -> Iterator[None]:
    """Within the block, ``torch.cuda.Event`` is :class:`HostClockEvent` (restored on the way out)."""
    saved = torch.cuda.Event
    torch.cuda.Event = HostClockEvent
    try:
        yield
    finally:
        torch.cuda.Event = saved
