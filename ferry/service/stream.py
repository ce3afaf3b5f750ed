"""What a transport reads of one submitted request: the parts its handler streams
(``send_intermediate_predict_response``), then its answer or its error, in the order they
came. Every transport that streams (HTTP's chunked responses, TorchServe's gRPC
``StreamPredictions`` and the sequences of ``StreamPredictions2``) reads it, so the order,
the bound on what waits for a slow reader and the end of the stream are decided once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from ferry.errors import ClientGone, FerryError, ResponseTooLarge
from ferry.service.pending import PendingPrediction
from ferry.service.types import Prediction, PredictionPart


@dataclass(frozen=True)
class Failed:
    """The request's end when it failed."""

    error: FerryError


Event = PredictionPart | Prediction | Failed
"""Parts come first; a ``Prediction`` or a ``Failed`` is the last event."""


class AnswerStream:
    """One request's events, queued as they come: nothing runs on its own (the events are
    its job's parts and its future's end). Pass ``on_part`` as the request's
    ``PredictionRequest.on_part``, then ``watch`` the submitted request."""

    def __init__(self, max_pending_bytes: int) -> None:
        self._events: deque[Event] = deque()
        self._wakeup: asyncio.Future[None] | None = None
        self.answer: Prediction | None = None
        """The answer, once it came."""
        self._pending_bytes = 0
        self._max_pending_bytes = max_pending_bytes

    def watch(self, pending: PendingPrediction) -> None:
        """End the stream with ``pending``'s answer or error once it is done."""
        pending.future.add_done_callback(lambda _: self._push(self._outcome(pending)))

    def fail(self, error: FerryError) -> None:
        """End the stream with ``error`` (a request refused before it was queued)."""
        self._push(Failed(error))

    def on_part(self, part: PredictionPart) -> None:
        """Queue a part for the reader. A handler streaming faster than its reader may
        hold at most ``max_pending_bytes`` here; past that the request fails
        (``ResponseTooLarge``), so a slow reader cannot grow the server's memory."""
        if self._pending_bytes + len(part.body) > self._max_pending_bytes:
            raise ResponseTooLarge(
                f"the client fell behind the stream by over {self._max_pending_bytes} bytes"
            )
        self._pending_bytes += len(part.body)
        self._push(part)

    def _outcome(self, pending: PendingPrediction) -> Prediction | Failed:
        if pending.future.cancelled():  # the transport gave up: read only if someone still is
            return Failed(ClientGone("the request was cancelled"))
        try:
            self.answer = pending.result()
        except FerryError as error:
            return Failed(error)
        return self.answer

    def _push(self, event: Event) -> None:
        self._events.append(event)
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    async def next(self) -> Event:
        """The next event, waiting for it."""
        while not self._events:
            self._wakeup = asyncio.get_running_loop().create_future()
            await self._wakeup
        event = self._events.popleft()
        if isinstance(event, PredictionPart):
            self._pending_bytes -= len(event.body)
        return event


def is_last(event: Event) -> bool:
    """Whether ``event`` ends its stream."""
    return not isinstance(event, PredictionPart)


__all__ = ["AnswerStream", "Event", "Failed", "is_last"]
