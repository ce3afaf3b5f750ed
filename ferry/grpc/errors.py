"""Domain errors as gRPC status codes: the gRPC column of ``ferry.error_table``, and
TorchServe's per-call departures from it.

TorchServe turns an HTTP status into a gRPC code (``HTTP_TO_GRPC``) for errors that come
from a worker, and picks codes by hand elsewhere; the table's gRPC column is that choice
per domain error (``ERROR_CODES``). Two calls answer differently from it, as TorchServe
does, through small override mappings laid over the table: ``Predictions`` and
``StreamPredictions`` report an unknown model, and a queue that will not take the
request, as INTERNAL (``PREDICTION_CODES``), and ``DescribeModel`` with ``customized`` an
unknown model as INTERNAL too (``CUSTOMIZED_DESCRIBE_CODES``).

The Open Inference Protocol's service (``open_inference``) answers with ``ERROR_CODES``
as they are: ``InvalidInput`` INVALID_ARGUMENT, ``ModelNotFound`` NOT_FOUND,
``Overloaded`` and ``NoWorkerAvailable`` UNAVAILABLE, ``ModelApiDisabled``
PERMISSION_DENIED, as KServe and Triton answer.

The details text is the error's message (TorchServe appends a Java class name on a second
line; Ferry has none to give).
"""

from __future__ import annotations

from collections.abc import Mapping

from grpc import StatusCode

from ferry.error_table import ERROR_ROWS, UNLISTED_ROW, most_specific
from ferry.errors import FerryError, HandlerFailed, ModelNotFound, NoWorkerAvailable, Overloaded

Overrides = Mapping[type[FerryError], StatusCode]
"""Codes one call answers instead of ``ERROR_CODES``' for some domain errors."""

HTTP_TO_GRPC: dict[int, StatusCode] = {
    400: StatusCode.INVALID_ARGUMENT,
    401: StatusCode.UNAUTHENTICATED,
    403: StatusCode.PERMISSION_DENIED,
    404: StatusCode.NOT_FOUND,
    409: StatusCode.ABORTED,
    413: StatusCode.RESOURCE_EXHAUSTED,
    416: StatusCode.OUT_OF_RANGE,
    429: StatusCode.RESOURCE_EXHAUSTED,
    499: StatusCode.CANCELLED,
    501: StatusCode.UNIMPLEMENTED,
    503: StatusCode.UNAVAILABLE,
    504: StatusCode.DEADLINE_EXCEEDED,
}
"""TorchServe's ``GRPCUtils.getGRPCStatusCode``; ``from_http`` adds the ranges."""


def from_http(status: int) -> StatusCode:
    """The gRPC code for an HTTP status, by TorchServe's rule.

    >>> [from_http(status).name for status in (503, 418, 502)]
    ['UNAVAILABLE', 'FAILED_PRECONDITION', 'INTERNAL']
    """
    if status in HTTP_TO_GRPC:
        return HTTP_TO_GRPC[status]
    if 200 <= status < 300:
        return StatusCode.OK
    if 400 <= status < 500:
        return StatusCode.FAILED_PRECONDITION
    if 500 <= status < 600:
        return StatusCode.INTERNAL
    return StatusCode.UNKNOWN


ERROR_CODES: Mapping[type[FerryError], StatusCode] = {
    error: StatusCode[row.grpc_code] for error, row in ERROR_ROWS.items()
}
"""Each domain error's gRPC code, read from the one table."""

NO_OVERRIDES: Overrides = {}

PREDICTION_CODES: Overrides = {
    ModelNotFound: StatusCode.INTERNAL,
    Overloaded: StatusCode.INTERNAL,
    NoWorkerAvailable: StatusCode.INTERNAL,
}
"""``Predictions`` and ``StreamPredictions``: TorchServe answers INTERNAL when the model
or version is unknown and when its queue does not take the job."""

CUSTOMIZED_DESCRIBE_CODES: Overrides = {ModelNotFound: StatusCode.INTERNAL}
"""``DescribeModel`` with ``customized``: the request goes to a worker, as a prediction."""


def error_code(error: FerryError, overrides: Overrides = NO_OVERRIDES) -> StatusCode:
    """The code of the error's most specific class in ``overrides`` laid over
    ``ERROR_CODES`` (``ferry.error_table.most_specific``), so an override for a base
    applies to its subclasses too; a handler's own status (``PredictionException``) goes
    through ``from_http``; INTERNAL for a class the table does not know."""
    if isinstance(error, HandlerFailed) and error.status is not None:
        return from_http(error.status)
    unlisted = StatusCode[UNLISTED_ROW.grpc_code]
    return most_specific(error, {**ERROR_CODES, **overrides}, unlisted)


__all__ = [
    "CUSTOMIZED_DESCRIBE_CODES",
    "ERROR_CODES",
    "HTTP_TO_GRPC",
    "NO_OVERRIDES",
    "PREDICTION_CODES",
    "Overrides",
    "error_code",
    "from_http",
]
