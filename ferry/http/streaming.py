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
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from starlette.responses import Response, StreamingResponse

from ferry.errors import FerryError, ResponseTooLarge
from ferry.http.errors import error_response
from ferry.service_types import OnPredictionPart, Prediction, PredictionPart

log = logging.getLogger("ferry.http")


@dataclass(frozen=True)
class Failed:
    error: FerryError


Event = PredictionPart | Prediction | Failed


class PredictionEvents:
    """Parts and the final answer (or error) of one prediction, in the order they came."""

    def __init__(self, max_pending_bytes: int) -> None:
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self.answer: Prediction | None = None
        self._pending_bytes = 0
        self._max_pending_bytes = max_pending_bytes

    def on_part(self, part: PredictionPart) -> None:
        """Queue a part for the client. A handler streaming faster than its client reads
        may hold at most ``max_pending_bytes`` here; past that the request fails
        (``ResponseTooLarge``), so a slow reader cannot grow the server's memory."""
        if self._pending_bytes + len(part.body) > self._max_pending_bytes:
            raise ResponseTooLarge(
                f"the client fell behind the stream by over {self._max_pending_bytes} bytes"
            )
        self._pending_bytes += len(part.body)
        self._queue.put_nowait(part)

    async def run(self, predict: Callable[[OnPredictionPart], Awaitable[Prediction]]) -> None:
        try:
            self.answer = await predict(self.on_part)
        except FerryError as error:
            self._queue.put_nowait(Failed(error))
        else:
            self._queue.put_nowait(self.answer)

    async def next(self) -> Event:
        event = await self._queue.get()
        if isinstance(event, PredictionPart):
            self._pending_bytes -= len(event.body)
        return event


async def prediction_response(
    predict: Callable[[OnPredictionPart], Awaitable[Prediction]], max_pending_bytes: int
) -> tuple[Response, PredictionEvents]:
    """The response for ``predict``: plain, or streamed once the handler sends a part
    (at most ``max_pending_bytes`` of parts waiting for a slow client)."""
    events = PredictionEvents(max_pending_bytes)
    task = asyncio.ensure_future(events.run(predict))
    try:
        first = await events.next()
    except asyncio.CancelledError:
        task.cancel()
        raise
    if isinstance(first, Failed):
        return error_response(first.error), events
    if isinstance(first, Prediction):
        return _plain(first), events
    return _streamed(first, events, task), events


def _plain(answer: Prediction) -> Response:
    return Response(
        answer.body,
        status_code=answer.status,
        headers={**answer.headers, "x-request-id": answer.request_id},
        media_type=answer.content_type,
    )


def _streamed(
    first: PredictionPart, events: PredictionEvents, task: asyncio.Future[None]
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
            task.cancel()  # the client went away: stop waiting for the rest

    return StreamingResponse(
        chunks(),
        status_code=first.status,
        headers={"x-request-id": first.request_id},
        media_type=first.content_type,
    )
