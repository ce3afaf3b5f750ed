"""The gRPC error table: TorchServe's HTTP -> gRPC conversion, and each domain error's code."""

from __future__ import annotations

import pytest
from grpc import StatusCode

from ferry import errors
from ferry.grpc.errors import (
    CUSTOMIZED_DESCRIBE_CODES,
    ERROR_CODES,
    PREDICTION_CODES,
    error_code,
    from_http,
)
from ferry.http.errors import ERROR_TABLE


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (200, StatusCode.OK),
        (202, StatusCode.OK),
        (400, StatusCode.INVALID_ARGUMENT),
        (401, StatusCode.UNAUTHENTICATED),
        (403, StatusCode.PERMISSION_DENIED),
        (404, StatusCode.NOT_FOUND),
        (409, StatusCode.ABORTED),
        (413, StatusCode.RESOURCE_EXHAUSTED),
        (429, StatusCode.RESOURCE_EXHAUSTED),
        (416, StatusCode.OUT_OF_RANGE),
        (499, StatusCode.CANCELLED),
        (501, StatusCode.UNIMPLEMENTED),
        (503, StatusCode.UNAVAILABLE),
        (504, StatusCode.DEADLINE_EXCEEDED),
        (422, StatusCode.FAILED_PRECONDITION),
        (500, StatusCode.INTERNAL),
        (507, StatusCode.INTERNAL),
        (302, StatusCode.UNKNOWN),
        (0, StatusCode.UNKNOWN),
    ],
)
def test_http_statuses_convert_as_torchserve_converts_them(status: int, code: StatusCode) -> None:
    assert from_http(status) is code


def test_the_grpc_table_lists_the_errors_the_http_table_lists() -> None:
    """A domain error added to one transport's table must be added to the other's."""
    assert ERROR_CODES.keys() == ERROR_TABLE.keys()


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.ModelNotFound("m"), StatusCode.NOT_FOUND),
        (errors.ArchiveNotFound("a"), StatusCode.NOT_FOUND),  # over ArchiveError's code
        (errors.ModelConfigError("c"), StatusCode.INVALID_ARGUMENT),
        (errors.InvalidWorkflow("w"), StatusCode.INVALID_ARGUMENT),
        (errors.ModelAlreadyExists("m"), StatusCode.ABORTED),
        (errors.ModelApiDisabled("off"), StatusCode.PERMISSION_DENIED),
        (errors.Overloaded("full"), StatusCode.UNAVAILABLE),
        (errors.ResponseTimeout("slow"), StatusCode.DEADLINE_EXCEEDED),
        (errors.RequestTooLarge("big"), StatusCode.RESOURCE_EXHAUSTED),
        (errors.ClientGone("gone"), StatusCode.CANCELLED),
        (errors.WorkerDied("dead"), StatusCode.INTERNAL),
        (errors.HandlerFailed("boom"), StatusCode.INTERNAL),
        (errors.HandlerFailed("bad", 400), StatusCode.INVALID_ARGUMENT),
        (errors.HandlerFailed("odd", 422), StatusCode.FAILED_PRECONDITION),
        (errors.HandlerFailed("busy", 503), StatusCode.UNAVAILABLE),
    ],
)
def test_the_most_specific_entry_wins(error: errors.FerryError, code: StatusCode) -> None:
    assert error_code(error) is code


def test_predictions_answer_internal_for_an_unknown_model_or_a_full_queue() -> None:
    for error in (errors.ModelNotFound("m"), errors.Overloaded("q"), errors.NoWorkerAvailable("w")):
        assert error_code(error, PREDICTION_CODES) is StatusCode.INTERNAL
    assert error_code(errors.InvalidInput("x"), PREDICTION_CODES) is StatusCode.INVALID_ARGUMENT
    assert error_code(errors.HandlerFailed("x", 404), PREDICTION_CODES) is StatusCode.NOT_FOUND


def test_a_customized_describe_of_an_unknown_model_is_internal() -> None:
    assert error_code(errors.ModelNotFound("m"), CUSTOMIZED_DESCRIBE_CODES) is StatusCode.INTERNAL


def test_an_unlisted_error_is_internal() -> None:
    class Unlisted(errors.FerryError):
        pass

    assert error_code(Unlisted("?")) is StatusCode.INTERNAL
