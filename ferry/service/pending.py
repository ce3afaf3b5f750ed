"""A request handed to its model's queue, whose answer a transport collects when its job is
done.

``FerryService.predict`` awaits one for transports that want a coroutine. The HTTP
transport takes it as it is: it waits on the job's own future (and the parts a handler
streams) with no task or queue of its own per request (about 5% of the server's calls
per request on a no-op model).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable

from ferry.errors import DeadlineExceeded, FerryError, ResponseTooLarge
from ferry.handlers.contract.context import SEQUENCE_ID_HEADER
from ferry.metrics.definitions import ModelMetrics
from ferry.scheduling.jobs import Job, Prediction


class PendingPrediction:
    """One submitted request. Its bookkeeping (metrics, the client's request id; its
    deadline timer is the runner's) is settled as soon as its job is done, however it ends:
    answered, failed, or cancelled because the transport gave up on it."""

    def __init__(
        self,
        job: Job,
        joined: list[bytes],
        max_response_size: int,
        metrics: ModelMetrics,
        release: Callable[[str], None],
    ) -> None:
        self.job = job
        self._joined = joined
        self._max_response_size = max_response_size
        self._metrics = metrics
        self._release = release
        job.future.add_done_callback(self._settle)

    @property
    def future(self) -> asyncio.Future[Prediction]:
        """Done when the request is answered or has failed."""
        return self.job.future

    @property
    def sequence_id(self) -> str | None:
        """The stateful sequence the request joined (named by the server if the client
        named none); None for a model without sequences."""
        return self.job.sequence_id

    def cancel(self) -> None:
        """The transport no longer waits (its client or the server went away)."""
        self.job.future.cancel()

    def result(self) -> Prediction:
        """The answer once ``future`` is done; raises the request's ``FerryError``. Parts
        streamed to no one (a transport that cannot stream) are joined before the last.
        A stateful sequence's answer names it (``ts_request_sequence_id``), so a client
        whose sequence the server named learns the name."""
        answer = self.job.future.result()
        body = b"".join([*self._joined, answer.body]) if self._joined else answer.body
        if len(body) > self._max_response_size:
            raise ResponseTooLarge(
                f"response of {len(body)} bytes exceeds max_response_size {self._max_response_size}"
            )
        sequence = self.job.sequence_id
        if sequence is not None and SEQUENCE_ID_HEADER not in answer.headers:
            headers = {**answer.headers, SEQUENCE_ID_HEADER: sequence}
            return dataclasses.replace(answer, body=body, headers=headers)
        return dataclasses.replace(answer, body=body) if self._joined else answer

    def _settle(self, future: asyncio.Future[Prediction]) -> None:
        self._release(self.job.item.request_id)
        job = self.job
        self._metrics.request_done(time.monotonic() - job.enqueued_at, job.queued_seconds)
        error = _error_of(future)
        self._metrics.request_outcome("ok" if error is None else _outcome(error))
        if isinstance(error, DeadlineExceeded):
            self._metrics.shed(1)


def _outcome(error: BaseException) -> str:
    """A failed request's outcome label: its error's kind (a bounded set: Ferry's errors,
    ``Cancelled`` when its transport gave up on it, ``Error`` for anything else)."""
    if isinstance(error, asyncio.CancelledError):
        return "Cancelled"
    return type(error).__name__ if isinstance(error, FerryError) else "Error"


def _error_of(future: asyncio.Future[Prediction]) -> BaseException | None:
    """What the request failed with: its error, ``CancelledError`` when the transport gave
    up on it, None when answered."""
    if future.cancelled():
        return asyncio.CancelledError()
    return future.exception()
