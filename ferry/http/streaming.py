"""A prediction as HTTP: one response, or — when the handler streams parts
(``send_intermediate_predict_response``) — a chunked response, one chunk per part.

As in TorchServe, the first part decides the status, content type and headers of the whole
response; the handler's last answer is the last chunk. An error after parts went out
cannot change the status any more: it becomes the last chunk (the JSON error body) and
is logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from starlette.responses import Response, StreamingResponse

from ferry.errors import FerryError, ResponseTooLarge
from ferry.http.errors import error_response
from ferry.service.pending import PendingPrediction
from ferry.service.types import OnPredictionPart, Prediction, PredictionPart

log = logging.getLogger("ferry.http")


@dataclass(frozen=True)
class Failed:
    error: FerryError


Event = PredictionPart | Prediction | Failed


class PredictionEvents:
    """Parts and the final answer (or error) of one submitted request, in the order they
    came. Nothing runs on its own: the events are the job's parts and its future's end."""

    def __init__(self, max_pending_bytes: int) -> None:
        self._events: deque[Event] = deque()
        self._wakeup: asyncio.Future[None] | None = None
        self.answer: Prediction | None = None
        self._pending_bytes = 0
        self._max_pending_bytes = max_pending_bytes

    def watch(self, pending: PendingPrediction) -> None:
        pending.future.add_done_callback(lambda _: self._push(self._outcome(pending)))

    def on_part(self, part: PredictionPart) -> None:
        """Queue a part for the client. A handler streaming faster than its client reads
        may hold at most ``max_pending_bytes`` here; past that the request fails
        (``ResponseTooLarge``), so a slow reader cannot grow the server's memory."""
        if self._pending_bytes + len(part.body) > self._max_pending_bytes:
            raise ResponseTooLarge(
                f"the client fell behind the stream by over {self._max_pending_bytes} bytes"
            )
        self._pending_bytes += len(part.body)
        self._push(part)

    def _outcome(self, pending: PendingPrediction) -> Prediction | Failed | None:
        if pending.future.cancelled():
            return None  # the transport gave up: no one reads on
        try:
            self.answer = pending.result()
        except FerryError as error:
            return Failed(error)
        return self.answer

    def _push(self, event: Event | None) -> None:
        if event is None:
            return
        self._events.append(event)
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    async def next(self) -> Event:
        while not self._events:
            self._wakeup = asyncio.get_running_loop().create_future()
            await self._wakeup
        event = self._events.popleft()
        if isinstance(event, PredictionPart):
            self._pending_bytes -= len(event.body)
        return event


async def prediction_response(
    submit: Callable[[OnPredictionPart], PendingPrediction], max_pending_bytes: int
) -> tuple[Response, PredictionEvents]:
    """The response for the request ``submit`` queues: plain, or streamed once the
    handler sends a part (at most ``max_pending_bytes`` of parts waiting for a slow
    client)."""
    events = PredictionEvents(max_pending_bytes)
    pending = submit(events.on_part)
    events.watch(pending)
    try:
        first = await events.next()
    except asyncio.CancelledError:
        pending.cancel()
        raise
    if isinstance(first, Failed):
        return error_response(first.error), events
    if isinstance(first, Prediction):
        return _plain(first), events
    return _streamed(first, events, pending), events


def _plain(answer: Prediction) -> Response:
    return Response(
        answer.body,
        status_code=answer.status,
        headers={**answer.headers, "x-request-id": answer.request_id},
        media_type=answer.content_type,
    )


def _streamed(
    first: PredictionPart, events: PredictionEvents, pending: PendingPrediction
) -> StreamingResponse:
    async def chunks() -> AsyncIterator[bytes]:
        try:
            yield first.body
            while True:
                event = await events.next()
                if isinstance(event, PredictionPart):
                    yield event.body
                elif isinstance(event, Prediction):
                    yield event.body
                    return
                else:
                    log.error(
                        "request %s failed after streaming parts: %s",
                        first.request_id,
                        event.error,
                    )
                    yield bytes(error_response(event.error).body)
                    return
        finally:
            pending.cancel()  # the client went away: stop waiting for the rest

    return StreamingResponse(
        chunks(),
        status_code=first.status,
        headers={"x-request-id": first.request_id},
        media_type=first.content_type,
    )
