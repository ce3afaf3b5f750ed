"""``context.metrics``: what handlers record, in TorchServe's method names.

Both of TorchServe's APIs work: the older one (``add_counter``, ``add_time``, ``add_size``,
``add_percent``) and the custom-metrics one (``add_metric``, ``add_metric_to_cache``,
``get_metric`` returning a ``Metric`` with ``add_or_update``). Dimensions are given as a
list of ``Dimension`` objects, as TorchServe writes them, or as a ``{name: value}`` dict.

TorchServe's rules, kept here:

- Metrics are known by name and type. The model metrics of the server's ``metrics_config``
  (TorchServe's metrics.yaml; without one, its default ``HandlerTime`` and
  ``PredictionTime``) are known from the start: ``get_metric(name, metric_type)`` returns
  them with their declared unit and dimension names.
- ``add_metric``, ``add_counter``, ``add_time``, ``add_size`` and ``add_percent`` add the
  default dimensions ``ModelName`` (the model's name) and ``Level`` (``Model``) unless
  given, and record through the metric of that name and type: the declared one (its unit
  wins), else one made from this first call's unit and dimension names.
- A value whose dimension values do not match the metric's dimension names in number, or
  a negative counter value, is logged as an error and dropped; the handler goes on.

The worker collects the recorded values; the frontend's metrics endpoint exposes them with
TorchServe's types and labels (``ferry.metrics.definitions``): counters add up, gauges
(times, sizes and percents by default) keep the latest value, histograms observe each.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ferry.config.settings import TORCHSERVE_MODEL_METRICS, ModelMetric

log = logging.getLogger("ferry.handler_metrics")


class MetricTypes(enum.Enum):
    """TorchServe's metric types (``ts.metrics.metric_type_enum``)."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


def _metric_type(value: object) -> MetricTypes:
    """Ferry's ``MetricTypes`` for Ferry's, TorchServe's own (a real ``ts`` installed)
    or a type's name."""
    if isinstance(value, MetricTypes):
        return value
    try:
        return MetricTypes(getattr(value, "value", value))
    except ValueError:
        raise TypeError(f"metric_type must be a MetricTypes, got {value!r}") from None


@dataclass(frozen=True)
class Dimension:
    """One ``name=value`` label of a metric (``ts.metrics.dimension``)."""

    name: str
    value: str

    def __str__(self) -> str:
        return f"{self.name}:{self.value}"


Dimensions = Sequence[Dimension] | Mapping[str, str] | None


def _pairs(dimensions: Dimensions) -> list[tuple[str, str]]:
    """``(name, value)`` of each dimension, in the order given."""
    if dimensions is None:
        return []
    if isinstance(dimensions, Mapping):
        return [(str(k), str(v)) for k, v in dimensions.items()]
    return [(str(d.name), str(d.value)) for d in dimensions]


@dataclass(frozen=True)
class HandlerMetric:
    name: str
    value: float
    unit: str
    kind: str
    dimensions: tuple[tuple[str, str], ...]


class Metric:
    """A named metric with fixed dimension names; ``add_or_update`` records one value
    (TorchServe's ``CachingMetric``).

    Example::

        metric = context.metrics.add_metric_to_cache("Hits", "count", ["route"])
        metric.add_or_update(1, ["cache"])
    """

    def __init__(
        self,
        sink: HandlerMetrics,
        name: str,
        unit: str,
        dimension_names: Sequence[str] | None = (),
        metric_type: MetricTypes = MetricTypes.COUNTER,
    ) -> None:
        self._sink = sink
        self.name = name
        self.unit = unit
        self.dimension_names = [str(n) for n in dimension_names or ()]
        self.metric_type = _metric_type(metric_type)

    @property
    def metric_name(self) -> str:
        """TorchServe's name for ``name``."""
        return self.name

    def add_or_update(
        self, value: float, dimension_values: Sequence[str] | None = (), request_id: str = ""
    ) -> None:
        """Record ``value`` with one value per dimension name, in order. As in TorchServe,
        other than one per name is logged as an error and the value dropped."""
        values = list(dimension_values) if dimension_values is not None else []
        if dimension_values is None or len(values) != len(self.dimension_names):
            self._sink.drop(
                self,
                value,
                f"{len(values)} dimension values {values} for its dimension names "
                f"{self.dimension_names}",
            )
            return
        self._record(value, list(zip(self.dimension_names, map(str, values), strict=True)))

    def update(self, value: float, request_id: str = "", dimensions: Dimensions = ()) -> None:
        """Record ``value`` with ``Dimension`` objects (TorchServe's older signature): as
        in TorchServe, their names become the metric's dimension names."""
        pairs = _pairs(dimensions)
        self.dimension_names = [name for name, _ in pairs]
        self.add_or_update(value, [v for _, v in pairs], request_id)

    def add_named(self, value: float, pairs: list[tuple[str, str]]) -> None:
        """Record ``value`` with named dimensions: each to its name when they are this
        metric's own (in any order), else their values in order, as TorchServe does."""
        if sorted(name for name, _ in pairs) == sorted(self.dimension_names):
            by_name = dict(pairs)
            self._record(value, [(name, by_name[name]) for name in self.dimension_names])
        else:
            self.add_or_update(value, [v for _, v in pairs])

    def _record(self, value: float, pairs: list[tuple[str, str]]) -> None:
        number = float(value)
        if self.metric_type is MetricTypes.COUNTER and number < 0:
            self._sink.drop(self, value, "a counter cannot go down")
            return
        self._sink.record(self.name, number, self.unit, self.metric_type.value, dict(pairs))


