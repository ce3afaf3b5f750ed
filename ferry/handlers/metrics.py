"""``context.metrics``: what handlers record, in TorchServe's method names.

The worker collects the recorded values; the frontend's metrics endpoint exposes them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HandlerMetric:
    name: str
    value: float
    unit: str
    kind: str
    dimensions: tuple[tuple[str, str], ...]


class HandlerMetrics:
    """Collects metrics recorded by a handler until the worker drains them."""

    def __init__(self) -> None:
        self._recorded: list[HandlerMetric] = []

    def _add(
        self, name: str, value: float, unit: str, kind: str, dimensions: dict[str, str] | None
    ) -> None:
        dims = tuple(sorted((dimensions or {}).items()))
        self._recorded.append(HandlerMetric(name, float(value), unit, kind, dims))

    def add_counter(
        self,
        name: str,
        value: float = 1,
        idx: object = None,
        dimensions: dict[str, str] | None = None,
    ) -> None:
        self._add(name, value, "count", "counter", dimensions)

    def add_time(
        self,
        name: str,
        value: float,
        idx: object = None,
        unit: str = "ms",
        dimensions: dict[str, str] | None = None,
    ) -> None:
        self._add(name, value, unit, "time", dimensions)

    def add_size(
        self,
        name: str,
        value: float,
        idx: object = None,
        unit: str = "MB",
        dimensions: dict[str, str] | None = None,
    ) -> None:
        self._add(name, value, unit, "size", dimensions)

    def add_percent(
        self, name: str, value: float, idx: object = None, dimensions: dict[str, str] | None = None
    ) -> None:
        self._add(name, value, "percent", "percent", dimensions)

    def drain(self) -> list[HandlerMetric]:
        recorded, self._recorded = self._recorded, []
        return recorded
