"""Domain errors as HTTP answers: the HTTP columns of ``ferry.error_table`` and
TorchServe's JSON error body."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from ferry.echo import capped, capped_message
from ferry.error_table import ERROR_ROWS, UNLISTED_ROW, most_specific
from ferry.errors import FerryError, HandlerFailed

ERROR_TABLE: Mapping[type[FerryError], tuple[int, str]] = {
    error: (row.http_status, row.torchserve_type) for error, row in ERROR_ROWS.items()
}
"""Each domain error's HTTP status and TorchServe error type, read from the one table."""


def error_body(status: int, error_type: str, message: str) -> Response:
    """TorchServe's JSON error body; the message cut to ``MESSAGE_LIMIT`` (it may hold
    a client's path or model name: ``ferry.echo``)."""
    body = json.dumps({"code": status, "type": error_type, "message": capped_message(message)})
    return Response(body, status_code=status, media_type="application/json")


def lookup(
    error: FerryError, table: Mapping[type[FerryError], tuple[int, str]] = ERROR_TABLE
) -> tuple[int, str]:
    """The status and type of the error's most specific class in ``table``
    (``ferry.error_table.most_specific``); 500 for a class the table does not know."""
    unlisted = (UNLISTED_ROW.http_status, UNLISTED_ROW.torchserve_type)
    return most_specific(error, table, unlisted)


def error_response(error: FerryError) -> Response:
    status, error_type = lookup(error)
    if isinstance(error, HandlerFailed) and error.status is not None:
        status = error.status  # the handler asked for this code (PredictionException)
    return error_body(status, error_type, error.message)


Endpoint = Callable[[Request], Awaitable[Response]]
ExceptionHandler = Callable[[Request, Exception], Awaitable[Response]]
StatusRecorder = Callable[[int], None]
log = logging.getLogger("ferry.http")


def _ignore(status: int) -> None:
    pass


def guarded(endpoint: Endpoint, record: StatusRecorder = _ignore) -> Endpoint:
    """Answer the domain errors an endpoint raises through ``ERROR_TABLE``, and report
    every response's status to ``record``."""

    async def call(request: Request) -> Response:
        try:
            response = await endpoint(request)
        except FerryError as error:
            response = error_response(error)
        record(response.status_code)
        return response

    return call


def exception_handlers(
    record: StatusRecorder = _ignore,
) -> dict[Any, ExceptionHandler]:
    """Starlette's own errors (no route, wrong method, a bug) with TorchServe's body."""

    async def not_found(request: Request, exc: Exception) -> Response:
        record(404)
        return error_body(404, "ResourceNotFoundException", "Requested resource is not found")

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        record(405)
        response = error_body(405, "MethodNotAllowedException", "Requested method is not allowed")
        response.headers.update(getattr(exc, "headers", None) or {})  # the route's Allow
        return response

    async def client_gone(request: Request, exc: Exception) -> Response:
        # The client left mid-body, or the listener answered 408 for a body that did not
        # come (ferry.http.protocol): as for ClientGone, no one reads this, and no bug.
        log.debug("client disconnected during %s %s", request.method, capped(request.url.path))
        record(499)
        return error_body(499, "ClientClosedRequestException", "the client closed the connection")

    async def internal_error(request: Request, exc: Exception) -> Response:
        log.error("unhandled error on %s", capped(request.url.path), exc_info=exc)
        record(500)
        return error_body(500, "InternalServerException", f"{type(exc).__name__}: {exc}")

    return {
        404: not_found,
        405: method_not_allowed,
        ClientDisconnect: client_gone,
        500: internal_error,
    }
