"""Torch's helper threads moved off the handler thread's core before each batch, with a fake
scheduler (no threads are moved in these tests)."""

from __future__ import annotations

import os
from collections.abc import Set

import pytest

from ferry.worker import helper_threads
from ferry.worker.helper_threads import HelperPlacement


class FakeScheduler:
    def __init__(self, cores: list[int], errors: dict[int, OSError] | None = None) -> None:
        self.cores = iter(cores)
        self.errors = errors or {}
        self.moves: list[tuple[int, list[int]]] = []

    def current_core(self) -> int:
        return next(self.cores)

    def set_affinity(self, tid: int, allowed: Set[int]) -> None:
        if tid in self.errors:
            raise self.errors[tid]
        self.moves.append((tid, sorted(allowed)))


def placement(scheduler: FakeScheduler, helpers: list[int], allowed: set[int]) -> HelperPlacement:
    return HelperPlacement(helpers, allowed, scheduler.current_core, scheduler.set_affinity)


def test_helpers_get_every_core_but_the_handler_threads() -> None:
    scheduler = FakeScheduler([2])
    placement(scheduler, [11, 12], {0, 1, 2, 3}).before_batch()
    assert scheduler.moves == [(11, [0, 1, 3]), (12, [0, 1, 3])]


def test_helpers_move_again_only_when_the_handler_thread_changed_core() -> None:
    scheduler = FakeScheduler([0, 0, 0, 1, 1])
    helpers = placement(scheduler, [11], {0, 1})
    for _ in range(5):
        helpers.before_batch()
    assert scheduler.moves == [(11, [1]), (11, [0])]


def test_a_helper_that_exited_is_forgotten() -> None:
    scheduler = FakeScheduler([0, 1], errors={11: ProcessLookupError()})
    helpers = placement(scheduler, [11, 12], {0, 1})
    helpers.before_batch()
    helpers.before_batch()
    assert helpers.helpers == [12]
    assert scheduler.moves == [(12, [1]), (12, [0])]


def test_cores_the_worker_lost_stop_the_moving(caplog: pytest.LogCaptureFixture) -> None:
    scheduler = FakeScheduler([0, 1], errors={11: OSError(22, "Invalid argument")})
    helpers = placement(scheduler, [11, 12], {0, 1})
    with caplog.at_level("INFO", logger="ferry.worker"):
        helpers.before_batch()
    helpers.before_batch()
    assert not helpers.active
    assert scheduler.moves == []
    assert "helper threads left where the scheduler puts them" in caplog.text


def test_nothing_to_place_with_one_thread_or_one_core(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int] = []
    monkeypatch.setattr(helper_threads, "start_helpers", lambda threads: started.append(threads))
    assert helper_threads.helper_placement(1) is None
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    assert helper_threads.helper_placement(4) is None
    assert started == []  # no parallel operation run for nothing


def test_placement_over_the_helpers_the_team_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(helper_threads, "start_helpers", lambda threads: {41})
    placed = helper_threads.helper_placement(2)
    assert placed is not None and placed.helpers == [41]
    monkeypatch.setattr(helper_threads, "start_helpers", lambda threads: set())
    assert helper_threads.helper_placement(2) is None  # the team existed: nothing to move
