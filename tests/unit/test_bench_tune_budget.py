"""tune's time budget: the worst case from the grid and each point's time, a grid thinned
to fit (saying what was left out), the time left as it goes, and a search that starts no
configuration the budget cannot hold. Injected timings; nothing runs."""

from __future__ import annotations

import pytest

from ferry_bench.servers import ServerConfig
from ferry_bench.tune import Trial, search
from ferry_bench.tune_budget import (
    BudgetTooSmall,
    Costs,
    Grid,
    Progress,
    budget_notes,
    estimate_lines,
    fit_to_budget,
    parse_budget,
    thin,
    worst_case_s,
)

DOCUMENTED = Grid([1, 2, 4, 8, 16], [5, 20], [1, 2], ["fp32"], [1, 2, 4, 8, 16, 32])
"""docs/bench.md's tune on a 2-core machine: the defaults."""


def test_the_worst_case_is_every_server_started_and_every_point_run_in_full() -> None:
    # 18 configurations (batch 1 runs one delay), each 15 s + 6 x 10 s
    assert len(DOCUMENTED.configurations()) == 18
    assert worst_case_s(DOCUMENTED, Costs(start_s=15, point_s=10)) == 18 * 75


def test_the_documented_grid_is_thinned_to_five_minutes_saying_what_went() -> None:
    fitted = fit_to_budget(DOCUMENTED, Costs(start_s=15, point_s=10), 300)
    assert fitted.estimate_s <= 300
    assert fitted.grid == Grid([1, 4, 16], [5], [2], ["fp32"], [1, 4, 16, 32])
    assert fitted.dropped == [
        "max batch delay (ms) 20",
        "concurrency 2, 8",
        "batch size 2, 8",
        "workers 1",
    ]
    lines = estimate_lines(fitted, 300)
    assert lines[0] == (
        "18 configurations x 6 concurrencies: at most 22m30s (a server start ~15s, a point "
        "up to 10s); budget 5m00s"
    )
    assert lines[1].endswith("searching 3 configurations x 4 concurrencies: at most 2m45s")


def test_a_grid_that_fits_is_left_alone() -> None:
    small = Grid([1, 4], [5], [1], ["fp32"], [1, 8])
    fitted = fit_to_budget(small, Costs(start_s=10, point_s=5), 60)
    assert fitted.grid == small and fitted.dropped == []
    assert len(estimate_lines(fitted, 60)) == 2  # no "left out" line


def test_a_budget_without_room_for_one_point_is_refused() -> None:
    with pytest.raises(BudgetTooSmall, match="holds no point"):
        fit_to_budget(DOCUMENTED, Costs(start_s=15, point_s=10), 20)


def test_thinning_keeps_the_ends() -> None:
    assert thin("concurrencies", [1, 2, 4, 8, 16, 32]) == [1, 4, 16, 32]
    assert thin("concurrencies", [1, 4, 16, 32]) == [1, 16, 32]
    assert thin("precisions", ["fp32", "bf16"]) == ["fp32"]
    assert thin("workers", [1, 4]) == [4]


@pytest.mark.parametrize("text", ["", "m", "-5m", "five", "0s"])
def test_bad_budgets_say_so(text: str) -> None:
    with pytest.raises(ValueError, match="--budget"):
        parse_budget(text)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_progress_counts_down_from_the_measured_starts() -> None:
    clock = Clock()
    grid = Grid([1, 4], [5], [1], ["fp32"], [1, 8])  # 2 configurations x 2 points
    progress = Progress(grid, Costs(start_s=10, point_s=5), 120, now=clock)
    clock.t += 20
    progress.started(20)  # slower than the 10 s assumed
    clock.t += 5
    line = progress.step(points_left_here=1)
    # one point of 5 s here, then one configuration: 20 s start + 2 x 5 s
    assert line == "point 1, configuration 1 of 2; 25s elapsed, at most 35s left of 2m00s"


def test_the_search_starts_no_configuration_past_the_budget() -> None:
    clock = Clock()
    grid = Grid([1, 2, 4], [5], [1], ["fp32"], [1, 2])
    progress = Progress(grid, Costs(start_s=10, point_s=5), 60, now=clock)
    measured: list[ServerConfig] = []

    def evaluate(config: ServerConfig, concurrency: int) -> Trial:
        if config not in measured:
            measured.append(config)
            clock.t += 25  # each server takes 25 s to start, not 10
            progress.started(25)
        clock.t += 5
        return Trial(config, concurrency, 100.0 * concurrency, 10.0)

    result = search(evaluate, grid.configurations(), grid.concurrencies, 50, fits=progress.fits)
    assert measured == grid.configurations()[:1]  # 35 s spent; another needs 35 s more
    assert result.unmeasured == grid.configurations()[1:]
    fitted = fit_to_budget(grid, Costs(start_s=10, point_s=5), 60)
    notes = budget_notes(fitted, result.unmeasured, 60)
    assert notes == [
        "not measured, the budget spent (servers started slowly): b2-d5-w1-fp32, b4-d5-w1-fp32"
    ]
