"""When to hand a batch to an idle worker: pure logic, clock injected by the caller.

Rules, checked in order whenever a worker asks for work:

1. A full batch (``batch_size`` queued) goes at once.
2. ``max_batch_delay`` is an upper bound counted from the oldest request's arrival: once it
   has passed, whatever is queued goes.
3. Otherwise wait only when waiting pays: the rate at which requests have recently
   arrived *while others were already waiting* must promise at least one more arrival
   before the deadline, and the stream must not have gone quiet (no arrival for a few
   expected gaps). A closed-loop client at concurrency 1 never sends while its request is
   waiting, so that rate is ~0 and its requests go at once; under load requests pile up
   while workers are busy, the rate is high, and batches fill.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

QUIET_GAPS = 3.0
"""A stream silent for this many expected inter-arrival gaps is taken to have paused."""


class WaitingArrivalRate:
    """Arrivals per second into a non-empty queue, exponentially decayed over ``half_life``.

    Counts only requests that joined others already waiting, divided by the time the queue
    held waiting requests: the rate that tells whether waiting will grow a batch.
    """

    def __init__(self, half_life: float = 2.0) -> None:
        self._decay = math.log(2) / half_life
        self._arrivals = 0.0
        self._waiting_seconds = 0.0
        self._last: float | None = None

    def advance(self, now: float, queue_was_waiting: bool) -> None:
        """Account for the time since the last event; call before every queue change."""
        if self._last is not None and now > self._last:
            elapsed = now - self._last
            factor = math.exp(-self._decay * elapsed)
            self._arrivals *= factor
            self._waiting_seconds *= factor
            if queue_was_waiting:
                self._waiting_seconds += elapsed
        self._last = now if self._last is None else max(now, self._last)

    def record_arrival(self, joined_waiting_queue: bool) -> None:
        if joined_waiting_queue:
            self._arrivals += 1.0

    def per_second(self) -> float:
        # Too little observed waiting time says nothing; treat it as "no evidence".
        if self._waiting_seconds < 1e-4:
            return 0.0
        return self._arrivals / self._waiting_seconds


@dataclass(frozen=True)
class Decision:
    dispatch: bool
    wake_at: float | None = None
    """When not dispatching: when to decide again at the latest (None: on the next arrival)."""


def decide(
    *,
    now: float,
    queued: int,
    oldest_arrival: float,
    last_arrival: float,
    batch_size: int,
    max_delay: float,
    arrival_rate: float,
) -> Decision:
    """Whether an idle worker should take what is queued now."""
    if queued == 0:
        return Decision(dispatch=False)
    if queued >= batch_size:
        return Decision(dispatch=True)
    deadline = oldest_arrival + max_delay
    if now >= deadline or arrival_rate <= 0:
        return Decision(dispatch=True)
    if arrival_rate * (deadline - now) < 1.0:
        return Decision(dispatch=True)
    quiet_after = last_arrival + QUIET_GAPS / arrival_rate
    if now >= quiet_after:
        return Decision(dispatch=True)
    return Decision(dispatch=False, wake_at=min(deadline, quiet_after))
