"""A time budget for ``ferry bench tune``: the grid's worst-case time, a grid thinned until
it fits, and the time left as the search goes.

Worst case: every configuration's server starts (``Costs.start_s``) and every concurrency
is measured for the longest a point may take (``Costs.point_s``, where its run is cut).
The search usually does less — a configuration stops at the first concurrency whose p99
breaks the SLO — so the estimate is an upper bound, and the budget is never overrun by
more than a configuration whose server started slower than assumed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar

from ferry_bench.servers import ServerConfig
from ferry_bench.tune import configurations

Value = TypeVar("Value", int, str)


@dataclass(frozen=True)
class Grid:
    """What tune searches: each list an axis."""

    batch_sizes: list[int]
    delays: list[int]
    workers: list[int]
    precisions: list[str]
    concurrencies: list[int]

    def configurations(self) -> list[ServerConfig]:
        return configurations(self.batch_sizes, self.delays, self.workers, self.precisions)


@dataclass(frozen=True)
class Costs:
    start_s: float = 15.0
    """A configuration's server start and warm-up (the demo model: 15-20 s on 2 busy
    cores); once one is measured, the progress lines use the slowest measured."""
    point_s: float = 10.0
    """The longest one (configuration, concurrency) point runs: its load is cut there."""


def worst_case_s(grid: Grid, costs: Costs) -> float:
    """Seconds the search takes at most: every server started, every point run in full."""
    per_config = costs.start_s + len(grid.concurrencies) * costs.point_s
    return len(grid.configurations()) * per_config


THINNING_ORDER = ("delays", "concurrencies", "batch_sizes", "workers", "precisions")
"""Axes thinned in turn, one step each round, least telling first."""

AXIS_NAMES = {
    "delays": "max batch delay (ms)",
    "concurrencies": "concurrency",
    "batch_sizes": "batch size",
    "workers": "workers",
    "precisions": "precision",
}


def thin(axis: str, values: list[Value]) -> list[Value]:
    """One thinning step: the first and last values kept and every other one between
    (``1,2,4,8,16`` -> ``1,4,16``); of two, the first (for workers, the most).

    >>> thin("batch_sizes", [1, 2, 4, 8, 16]), thin("delays", [5, 20]), thin("workers", [1, 2])
    ([1, 4, 16], [5], [2])
    """
    if len(values) <= 1:
        return values
    if len(values) == 2:
        return [max(values)] if axis == "workers" else values[:1]
    kept = values[::2]
    return kept if kept[-1] == values[-1] else kept + values[-1:]


class BudgetTooSmall(ValueError):
    """Not even one configuration at one concurrency fits the budget."""


@dataclass(frozen=True)
class Fitted:
    grid: Grid
    dropped: list[str]
    """Per thinned axis, what was left out: ``batch size 2, 8``."""
    estimate_s: float
    asked: Grid
    """The grid as asked, before thinning."""
    costs: Costs


def fit_to_budget(grid: Grid, costs: Costs, budget_s: float) -> Fitted:
    """The grid thinned, axis by axis in ``THINNING_ORDER``, until its worst case fits
    ``budget_s``; ``BudgetTooSmall`` when one point at one concurrency does not."""
    fitted = grid
    while worst_case_s(fitted, costs) > budget_s:
        thinned = False
        for axis in THINNING_ORDER:
            values = getattr(fitted, axis)
            if len(values) > 1 and worst_case_s(fitted, costs) > budget_s:
                fitted, thinned = replace(fitted, **{axis: thin(axis, values)}), True
        if not thinned:
            raise BudgetTooSmall(
                f"a budget of {clock(budget_s)} holds no point: one server start and one "
                f"measurement take up to {clock(costs.start_s + costs.point_s)}"
            )
    return Fitted(fitted, _dropped(grid, fitted), worst_case_s(fitted, costs), grid, costs)


def estimate_lines(fitted: Fitted, budget_s: float) -> list[str]:
    """What tune prints before it starts: the grid's worst case as asked, what the budget
    left out, and the worst case of what will run."""
    costs = fitted.costs

    def size(grid: Grid) -> str:
        return (
            f"{len(grid.configurations())} configurations x {len(grid.concurrencies)} "
            f"concurrencies: at most {clock(worst_case_s(grid, costs))}"
        )

    lines = [
        f"{size(fitted.asked)} (a server start ~{clock(costs.start_s)}, a point up to "
        f"{clock(costs.point_s)}); budget {clock(budget_s)}"
    ]
    if fitted.dropped:
        lines.append(
            f"to fit the budget, left out {'; '.join(fitted.dropped)}; searching "
            f"{size(fitted.grid)}"
        )
    lines.append(
        "a configuration stops at the first concurrency whose p99 breaks the SLO, so the "
        "search usually ends sooner"
    )
    return lines


def budget_notes(fitted: Fitted, unmeasured: list[ServerConfig], budget_s: float) -> list[str]:
    """What the budget left out, for tune.md and tune.png."""
    from ferry_bench.sweep import config_label

    notes = []
    if fitted.dropped:
        notes.append(f"to fit the {clock(budget_s)} budget, left out {'; '.join(fitted.dropped)}")
    if unmeasured:
        labels = ", ".join(config_label(c) for c in unmeasured)
        notes.append(f"not measured, the budget spent (servers started slowly): {labels}")
    return notes


def _dropped(asked: Grid, fitted: Grid) -> list[str]:
    lines = []
    for axis in THINNING_ORDER:
        gone = [v for v in getattr(asked, axis) if v not in getattr(fitted, axis)]
        if gone:
            lines.append(f"{AXIS_NAMES[axis]} {', '.join(str(v) for v in gone)}")
    return lines


def clock(seconds: float) -> str:
    """``4m05s``, ``50s``: a duration as the progress lines print it."""
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def parse_budget(text: str) -> float:
    """Seconds from ``5m``, ``90s``, ``1h`` or a bare number of seconds.

    >>> parse_budget("5m"), parse_budget("90s"), parse_budget("1h"), parse_budget("45")
    (300.0, 90.0, 3600.0, 45.0)
    """
    value = text.strip().lower()
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0}.get(value[-1:])
    number = value[:-1] if scale is not None else value
    try:
        seconds = float(number) * (scale or 1.0)
    except ValueError:
        raise ValueError(f"--budget must be a duration like 5m, 90s or 1h, got {text!r}") from None
    if seconds <= 0:
        raise ValueError(f"--budget must be positive, got {text!r}")
    return seconds


@dataclass
class Progress:
    """The time spent and the most left, as the search goes; whether the next
    configuration still fits the budget. ``now`` is injected for tests."""

    grid: Grid
    costs: Costs
    budget_s: float
    now: Callable[[], float] = time.monotonic
    start: float = field(init=False)
    points: int = field(init=False, default=0)
    configs_started: int = field(init=False, default=0)
    starts_s: list[float] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.start = self.now()

    @property
    def elapsed_s(self) -> float:
        return self.now() - self.start

    def start_s(self) -> float:
        """A server start as measured so far (the assumption until one is)."""
        return max(self.starts_s) if self.starts_s else self.costs.start_s

    def fits(self) -> bool:
        """Whether one more configuration, in full, ends within the budget."""
        per_config = self.start_s() + len(self.grid.concurrencies) * self.costs.point_s
        return self.elapsed_s + per_config <= self.budget_s

    def started(self, seconds: float) -> None:
        self.configs_started += 1
        self.starts_s.append(seconds)

    def step(self, points_left_here: int) -> str:
        """After a point: ``point 7, configuration 3 of 6; 1m20s elapsed, at most 2m10s
        left of 5m00s``."""
        self.points += 1
        configs_left = len(self.grid.configurations()) - self.configs_started
        per_config = self.start_s() + len(self.grid.concurrencies) * self.costs.point_s
        left = points_left_here * self.costs.point_s + configs_left * per_config
        left = min(left, max(0.0, self.budget_s - self.elapsed_s))
        return (
            f"point {self.points}, configuration {self.configs_started} of "
            f"{len(self.grid.configurations())}; {clock(self.elapsed_s)} elapsed, at most "
            f"{clock(left)} left of {clock(self.budget_s)}"
        )
