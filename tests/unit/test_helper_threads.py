"""Torch's helper threads found in the handler thread's work, then moved off its core
before its later works, with fake thread controls (no thread is moved in these tests)."""

from __future__ import annotations

import os
import threading

import pytest

from ferry.worker import helper_threads
from ferry.worker.helper_threads import SEARCHES, HelperPlacement
from tests.fixtures.thread_controls import FakeControls, placement_that_found


def work(placement: HelperPlacement, search: bool = True) -> None:
    placement.begin_work(search)
    placement.end_work()


def test_the_threads_the_first_work_starts_are_the_helpers_python_threads_aside() -> None:
    controls = FakeControls([2], {0, 1, 2, 3}, live={1})
    placement = HelperPlacement(2, controls)
    work(placement)  # a batch that started no thread: nothing yet
    placement.begin_work()
    controls.live = {1, 11, 30}
    controls.python = {1, 30}  # 30: a thread the handler started in Python
    placement.end_work()
    assert placement.helpers == [11]
    assert controls.moves == []  # the work that started them ran as before
    work(placement)
    assert controls.moves == [(11, [0, 1, 3])]


def test_helpers_move_again_only_when_the_handler_thread_changed_core() -> None:
    controls = FakeControls([0, 0, 0, 1, 1], {0, 1}, live={11})
    placement = placement_that_found(controls, {11})
    for _ in range(5):
        work(placement)
    assert controls.moves == [(11, [1]), (11, [0])]


def test_an_id_no_longer_among_this_process_threads_is_never_moved() -> None:
    controls = FakeControls([0, 1], {0, 1}, live={11, 12})
    controls.errors[11] = ProcessLookupError()
    placement = placement_that_found(controls, {11, 12, 13})  # 13 left before the next batch
    work(placement)
    controls.errors.clear()
    work(placement)
    assert placement.helpers == [12]
    assert controls.moves == [(12, [1]), (12, [0])]


def test_a_refused_move_gives_every_core_back_and_stops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    controls = FakeControls([0, 1], {0, 1}, live={11, 12})
    controls.errors[12] = PermissionError(1, "Operation not permitted")
    placement = placement_that_found(controls, {11, 12})
    with caplog.at_level("INFO", logger="ferry.worker"):
        work(placement)
    work(placement)
    assert controls.moves == [(11, [1]), (11, [0, 1])]  # moved, then given every core back
    assert placement.helpers == []
    assert "helper threads left where the scheduler puts them" in caplog.text


def test_a_resized_team_is_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    controls = FakeControls([0, 1, 0], {0, 1}, live={11})
    placement = placement_that_found(controls, {11})
    work(placement)
    controls.threads = 4  # the handler called torch.set_num_threads(4)
    with caplog.at_level("INFO", logger="ferry.worker"):
        work(placement)
    work(placement)
    assert controls.moves == [(11, [1]), (11, [0, 1])]
    assert "thread count changed" in caplog.text


def test_one_allowed_core_leaves_the_helpers_where_they_are() -> None:
    controls = FakeControls([0, 0], {0}, live={11})
    placement = placement_that_found(controls, {11})
    work(placement)
    controls.allowed = {0, 1}  # the worker's cores widened: placed at the next batch
    work(placement)
    assert controls.moves == [(11, [1])]


def test_a_work_that_others_may_start_threads_during_searches_nothing() -> None:
    controls = FakeControls([0], {0, 1}, live={1})
    placement = HelperPlacement(2, controls)
    placement.begin_work()  # a batch through a stage pipeline
    placement.begin_work(search=False)  # an inference while a stage thread works
    controls.live = {1, 21}  # a stage thread's own team
    placement.end_work()
    placement.end_work()  # the batch around it does not search either
    assert placement.searching and placement.helpers == []
    placement.begin_work()
    placement.begin_work()  # an inference while no stage thread works
    controls.live = {1, 21, 11}
    placement.end_work()
    placement.end_work()
    assert placement.helpers == [11]


