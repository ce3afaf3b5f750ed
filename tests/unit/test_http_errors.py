"""The HTTP error table is looked up by the error's class hierarchy, most specific first."""

from __future__ import annotations

import json

from ferry.errors import FerryError, HandlerFailed, ModelNotFound
from ferry.http.errors import ERROR_TABLE, error_response, lookup


class StorageError(FerryError):
    pass


class StorageFull(StorageError):
    pass


class UnknownAlias(ModelNotFound):
    """A subclass the real table does not list."""


def test_the_most_specific_class_wins_whatever_the_table_order() -> None:
    base_first: dict[type[FerryError], tuple[int, str]] = {
        StorageError: (500, "StorageException"),
        StorageFull: (507, "StorageFull"),
    }
    assert lookup(StorageFull("disk"), base_first) == (507, "StorageFull")
    assert lookup(StorageError("disk"), base_first) == (500, "StorageException")


def test_an_unlisted_subclass_maps_like_its_nearest_listed_base() -> None:
    assert lookup(UnknownAlias("no such alias")) == ERROR_TABLE[ModelNotFound]
    response = error_response(UnknownAlias("no such alias"))
    assert response.status_code == 404
    body = json.loads(bytes(response.body))
    assert body == {"code": 404, "type": "ModelNotFoundException", "message": "no such alias"}


def test_an_error_the_table_does_not_know_is_a_500() -> None:
    assert lookup(StorageError("x"), {}) == (500, "InternalServerException")
    assert error_response(FerryError("x")).status_code == 500


def test_a_handler_chosen_status_still_wins() -> None:
    assert error_response(HandlerFailed("denied", 418)).status_code == 418
