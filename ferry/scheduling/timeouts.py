"""When a batch's answer is due (``ferry.scheduling.dispatcher``): ``response_timeout``
from when the worker can start on it, restarted by each part it streams (as TorchServe)
within ``stream_timeout`` in all, and ``cancel_grace`` once every client of the batch went
away."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ferry.scheduling.lanes import Exchange


@dataclass(frozen=True)
class BatchTimeouts:
    response_timeout: float
    """Seconds a worker has to answer a batch, or between two parts it streams."""
    stream_timeout: float | None
    """Seconds a batch may stream in all, however often it sends parts."""
    cancel_grace: float
    """Seconds a worker has to stop a batch whose clients all went away."""
    clock: Callable[[], float]

    def due(self, started_at: float) -> float:
        """When a batch the worker can start on at ``started_at`` must be answered."""
        return started_at + self.response_timeout

    def remaining(self, exchange: Exchange) -> float:
        return max(0.0, exchange.deadline - self.clock())

    def after_part(self, exchange: Exchange) -> float:
        """When the batch must end, now that it streamed a part: each part restarts
        ``response_timeout`` (a silent stream is still cut off), within ``stream_timeout``
        in all; a batch nobody reads keeps its grace's end."""
        if exchange.abandoned():
            return exchange.deadline
        deadline = self.clock() + self.response_timeout
        if self.stream_timeout is not None:
            deadline = min(deadline, exchange.started_at + self.stream_timeout)
        return deadline

    def abandon(self, exchange: Exchange) -> None:
        """Every request of the batch lost its client: the worker has ``cancel_grace``."""
        exchange.abandoned_at = self.clock()
        exchange.deadline = min(exchange.deadline, exchange.abandoned_at + self.cancel_grace)

    def overdue(self, exchange: Exchange) -> str:
        """Why ``exchange`` ran out of time, in words for the log and the error."""
        if exchange.abandoned():
            return f"did not stop within {self.cancel_grace:g}s after its clients went away"
        limit = self.stream_timeout
        if limit is not None and self.clock() >= exchange.started_at + limit:
            return f"streamed for longer than stream_timeout {limit:g}s"
        return f"did not answer within {self.response_timeout:g}s"


__all__ = ["BatchTimeouts"]