def test_the_search_stops_after_works_that_start_no_thread() -> None:
    controls = FakeControls([], {0, 1}, live={1})
    placement = HelperPlacement(2, controls)
    for _ in range(SEARCHES - 2):
        work(placement)
        work(placement, search=False)  # uses up no search
    placement.begin_work()
    placement.begin_work()
    placement.end_work()
    placement.end_work()  # a batch around a searched inference: one search
    assert placement.searching
    work(placement)
    assert not placement.searching
    placement.begin_work()
    controls.live = {1, 11}
    placement.end_work()
    assert placement.helpers == []


def test_a_team_is_gathered_until_it_is_whole() -> None:
    controls = FakeControls([0, 0, 0], {0, 1}, live={1})
    controls.threads = 4  # torch's team: three helpers
    placement = HelperPlacement(4, controls)
    placement.begin_work()
    controls.live = {1, 11}  # a small operation opened a team of two
    placement.end_work()
    work(placement)
    assert placement.searching and controls.moves == [(11, [1])]
    placement.begin_work()
    controls.live = {1, 11, 12, 13}  # a larger one, of four
    placement.end_work()
    assert not placement.searching
    work(placement)  # the same core, but new helpers to place
    assert controls.moves == [(11, [1]), (11, [1]), (12, [1]), (13, [1])]


def test_threads_the_load_started_are_the_helpers() -> None:
    controls = FakeControls([0], {0, 1}, live={1, 11})
    placement = HelperPlacement(2, controls, found={11})
    assert not placement.searching
    work(placement)
    assert controls.moves == [(11, [1])]
    assert HelperPlacement(3, controls, found={11}).searching  # one of two so far


def test_the_window_closes_when_the_work_raises() -> None:
    controls = FakeControls([], {0, 1}, live={1})
    placement = HelperPlacement(2, controls)
    helper_threads.install(placement)
    try:
        with pytest.raises(ValueError), helper_threads.handler_thread_work():
            raise ValueError("the handler failed")
        with helper_threads.handler_thread_work():
            controls.live = {1, 11}
    finally:
        helper_threads.forget_placement()
    assert placement.helpers == [11]  # its window was the outermost: the stack was empty


def test_an_unexpected_error_ends_the_placement_not_the_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    controls = FakeControls([], {0, 1}, live={1})
    placement = HelperPlacement(2, controls)

    def broken() -> set[int]:
        raise RuntimeError("no threads today")

    controls.live_threads = broken  # type: ignore[method-assign]
    with caplog.at_level("INFO", logger="ferry.worker"):
        work(placement)
    assert not placement.searching and placement.helpers == []
    assert "RuntimeError: no threads today" in caplog.text


def test_only_the_handlers_thread_searches_and_moves() -> None:
    controls = FakeControls([0], {0, 1}, live={1})
    placement = HelperPlacement(2, controls)
    helper_threads.install(placement)

    def stage_thread_work(started: int) -> None:
        def run() -> None:
            with helper_threads.handler_thread_work():
                controls.live = {*controls.live, started}  # a team of that thread's own

        other = threading.Thread(target=run)
        other.start()
        other.join()

    try:
        stage_thread_work(21)
        assert placement.searching and placement.helpers == []
        with helper_threads.handler_thread_work():
            controls.live = {*controls.live, 11}
        assert placement.helpers == [11]
        stage_thread_work(22)
        assert controls.moves == []
        with helper_threads.handler_thread_work():
            pass
        assert controls.moves == [(11, [1])]
    finally:
        helper_threads.forget_placement()


def test_nothing_to_place_with_one_thread_or_core(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    now = helper_threads.threads_before_load()
    assert now
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert helper_threads.helper_placement(now) is None
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    assert helper_threads.helper_placement(now) is None
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert helper_threads.helper_placement(None) is None  # no /proc before the load
    placement = helper_threads.helper_placement(helper_threads.threads_before_load())
    assert placement is not None and placement.searching and placement.helpers == []
