"""TorchServe's ``metrics_config`` (issue 31, item 7): the ``model_metrics`` of a
metrics.yaml declared for handlers, and ``context.metrics`` following TorchServe's rules
(default dimensions, declared units and dimension names, wrong dimension counts logged and
dropped)."""

from __future__ import annotations

import enum
import importlib
import logging
import sys
from pathlib import Path

import pytest

from ferry.config.settings import TORCHSERVE_MODEL_METRICS, ModelMetric
from ferry.config.sources import (
    IGNORED_TORCHSERVE_KEYS,
    OPTIONS_BY_KEY,
    load_settings,
    read_model_metrics,
)
from ferry.errors import ConfigError
from ferry.handlers.contract.context import Context
from ferry.handlers.contract.metrics import (
    Dimension,
    HandlerMetrics,
    MetricTypes,
)
from ferry.wire import codec
from ferry.wire.messages import StartWorker
from ferry.wire.spec import WorkerSpec
from ferry.worker.loading import SHIM_ROOT
from tests.fixtures.custom_metrics import write_metrics_yaml
from tests.fixtures.fake_worker import spec

MODEL = (("Level", "Model"), ("ModelName", "mnist"))
"""TorchServe's default dimensions for model ``mnist``, as recorded (sorted)."""


@pytest.fixture
def declared(tmp_path: Path) -> tuple[ModelMetric, ...]:
    return read_model_metrics(write_metrics_yaml(tmp_path))


# --- the file -----------------------------------------------------------------------------


