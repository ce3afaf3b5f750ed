"""The one error table: every domain error has an answer in every transport's column, and
the class-hierarchy walk picks the most specific class."""

from __future__ import annotations

import inspect
from typing import get_args

import pytest
from grpc import StatusCode

from ferry import errors
from ferry.error_table import (
    ERROR_ROWS,
    UNLISTED_ROW,
    ErrorRow,
    GrpcCodeName,
    error_row,
    most_specific,
)
from ferry.grpc.errors import error_code
from ferry.http.errors import lookup

DOMAIN_ERRORS = [
    cls
    for _, cls in inspect.getmembers(errors, inspect.isclass)
    if issubclass(cls, errors.FerryError) and cls is not errors.FerryError
]
NO_ROW = ErrorRow(0, "", "UNKNOWN")


def test_the_module_defines_the_domain_errors_this_test_walks() -> None:
    assert len(DOMAIN_ERRORS) >= 25
    assert errors.ModelConfigError in DOMAIN_ERRORS


@pytest.mark.parametrize("cls", DOMAIN_ERRORS, ids=lambda cls: cls.__name__)
def test_every_domain_error_has_a_row_of_its_own_or_a_base_s(cls: type[errors.FerryError]) -> None:
    error = cls("x")
    row = most_specific(error, ERROR_ROWS, NO_ROW)
    assert row is not NO_ROW, f"{cls.__name__} and its bases have no row in ERROR_ROWS"
    assert 400 <= row.http_status < 600
    assert row.torchserve_type.endswith("Exception")
    assert row.grpc_code != "OK"
    # Each transport answers from that row.
    assert lookup(error) == (row.http_status, row.torchserve_type)
    assert error_code(error) is StatusCode[row.grpc_code]


def test_every_grpc_code_name_is_a_grpc_status_code() -> None:
    assert set(get_args(GrpcCodeName)) == {code.name for code in StatusCode}


def test_only_domain_errors_have_rows() -> None:
    assert set(ERROR_ROWS) <= set(DOMAIN_ERRORS)


def test_a_subclass_s_row_wins_over_its_base_s() -> None:
    assert error_row(errors.ArchiveNotFound("a")) is ERROR_ROWS[errors.ArchiveNotFound]
    assert error_row(errors.PackageInstallFailed("p")) is ERROR_ROWS[errors.PackageInstallFailed]
    assert error_row(errors.InvalidWorkflow("w")) is ERROR_ROWS[errors.InvalidWorkflow]


def test_an_error_of_two_bases_takes_its_first_base_s_row() -> None:
    """``ModelConfigError`` is an ``ArchiveError`` and a ``ConfigError``: the walk follows
    its method resolution order, so ``ArchiveError`` answers."""
    assert errors.ModelConfigError not in ERROR_ROWS
    assert error_row(errors.ModelConfigError("c")) is ERROR_ROWS[errors.ArchiveError]


def test_the_walk_ignores_the_table_s_order() -> None:
    base_first: dict[type[errors.FerryError], str] = {
        errors.ArchiveError: "base",
        errors.ArchiveNotFound: "subclass",
    }
    subclass_first = dict(reversed(base_first.items()))
    for table in (base_first, subclass_first):
        assert most_specific(errors.ArchiveNotFound("a"), table, "none") == "subclass"
        assert most_specific(errors.ModelConfigError("c"), table, "none") == "base"
        assert most_specific(errors.ModelNotFound("m"), table, "none") == "none"


def test_an_error_without_a_row_is_an_internal_error() -> None:
    class Unlisted(errors.FerryError):
        pass

    assert error_row(Unlisted("?")) is UNLISTED_ROW
    assert ErrorRow(500, "InternalServerException", "INTERNAL") == UNLISTED_ROW
