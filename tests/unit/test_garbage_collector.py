"""The server's garbage-collector settings once its models are loaded."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from ferry.server import YOUNG_COLLECTION_THRESHOLD, settle_garbage_collector


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored_collector")
def test_start_up_objects_are_frozen_and_young_collections_are_rarer() -> None:
    gc.unfreeze()
    middle, oldest = gc.get_threshold()[1:]
    settle_garbage_collector()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (YOUNG_COLLECTION_THRESHOLD, middle, oldest)
    assert YOUNG_COLLECTION_THRESHOLD > 700  # CPython's default, too eager for a server