def test_model_metrics_are_read_with_their_types_units_and_dimensions(
    declared: tuple[ModelMetric, ...],
) -> None:
    assert declared == (
        ModelMetric("InferenceRequestCount", "count", "counter", ()),
        ModelMetric("InitializeCallCount", "count", "counter", ("ModelName", "Level")),
        ModelMetric("PreprocessCallCount", "count", "counter", ("ModelName",)),
        ModelMetric("PostprocessCallCount", "CallCount", "counter", ("ModelName", "Level")),
        ModelMetric("HandlerTime", "ms", "gauge", ("ModelName", "Level")),
        ModelMetric("PredictionTime", "ms", "gauge", ("ModelName", "Level")),
        ModelMetric("RequestBatchSize", "count", "gauge", ("ModelName",)),
        ModelMetric("SizeOfImage", "kB", "gauge", ("ModelName", "Level")),
    )  # ts_metrics (Requests2XX) is the frontend's: not a model metric


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ts_metrics: {}\n", "has no model_metrics section"),
        ("model_metrics: {}\n", "has no model_metrics section"),
        ("model_metrics:\n  summary: []\n", "metric type 'summary' is not one of"),
        ("model_metrics:\n  counter:\n    - name: A\n      unit: count\n", "needs name, unit"),
        ("model_metrics:\n  gauge:\n    - {name: A, unit: ms, dimensions: x}\n", "list of names"),
        ("model_metrics:\n  gauge:\n    - {name: A, unit: ms, dimensions: [B, B]}\n", "twice"),
        ("model_metrics: [\n", "not valid YAML"),
    ],
)
def test_a_bad_file_stops_start_up_saying_why(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "metrics.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as raised:
        read_model_metrics(path)
    assert str(raised.value).startswith("metrics_config: ")


def test_a_missing_file_stops_start_up(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="metrics_config: cannot read"):
        load_settings({"metrics_config": str(tmp_path / "absent.yaml")}, {}, None)


# --- the setting --------------------------------------------------------------------------


def test_metrics_config_from_config_properties_flag_or_environment(
    tmp_path: Path, declared: tuple[ModelMetric, ...]
) -> None:
    yaml_path = write_metrics_yaml(tmp_path)
    config = tmp_path / "config.properties"
    config.write_text(f"metrics_config={yaml_path}\n")
    assert load_settings({}, {}, config).model_metrics == declared
    assert load_settings({"metrics_config": str(yaml_path)}, {}, None).model_metrics == declared
    environ = {"FERRY_METRICS_CONFIG": str(yaml_path)}
    assert load_settings({}, environ, None).model_metrics == declared
    assert OPTIONS_BY_KEY["metrics_config"].flag_name == "--metrics-config"
    # Without one (or empty), TorchServe's default metrics.yaml's model metrics.
    assert load_settings({}, {}, None).model_metrics == TORCHSERVE_MODEL_METRICS
    assert load_settings({"metrics_config": ""}, {}, None).model_metrics == (
        TORCHSERVE_MODEL_METRICS
    )


def test_auto_detect_is_ignored_with_its_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "config.properties"
    config.write_text(
        f"metrics_config={write_metrics_yaml(tmp_path)}\nmodel_metrics_auto_detect=true\n"
    )
    with caplog.at_level(logging.WARNING, logger="ferry.config"):
        load_settings({}, {}, config)
    assert "metrics_config" not in IGNORED_TORCHSERVE_KEYS
    assert caplog.messages == [
        "config.properties: model_metrics_auto_detect is a TorchServe setting Ferry does not "
        f"use ({IGNORED_TORCHSERVE_KEYS['model_metrics_auto_detect']}); ignored"
    ]


def test_the_worker_spec_carries_the_declarations_to_the_worker(
    declared: tuple[ModelMetric, ...],
) -> None:
    def received(sent: WorkerSpec) -> WorkerSpec:
        frame = codec.encode(StartWorker(sent))
        message = codec.decode(frame[codec.FRAME_HEADER.size :])
        assert isinstance(message, StartWorker)
        return message.spec

    declaring = spec("mnist", model_metrics=declared)
    assert received(declaring) == declaring
    assert received(declaring).model.model_metrics == declared
    assert received(spec("mnist")).model.model_metrics == TORCHSERVE_MODEL_METRICS


# --- the handler's calls, as the custom_metrics example makes them ------------------------


def _example_calls(metrics: HandlerMetrics, image_bytes: int) -> None:
    """What the example's handler calls: initialize, then one request's pre/postprocess."""
    requests = metrics.add_metric_to_cache(
        "InferenceRequestCount", "count", [], MetricTypes.COUNTER
    )
    metrics.add_metric_to_cache("PreprocessCallCount", "count", ["ModelName"], MetricTypes.COUNTER)
    metrics.add_metric(name="InitializeCallCount", value=1, unit="count")
    requests.add_or_update(value=1, dimension_values=[])
    preprocess = metrics.get_metric("PreprocessCallCount", MetricTypes.COUNTER)
    preprocess.add_or_update(value=1, dimension_values=["mnist"])
    batch = metrics.get_metric("RequestBatchSize", MetricTypes.GAUGE)
    batch.add_or_update(value=1, dimension_values=["mnist"])
    metrics.add_size(name="SizeOfImage", value=image_bytes / 1024, idx=None, unit="kB")
    method = [Dimension(name="MethodName", value="preprocess")]
    metrics.add_time("HandlerMethodTime", 2.5, None, "ms", method, MetricTypes.GAUGE)
    metrics.add_counter(name="PostprocessCallCount", value=1, idx=None, dimensions=[])
    metrics.add_percent("ExamplePercentMetric", 50, None, [], MetricTypes.HISTOGRAM)


def _recorded(metrics: HandlerMetrics) -> list[tuple[object, ...]]:
    return [(m.name, m.value, m.unit, m.kind, m.dimensions) for m in metrics.drain()]


def test_the_example_with_its_metrics_yaml(
    declared: tuple[ModelMetric, ...], caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Context("mnist", "/m", {}, 1, None, model_metrics=declared).metrics
    with caplog.at_level(logging.DEBUG, logger="ferry.handler_metrics"):
        _example_calls(metrics, 272)
    assert _recorded(metrics) == [
        ("InitializeCallCount", 1.0, "count", "counter", MODEL),
        ("InferenceRequestCount", 1.0, "count", "counter", ()),
        ("PreprocessCallCount", 1.0, "count", "counter", (("ModelName", "mnist"),)),
        ("RequestBatchSize", 1.0, "count", "gauge", (("ModelName", "mnist"),)),
        ("SizeOfImage", 272 / 1024, "kB", "gauge", MODEL),
        (
            "HandlerMethodTime",
            2.5,
            "ms",
            "gauge",
            (("Level", "Model"), ("MethodName", "preprocess"), ("ModelName", "mnist")),
        ),
        ("PostprocessCallCount", 1.0, "CallCount", "counter", MODEL),  # the declared unit
        ("ExamplePercentMetric", 50.0, "percent", "histogram", MODEL),
    ]
    assert caplog.records == []


def test_the_example_without_a_metrics_config(caplog: pytest.LogCaptureFixture) -> None:
    """TorchServe's get_metric raises for RequestBatchSize here (a 500); Ferry's makes the
    metric, with no dimensions, so its value with one is logged and dropped, once an error."""
    metrics = Context("mnist", "/m", {}, 1, None).metrics
    with caplog.at_level(logging.DEBUG, logger="ferry.handler_metrics"):
        _example_calls(metrics, 272)
        metrics.get_metric("RequestBatchSize", MetricTypes.GAUGE).add_or_update(2, ["mnist"])
    recorded = _recorded(metrics)
    assert [name for name, *_ in recorded] == [
        "InitializeCallCount",
        "InferenceRequestCount",
        "PreprocessCallCount",
        "SizeOfImage",
        "HandlerMethodTime",
        "PostprocessCallCount",
        "ExamplePercentMetric",
    ]
    assert recorded[5] == ("PostprocessCallCount", 1.0, "count", "counter", MODEL)
    assert [(r.levelno, r.getMessage().split(":")[0]) for r in caplog.records] == [
        (logging.ERROR, "metric RequestBatchSize (gauge)"),
        (logging.DEBUG, "metric RequestBatchSize (gauge)"),
    ]
    assert "1 dimension values ['mnist'] for its dimension names []" in caplog.messages[0]


def test_torchserve_default_model_metrics_are_declared_without_a_config() -> None:
    metrics = HandlerMetrics("m")
    handler_time = metrics.get_metric("HandlerTime", MetricTypes.GAUGE)
    assert (handler_time.unit, handler_time.dimension_names) == ("ms", ["ModelName", "Level"])
    metrics.add_time("HandlerTime", 4.0)  # as the base handler records it
    handler_time.add_or_update(5.0, ["m", "Model"])
    assert _recorded(metrics) == [
        ("HandlerTime", 4.0, "ms", "gauge", (("Level", "Model"), ("ModelName", "m"))),
        ("HandlerTime", 5.0, "ms", "gauge", (("Level", "Model"), ("ModelName", "m"))),
    ]


# --- TorchServe's rules for dimension values ----------------------------------------------


def test_wrong_dimension_counts_are_dropped_not_raised(declared: tuple[ModelMetric, ...]) -> None:
    metrics = HandlerMetrics("mnist", declared)
    batch = metrics.get_metric("RequestBatchSize", MetricTypes.GAUGE)
    batch.add_or_update(1, [])
    batch.add_or_update(1, ["mnist", "extra"])
    batch.add_or_update(1, None)
    # add_counter adds ModelName and Level: two values for PreprocessCallCount's one name.
    metrics.add_counter("PreprocessCallCount", 1)
    assert _recorded(metrics) == []


def test_named_dimensions_go_to_their_names_else_in_order() -> None:
    metrics = HandlerMetrics(
        "m", [ModelMetric("Hits", "count", "counter", ("Route", "Level", "ModelName"))]
    )
    # The metric's own names, in another order: each to its name.
    metrics.add_counter("Hits", 1, None, [Dimension("ModelName", "n"), Dimension("Route", "a")])
    # Other names, as many: their values in order (TorchServe's rule).
    metrics.add_counter("Hits", 2, None, [Dimension("route", "b")])
    assert _recorded(metrics) == [
        ("Hits", 1.0, "count", "counter", (("Level", "Model"), ("ModelName", "n"), ("Route", "a"))),
        ("Hits", 2.0, "count", "counter", (("Level", "m"), ("ModelName", "Model"), ("Route", "b"))),
    ]


def test_a_counter_never_goes_down_and_update_renames_dimensions() -> None:
    metrics = HandlerMetrics("m")
    hits = metrics.add_metric_to_cache("Hits", "count", ["route"])
    hits.add_or_update(-1, ["a"])
    hits.update(2, dimensions=[Dimension("path", "/x")])  # TorchServe: the names become these
    hits.add_or_update(3, ["/y"])
    assert _recorded(metrics) == [
        ("Hits", 2.0, "count", "counter", (("path", "/x"),)),
        ("Hits", 3.0, "count", "counter", (("path", "/y"),)),
    ]
    assert hits.dimension_names == ["path"] and hits.metric_name == "Hits"


def test_add_error_has_level_error_only() -> None:
    metrics = HandlerMetrics("m")
    metrics.add_error("Failures", 1)
    assert _recorded(metrics) == [("Failures", 1.0, "", "counter", (("Level", "Error"),))]


def test_torchserves_own_metric_types_find_the_same_metrics(
    declared: tuple[ModelMetric, ...],
) -> None:
    """A worker where the real ``ts`` is installed passes TorchServe's enum."""

    class TheirTypes(enum.Enum):
        COUNTER = "counter"
        GAUGE = "gauge"
        HISTOGRAM = "histogram"

    metrics = HandlerMetrics("mnist", declared)
    batch = metrics.get_metric("RequestBatchSize", TheirTypes.GAUGE)  # type: ignore[arg-type]
    assert batch.dimension_names == ["ModelName"] and batch.metric_type is MetricTypes.GAUGE


def test_the_ts_metrics_modules_handlers_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SHIM_ROOT))
    try:
        caching = importlib.import_module("ts.metrics.caching_metric")
        errors = importlib.import_module("ts.metrics.metric_cache_errors")
    finally:
        for name in [m for m in sys.modules if m == "ts" or m.startswith("ts.")]:
            del sys.modules[name]
    metric = HandlerMetrics("m").add_metric_to_cache("Hits", "count")
    assert isinstance(metric, caching.CachingMetric)
    assert issubclass(errors.MetricsCacheKeyError, KeyError)
    assert issubclass(errors.MetricsCacheTypeError, TypeError)
