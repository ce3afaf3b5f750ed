"""``context.metrics``: what handlers record, in TorchServe's method names.

Both of TorchServe's APIs work: the older one (``add_counter``, ``add_time``, ``add_size``,
``add_percent``) and the custom-metrics one (``add_metric``, ``add_metric_to_cache``,
``get_metric`` returning a ``Metric`` with ``add_or_update``). Dimensions are given as a
list of ``Dimension`` objects, as TorchServe writes them, or as a ``{name: value}`` dict.

The worker collects the recorded values; the frontend's metrics endpoint exposes them:
counters add up, every other type (gauges, times, sizes, percents, histograms) keeps its
latest value.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class MetricTypes(enum.Enum):
    """TorchServe's metric types (``ts.metrics.metric_type_enum``)."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(frozen=True)
class Dimension:
    """One ``name=value`` label of a metric (``ts.metrics.dimension``)."""

    name: str
    value: str

    def __str__(self) -> str:
        return f"{self.name}:{self.value}"


Dimensions = Sequence[Dimension] | Mapping[str, str] | None


def _as_dict(dimensions: Dimensions) -> dict[str, str]:
    if dimensions is None:
        return {}
    if isinstance(dimensions, Mapping):
        return {str(k): str(v) for k, v in dimensions.items()}
    return {d.name: str(d.value) for d in dimensions}


@dataclass(frozen=True)
class HandlerMetric:
    name: str
    value: float
    unit: str
    kind: str
    dimensions: tuple[tuple[str, str], ...]


class Metric:
    """A named metric with fixed dimension names; ``add_or_update`` records one value.

    Example::

        metric = context.metrics.add_metric_to_cache("Hits", "count", ["route"])
        metric.add_or_update(1, ["cache"])
    """

    def __init__(
        self,
        sink: HandlerMetrics,
        name: str,
        unit: str,
        dimension_names: Sequence[str] = (),
        metric_type: MetricTypes = MetricTypes.COUNTER,
    ) -> None:
        self._sink = sink
        self.name = name
        self.unit = unit
        self.dimension_names = list(dimension_names)
        self.metric_type = metric_type

    def add_or_update(
        self, value: float, dimension_values: Sequence[str] = (), request_id: str = ""
    ) -> None:
        """Record ``value`` with one value per dimension name, in order."""
        if len(dimension_values) != len(self.dimension_names):
            raise ValueError(
                f"metric {self.name}: {len(self.dimension_names)} dimension values expected "
                f"({self.dimension_names}), got {list(dimension_values)}"
            )
        dims = dict(zip(self.dimension_names, map(str, dimension_values), strict=True))
        self._sink.record(self.name, value, self.unit, self.metric_type.value, dims)

    def update(
        self, value: float, request_id: str = "", dimensions: Sequence[Dimension] = ()
    ) -> None:
        """Record ``value`` with ``Dimension`` objects (TorchServe's older signature)."""
        self._sink.record(self.name, value, self.unit, self.metric_type.value, _as_dict(dimensions))


class HandlerMetrics:
    """Collects metrics recorded by a handler until the worker drains them (thread-safe:
    the stage pipeline records from its pool threads)."""

    def __init__(self) -> None:
        self._recorded: list[HandlerMetric] = []
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, MetricTypes], Metric] = {}

    def __getstate__(self) -> dict[str, Any]:
        # A handler holding a Metric can still be copied into a preprocess process.
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def record(
        self, name: str, value: float, unit: str, kind: str, dimensions: Dimensions = None
    ) -> None:
        dims = tuple(sorted(_as_dict(dimensions).items()))
        with self._lock:
            self._recorded.append(HandlerMetric(name, float(value), unit, kind, dims))

    def add_metric(
        self,
        name: str,
        value: float,
        unit: str,
        idx: object = None,
        dimensions: Dimensions = None,
        metric_type: MetricTypes = MetricTypes.COUNTER,
    ) -> None:
        """Record one value of a metric of any type (TorchServe's custom-metrics API)."""
        self._remember(name, unit, list(_as_dict(dimensions)), metric_type)
        self.record(name, value, unit, metric_type.value, dimensions)

    def add_metric_to_cache(
        self,
        metric_name: str,
        unit: str,
        dimension_names: Sequence[str] = (),
        metric_type: MetricTypes = MetricTypes.COUNTER,
    ) -> Metric:
        """Declare a metric; record values through the returned ``Metric``."""
        metric = Metric(self, metric_name, unit, dimension_names, metric_type)
        self._cache[(metric_name, metric_type)] = metric
        return metric

    def get_metric(
        self, metric_name: str, metric_type: MetricTypes = MetricTypes.COUNTER
    ) -> Metric:
        """The metric declared (or first added) under this name and type. Ferry reads no
        metrics.yaml, so an undeclared name gives a new metric (unit ``count``, no
        dimensions) where TorchServe raises."""
        metric = self._cache.get((metric_name, metric_type))
        if metric is None:
            metric = self.add_metric_to_cache(metric_name, "count", (), metric_type)
        return metric

    def _remember(
        self, name: str, unit: str, dimension_names: list[str], metric_type: MetricTypes
    ) -> None:
        if (name, metric_type) not in self._cache:
            self.add_metric_to_cache(name, unit, dimension_names, metric_type)

    def add_counter(
        self,
        name: str,
        value: float = 1,
        idx: object = None,
        dimensions: Dimensions = None,
    ) -> None:
        self.record(name, value, "count", "counter", dimensions)

    def add_time(
        self,
        name: str,
        value: float,
        idx: object = None,
        unit: str = "ms",
        dimensions: Dimensions = None,
        metric_type: MetricTypes = MetricTypes.GAUGE,
    ) -> None:
        self.record(name, value, unit, _kind(metric_type, "time"), dimensions)

    def add_size(
        self,
        name: str,
        value: float,
        idx: object = None,
        unit: str = "MB",
        dimensions: Dimensions = None,
        metric_type: MetricTypes = MetricTypes.GAUGE,
    ) -> None:
        self.record(name, value, unit, _kind(metric_type, "size"), dimensions)

    def add_percent(
        self,
        name: str,
        value: float,
        idx: object = None,
        dimensions: Dimensions = None,
        metric_type: MetricTypes = MetricTypes.GAUGE,
    ) -> None:
        self.record(name, value, "percent", _kind(metric_type, "percent"), dimensions)

    def drain(self) -> list[HandlerMetric]:
        with self._lock:
            recorded, self._recorded = self._recorded, []
        return recorded


def _kind(metric_type: MetricTypes, default: str) -> str:
    return "counter" if metric_type is MetricTypes.COUNTER else default