class HandlerMetrics:
    """Collects metrics recorded by a handler until the worker drains them (thread-safe:
    the stage pipeline records from its pool threads).

    ``model_name`` is the ``ModelName`` default dimension; ``declared`` are the model
    metrics known from the start (the server's ``metrics_config``; TorchServe's default
    ones when None)."""

    def __init__(self, model_name: str = "", declared: Iterable[ModelMetric] | None = None) -> None:
        self.model_name = model_name
        self._recorded: list[HandlerMetric] = []
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, MetricTypes], Metric] = {}
        self._dropped: set[tuple[str, MetricTypes]] = set()
        for metric in TORCHSERVE_MODEL_METRICS if declared is None else declared:
            self.add_metric_to_cache(
                metric.name, metric.unit, metric.dimensions, MetricTypes(metric.metric_type)
            )

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
        dims = tuple(sorted(_pairs(dimensions)))
        with self._lock:
            self._recorded.append(HandlerMetric(name, float(value), unit, kind, dims))

    def drop(self, metric: Metric, value: object, why: str) -> None:
        """Log a value that cannot be recorded: an error the first time per metric (every
        time in TorchServe, whose log would fill at each request), then at debug level."""
        key = (metric.name, metric.metric_type)
        level = logging.DEBUG if key in self._dropped else logging.ERROR
        self._dropped.add(key)
        log.log(
            level,
            "metric %s (%s): value %s dropped: %s (a metric's dimension names are "
            "declared in metrics_config's model_metrics or by add_metric_to_cache)",
            metric.name,
            metric.metric_type.value,
            value,
            why,
        )

    def add_metric(
        self,
        name: str,
        value: float,
        unit: str,
        idx: object = None,
        dimensions: Dimensions = None,
        metric_type: MetricTypes = MetricTypes.COUNTER,
    ) -> None:
        """Record one value of a metric of any type (TorchServe's custom-metrics API), with
        the default dimensions."""
        self._add(name, value, unit, self._with_defaults(dimensions), metric_type)

    def add_metric_to_cache(
        self,
        metric_name: str,
        unit: str,
        dimension_names: Sequence[str] | None = (),
        metric_type: MetricTypes = MetricTypes.COUNTER,
    ) -> Metric:
        """Declare a metric (replacing one of the same name and type); record values
        through the returned ``Metric``."""
        if not isinstance(metric_name, str) or not isinstance(unit, str):
            raise TypeError("metric_name and unit must be str")
        metric = Metric(self, metric_name, unit, dimension_names, metric_type)
        self._cache[(metric_name, metric.metric_type)] = metric
        return metric

    def get_metric(
        self, metric_name: str, metric_type: MetricTypes = MetricTypes.COUNTER
    ) -> Metric:
        """The metric declared (in metrics_config, or by ``add_metric_to_cache``) or first
        added under this name and type. An unknown one, where TorchServe raises
        ``MetricsCacheKeyError``, is made: unit ``count``, no dimensions."""
        metric = self._cache.get((metric_name, _metric_type(metric_type)))
        if metric is None:
            metric = self.add_metric_to_cache(metric_name, "count", (), metric_type)
        return metric

    def add_counter(
        self,
        name: str,
        value: float = 1,
        idx: object = None,
        dimensions: Dimensions = None,
    ) -> None:
        self._add(name, value, "count", self._with_defaults(dimensions), MetricTypes.COUNTER)

    def add_time(
        self,
        name: str,
        value: float,
        idx: object = None,
        unit: str = "ms",
        dimensions: Dimensions = None,
        metric_type: MetricTypes = MetricTypes.GAUGE,
    ) -> None:
        self._add(name, value, unit, self._with_defaults(dimensions), metric_type)

    def add_size(
        self,
        name: str,
        value: float,
        idx: object = None,
        unit: str = "MB",
        dimensions: Dimensions = None,
        metric_type: MetricTypes = MetricTypes.GAUGE,
    ) -> None:
        self._add(name, value, unit, self._with_defaults(dimensions), metric_type)

    def add_percent(
        self,
        name: str,
        value: float,
        idx: object = None,
        dimensions: Dimensions = None,
        metric_type: MetricTypes = MetricTypes.GAUGE,
    ) -> None:
        self._add(name, value, "percent", self._with_defaults(dimensions), metric_type)

    def add_error(self, name: str, value: float, dimensions: Dimensions = None) -> None:
        """A counter with the default dimension ``Level`` ``Error`` (no ``ModelName``)."""
        pairs = _pairs(dimensions)
        if "Level" not in {n for n, _ in pairs}:
            pairs.append(("Level", "Error"))
        self._add(name, value, "", pairs, MetricTypes.COUNTER)

    def _with_defaults(self, dimensions: Dimensions) -> list[tuple[str, str]]:
        pairs = _pairs(dimensions)
        names = {name for name, _ in pairs}
        if "ModelName" not in names:
            pairs.append(("ModelName", self.model_name))
        if "Level" not in names:
            pairs.append(("Level", "Model"))
        return pairs

    def _add(
        self,
        name: str,
        value: float,
        unit: str,
        pairs: list[tuple[str, str]],
        metric_type: MetricTypes,
    ) -> None:
        kind = _metric_type(metric_type)
        metric = self._cache.get((name, kind))
        if metric is None:
            metric = self.add_metric_to_cache(name, unit, [n for n, _ in pairs], kind)
        metric.add_named(value, pairs)

    def drain(self) -> list[HandlerMetric]:
        with self._lock:
            recorded, self._recorded = self._recorded, []
        return recorded
