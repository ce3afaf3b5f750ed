"""The one table from domain errors to HTTP status and TorchServe's error body."""

from __future__ import annotations

import json

from starlette.responses import Response

from ferry.errors import (
    ArchiveError,
    ConfigError,
    FerryError,
    HandlerFailed,
    InvalidInput,
    ModelNotFound,
    NoWorkerAvailable,
    Overloaded,
    RequestTooLarge,
    ResponseTimeout,
    WorkerDied,
)

ERROR_TABLE: dict[type[FerryError], tuple[int, str]] = {
    ModelNotFound: (404, "ModelNotFoundException"),
    RequestTooLarge: (413, "RequestEntityTooLargeException"),
    InvalidInput: (400, "BadRequestException"),
    Overloaded: (503, "ServiceUnavailableException"),
    NoWorkerAvailable: (503, "ServiceUnavailableException"),
    WorkerDied: (500, "InternalServerException"),
    ResponseTimeout: (504, "ResponseTimeoutException"),
    HandlerFailed: (500, "InternalServerException"),
    ArchiveError: (400, "InvalidModelException"),
    ConfigError: (400, "BadRequestException"),
}


def error_body(status: int, error_type: str, message: str) -> Response:
    body = json.dumps({"code": status, "type": error_type, "message": message})
    return Response(body, status_code=status, media_type="application/json")


def error_response(error: FerryError) -> Response:
    status, error_type = next(
        (entry for cls, entry in ERROR_TABLE.items() if isinstance(error, cls)),
        (500, "InternalServerException"),
    )
    if isinstance(error, HandlerFailed) and error.status is not None:
        status = error.status  # the handler asked for this code (PredictionException)
    return error_body(status, error_type, error.message)
