"""Torch's helper threads moved off the handler thread's core before its torch work, with
fake thread controls (no thread is moved in these tests)."""

from __future__ import annotations

import os

import pytest

from ferry.worker import helper_threads
from ferry.worker.helper_threads import HelperPlacement
from tests.fixtures.thread_controls import FakeControls


def placed(controls: FakeControls, helpers: set[int]) -> HelperPlacement:
    return HelperPlacement(helpers, 2, controls)


def test_helpers_get_every_core_but_the_handler_threads() -> None:
    controls = FakeControls([2], {0, 1, 2, 3}, live={11, 12})
    placed(controls, {11, 12}).before_parallel_work()
    assert controls.moves == [(11, [0, 1, 3]), (12, [0, 1, 3])]


def test_helpers_move_again_only_when_the_handler_thread_changed_core() -> None:
    controls = FakeControls([0, 0, 0, 1, 1], {0, 1}, live={11})
    placement = placed(controls, {11})
    for _ in range(5):
        placement.before_parallel_work()
    assert controls.moves == [(11, [1]), (11, [0])]


def test_a_helper_that_exited_is_forgotten_and_its_id_never_moved() -> None:
    controls = FakeControls([0, 1, 0], {0, 1}, live={11, 12})
    controls.errors[11] = ProcessLookupError()
    placement = placed(controls, {11, 12, 13})  # 13 left before the first batch
    placement.before_parallel_work()
    controls.errors.clear()
    controls.live = {12, 13}  # 13: a new thread given the old id, no helper
    placement.before_parallel_work()
    assert placement.helpers == [12]
    assert controls.moves == [(12, [1]), (12, [0])]


def test_a_refused_move_gives_every_core_back_and_stops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    controls = FakeControls([0, 1], {0, 1}, live={11, 12})
    controls.errors[12] = PermissionError(1, "Operation not permitted")
    placement = placed(controls, {11, 12})
    with caplog.at_level("INFO", logger="ferry.worker"):
        placement.before_parallel_work()
    placement.before_parallel_work()
    assert controls.moves == [(11, [1]), (11, [0, 1])]  # moved, then given every core back
    assert placement.helpers == []
    assert "helper threads left where the scheduler puts them" in caplog.text


def test_a_resized_team_is_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    controls = FakeControls([0, 1, 0], {0, 1}, live={11})
    placement = placed(controls, {11})
    placement.before_parallel_work()
    controls.threads = 4  # the handler called torch.set_num_threads(4)
    with caplog.at_level("INFO", logger="ferry.worker"):
        placement.before_parallel_work()
    placement.before_parallel_work()
    assert controls.moves == [(11, [1]), (11, [0, 1])]
    assert "thread count changed" in caplog.text


def test_one_allowed_core_leaves_the_helpers_where_they_are() -> None:
    controls = FakeControls([0, 0], {0}, live={11})
    placement = placed(controls, {11})
    placement.before_parallel_work()
    controls.allowed = {0, 1}  # the worker's cores widened: placed at the next batch
    placement.before_parallel_work()
    assert controls.moves == [(11, [1])]


def test_only_the_handlers_thread_moves_the_helpers() -> None:
    import threading

    controls = FakeControls([0, 1], {0, 1}, live={11})
    helper_threads.install(placed(controls, {11}))
    try:
        other = threading.Thread(target=helper_threads.keep_helpers_off_this_core)
        other.start()
        other.join()
        assert controls.moves == []  # a stage thread's torch work has a team of its own
        helper_threads.keep_helpers_off_this_core()
        assert controls.moves == [(11, [1])]
    finally:
        helper_threads.install(None)


def test_nothing_to_place_with_one_thread_or_core(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    found: list[object] = []
    monkeypatch.setattr(helper_threads, "find_helpers", lambda before: found.append(before))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert helper_threads.helper_placement({1}) is None
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    assert helper_threads.helper_placement({1}) is None
    assert helper_threads.helper_placement(None) is None  # no /proc before the load
    assert found == []  # no parallel operation run for nothing


def test_placement_over_the_threads_the_team_started(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(helper_threads, "find_helpers", lambda before: {41})
    placement = helper_threads.helper_placement({1})
    assert placement is not None and placement.helpers == [41]
    monkeypatch.setattr(helper_threads, "find_helpers", lambda before: set())
    assert helper_threads.helper_placement({1}) is None  # nothing new: nothing to move
