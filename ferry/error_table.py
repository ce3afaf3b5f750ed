"""The one table from Ferry's domain errors to what each transport answers.

One row per domain error, one column per transport: the HTTP status and TorchServe's
error ``type`` (``ferry.http.errors``), and the gRPC status code (``ferry.grpc.errors``).
A new domain error gets one row here, and every transport answers it. The table is
looked up by the error's class hierarchy, most specific class first (``most_specific``,
as Starlette's ``_lookup_exception_handler``), so a subclass with no row answers as its
nearest listed base: ``ModelConfigError`` as ``ArchiveError``, its first base.

The gRPC column holds the ``grpc.StatusCode`` *name*, so this module imports no
transport; ``ferry.grpc.errors`` turns the name into the code. Per-call departures from
the table (TorchServe's gRPC ``Predictions`` answering INTERNAL for an unknown model)
are small override mappings kept by the transport that needs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar

from ferry.errors import (
    ArchiveError,
    ArchiveNotFound,
    ClientGone,
    ConfigError,
    DeadlineExceeded,
    FerryError,
    HandlerFailed,
    InsufficientMemory,
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
    SequenceEnded,
    UrlNotAllowed,
    WorkerDied,
    WorkflowAlreadyExists,
    WorkflowNotFound,
    WorkflowRegistrationFailed,
)

GrpcCodeName = Literal[
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
]
"""The names of ``grpc.StatusCode``'s members, so a misspelt code fails type checking."""


@dataclass(frozen=True, slots=True)
class ErrorRow:
    """What each transport answers for one domain error."""

    http_status: int
    torchserve_type: str
    """The ``type`` of TorchServe's JSON error body, e.g. ``ModelNotFoundException``."""
    grpc_code: GrpcCodeName


ERROR_ROWS: Mapping[type[FerryError], ErrorRow] = {
    ModelNotFound: ErrorRow(404, "ModelNotFoundException", "NOT_FOUND"),
    RequestTooLarge: ErrorRow(413, "RequestEntityTooLargeException", "RESOURCE_EXHAUSTED"),
    ResponseTooLarge: ErrorRow(500, "ResponseTooLargeException", "INTERNAL"),
    InvalidInput: ErrorRow(400, "BadRequestException", "INVALID_ARGUMENT"),
    Overloaded: ErrorRow(503, "ServiceUnavailableException", "UNAVAILABLE"),
    NoWorkerAvailable: ErrorRow(503, "ServiceUnavailableException", "UNAVAILABLE"),
    # 499 is nginx's code for a client that hung up; nobody reads the answer.
    ClientGone: ErrorRow(499, "ClientClosedRequestException", "CANCELLED"),
    WorkerDied: ErrorRow(500, "InternalServerException", "INTERNAL"),
    ResponseTimeout: ErrorRow(504, "ResponseTimeoutException", "DEADLINE_EXCEEDED"),
    DeadlineExceeded: ErrorRow(504, "DeadlineExceededException", "DEADLINE_EXCEEDED"),
    # Unless the handler chose a status (``HandlerFailed.status``): each transport's
    # ``error_response`` / ``error_code`` answers that one instead.
    HandlerFailed: ErrorRow(500, "InternalServerException", "INTERNAL"),
    SequenceEnded: ErrorRow(409, "ConflictStatusException", "ABORTED"),
    ArchiveError: ErrorRow(400, "InvalidModelException", "INVALID_ARGUMENT"),
    PackageInstallFailed: ErrorRow(400, "ModelException", "INVALID_ARGUMENT"),
    ArchiveNotFound: ErrorRow(404, "ModelNotFoundException", "NOT_FOUND"),
    ConfigError: ErrorRow(400, "BadRequestException", "INVALID_ARGUMENT"),
    InvalidRequest: ErrorRow(400, "BadRequestException", "INVALID_ARGUMENT"),
    ModelAlreadyExists: ErrorRow(409, "ConflictStatusException", "ABORTED"),
    ModelLoadFailed: ErrorRow(500, "InternalServerException", "INTERNAL"),
    # 507 Insufficient Storage: what SageMaker's multi-model endpoints read to evict a
    # model and retry the load.
    InsufficientMemory: ErrorRow(507, "InsufficientMemoryException", "RESOURCE_EXHAUSTED"),
    ModelApiDisabled: ErrorRow(405, "MethodNotAllowedException", "PERMISSION_DENIED"),
    UrlNotAllowed: ErrorRow(400, "InvalidUrlException", "INVALID_ARGUMENT"),
    InvalidWorkflow: ErrorRow(400, "InvalidDAGException", "INVALID_ARGUMENT"),
    WorkflowNotFound: ErrorRow(404, "WorkflowNotFoundException", "NOT_FOUND"),
    WorkflowAlreadyExists: ErrorRow(409, "ConflictStatusException", "ABORTED"),
    WorkflowRegistrationFailed: ErrorRow(500, "WorkflowException", "INTERNAL"),
}

UNLISTED_ROW = ErrorRow(500, "InternalServerException", "INTERNAL")
"""The answer for an error whose classes have no row: a bug, so an internal error."""

Entry = TypeVar("Entry")


def most_specific(
    error: FerryError, table: Mapping[type[FerryError], Entry], default: Entry
) -> Entry:
    """The entry of the error's most specific class in ``table``: its method resolution
    order is walked, so a subclass's row wins over its base's wherever either sits in
    the table; ``default`` when no class of the error has one.

    >>> most_specific(ArchiveNotFound("a"), ERROR_ROWS, UNLISTED_ROW).http_status
    404
    """
    for cls in type(error).__mro__:
        if cls in table:
            return table[cls]
    return default


def error_row(error: FerryError) -> ErrorRow:
    """The error's row in ``ERROR_ROWS``, or ``UNLISTED_ROW``."""
    return most_specific(error, ERROR_ROWS, UNLISTED_ROW)


__all__ = [
    "ERROR_ROWS",
    "UNLISTED_ROW",
    "ErrorRow",
    "GrpcCodeName",
    "error_row",
    "most_specific",
]
