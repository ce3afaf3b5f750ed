"""The one table from domain errors to gRPC status codes, TorchServe's mapping.

TorchServe turns an HTTP status into a gRPC code (``HTTP_TO_GRPC``) for errors that come
from a worker, and picks codes by hand elsewhere; ``ERROR_CODES`` is that choice per
domain error. Two calls answer differently from it, as TorchServe does:
``Predictions`` and ``StreamPredictions`` report an unknown model, and a queue that will
not take the request, as INTERNAL (``PREDICTION_CODES``), and ``DescribeModel`` with
``customized`` an unknown model as INTERNAL too (``CUSTOMIZED_DESCRIBE_CODES``).

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

from ferry.errors import (
    ArchiveError,
    ArchiveNotFound,
    ClientGone,
    ConfigError,
    DeadlineExceeded,
    FerryError,
    HandlerFailed,
    InvalidInput,
    InvalidRequest,
    InvalidWorkflow,
    ModelAlreadyExists,
    ModelApiDisabled,
    ModelLoadFailed,
    ModelNotFound,
    NoWorkerAvailable,
    Overloaded,
    PackageInstallFailed,
    RequestTooLarge,
    ResponseTimeout,
    ResponseTooLarge,
    UrlNotAllowed,
    WorkerDied,
    WorkflowAlreadyExists,
    WorkflowNotFound,
    WorkflowRegistrationFailed,
)

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


ERROR_CODES: dict[type[FerryError], StatusCode] = {
    ModelNotFound: StatusCode.NOT_FOUND,
    RequestTooLarge: StatusCode.RESOURCE_EXHAUSTED,
    ResponseTooLarge: StatusCode.INTERNAL,
    InvalidInput: StatusCode.INVALID_ARGUMENT,
    Overloaded: StatusCode.UNAVAILABLE,
    NoWorkerAvailable: StatusCode.UNAVAILABLE,
    ClientGone: StatusCode.CANCELLED,
    WorkerDied: StatusCode.INTERNAL,
    ResponseTimeout: StatusCode.DEADLINE_EXCEEDED,
    DeadlineExceeded: StatusCode.DEADLINE_EXCEEDED,
    HandlerFailed: StatusCode.INTERNAL,  # or the code the handler asked for: error_code()
    ArchiveError: StatusCode.INVALID_ARGUMENT,
    PackageInstallFailed: StatusCode.INVALID_ARGUMENT,
    ArchiveNotFound: StatusCode.NOT_FOUND,
    ConfigError: StatusCode.INVALID_ARGUMENT,
    InvalidRequest: StatusCode.INVALID_ARGUMENT,
    ModelAlreadyExists: StatusCode.ABORTED,
    ModelLoadFailed: StatusCode.INTERNAL,
    ModelApiDisabled: StatusCode.PERMISSION_DENIED,
    UrlNotAllowed: StatusCode.INVALID_ARGUMENT,
    InvalidWorkflow: StatusCode.INVALID_ARGUMENT,
    WorkflowNotFound: StatusCode.NOT_FOUND,
    WorkflowAlreadyExists: StatusCode.ABORTED,
    WorkflowRegistrationFailed: StatusCode.INTERNAL,
}

PREDICTION_CODES: dict[type[FerryError], StatusCode] = {
    **ERROR_CODES,
    ModelNotFound: StatusCode.INTERNAL,
    Overloaded: StatusCode.INTERNAL,
    NoWorkerAvailable: StatusCode.INTERNAL,
}
"""``Predictions`` and ``StreamPredictions``: TorchServe answers INTERNAL when the model
or version is unknown and when its queue does not take the job."""

CUSTOMIZED_DESCRIBE_CODES: dict[type[FerryError], StatusCode] = {
    **ERROR_CODES,
    ModelNotFound: StatusCode.INTERNAL,
}
"""``DescribeModel`` with ``customized``: the request goes to a worker, as a prediction."""


def error_code(
    error: FerryError, table: Mapping[type[FerryError], StatusCode] = ERROR_CODES
) -> StatusCode:
    """The code of the error's most specific class in ``table`` (walking its MRO, as
    ``ferry.http.errors.lookup`` does); a handler's own status (``PredictionException``)
    goes through ``from_http``; INTERNAL for a class the table does not know."""
    if isinstance(error, HandlerFailed) and error.status is not None:
        return from_http(error.status)
    for cls in type(error).__mro__:
        if cls in table:
            return table[cls]
    return StatusCode.INTERNAL


__all__ = [
    "CUSTOMIZED_DESCRIBE_CODES",
    "ERROR_CODES",
    "HTTP_TO_GRPC",
    "PREDICTION_CODES",
    "error_code",
    "from_http",
]
