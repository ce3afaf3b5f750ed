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
from collections.abc import AsyncIterator, Callable

from starlette.responses import Response, StreamingResponse

from ferry.http.errors import error_response
from ferry.service.pending import PendingPrediction
from ferry.service.stream import AnswerStream, Failed
from ferry.service.types import OnPredictionPart, Prediction, PredictionPart

log = logging.getLogger("ferry.http")


async def prediction_response(
    submit: Callable[[OnPredictionPart], PendingPrediction], max_pending_bytes: int
) -> tuple[Response, AnswerStream]:
    """The response for the request ``submit`` queues: plain, or streamed once the
    handler sends a part (at most ``max_pending_bytes`` of parts waiting for a slow
    client)."""
    events = AnswerStream(max_pending_bytes)
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
    first: PredictionPart, events: AnswerStream, pending: PendingPrediction
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
