"""Handler metrics on the metrics page as TorchServe 0.12 shows them in prometheus mode:
its metric types and its labels (the dimensions, then ``Hostname``), so dashboards built
on TorchServe's series work on Ferry (issue 50; tests/compat checks it against TorchServe)."""

from __future__ import annotations

import pytest

from ferry.metrics.definitions import FerryMetrics
from ferry.metrics.families import TS_HISTOGRAM_BUCKETS
from tests.fixtures.custom_metrics import parse_exposition
from tests.unit.test_prometheus import assert_parseable

TS_MODEL = {"ModelName": "mnist", "Level": "Model"}


def _page(metrics: FerryMetrics) -> str:
    text = metrics.exposition()
    assert_parseable(text)
    return text


@pytest.mark.parametrize("kind", ["counter", "gauge", "histogram"])
def test_each_torchserve_type_is_kept(kind: str) -> None:
    metrics = FerryMetrics(hostname="h")
    metrics.for_model("mnist", "1.0").handler_metric("Thing", 2, "ms", kind, TS_MODEL)
    assert parse_exposition(_page(metrics))["Thing"].kind == kind


def test_another_kind_is_a_gauge() -> None:
    metrics = FerryMetrics(hostname="h")
    metrics.for_model("mnist", "1.0").handler_metric("Took", 2, "ms", "time", {})
    assert '# TYPE Took gauge\nTook{Hostname="h",} 2.0\n' in _page(metrics)


def test_labels_are_the_dimensions_then_hostname_and_the_unit_is_in_the_help() -> None:
    metrics = FerryMetrics(hostname="h")
    model = metrics.for_model("mnist", "1.0")
    model.handler_metric("SizeOfImage", 0.5, "kB", "gauge", TS_MODEL)
    model.handler_metric("InferenceRequestCount", 1, "count", "counter", {})
    text = _page(metrics)
    assert 'SizeOfImage{Level="Model",ModelName="mnist",Hostname="h",} 0.5\n' in text
    assert 'InferenceRequestCount{Hostname="h",} 1.0\n' in text
    assert "# HELP SizeOfImage Handler gauge metric SizeOfImage, unit: kB.\n" in text
    families = parse_exposition(text)
    for name in ("SizeOfImage", "InferenceRequestCount"):
        for _, labels, _ in families[name].samples:
            assert not {"model_name", "model_version", "unit"} & set(labels), labels


def test_a_histogram_has_torchserves_buckets_written_as_its_java_client_writes_them() -> None:
    metrics = FerryMetrics(hostname="h")
    model = metrics.for_model("mnist", "1.0")
    for value in (50, 0.3, 1):
        model.handler_metric("ExamplePercentMetric", value, "percent", "histogram", TS_MODEL)
    text = _page(metrics)
    buckets = {
        labels["le"]: count
        for sample, labels, count in parse_exposition(text)["ExamplePercentMetric"].samples
        if sample.endswith("_bucket")
    }
    # The Java Prometheus client's default bounds, each written as a double.
    assert list(buckets) == [*(repr(float(b)) for b in TS_HISTOGRAM_BUCKETS), "+Inf"]
    assert list(buckets)[9:12] == ["1.0", "2.5", "5.0"]
    assert buckets["0.25"] == 0 and buckets["0.5"] == 1 and buckets["1.0"] == 2
    assert buckets["10.0"] == 2 and buckets["+Inf"] == 3
    labels = '{Level="Model",ModelName="mnist",Hostname="h",}'
    assert f"ExamplePercentMetric_count{labels} 3.0\nExamplePercentMetric_sum{labels} 51.3" in text


def test_a_metric_keeps_the_type_of_its_first_value() -> None:
    # TorchServe's frontend knows a metric by name: the type it was declared (or first
    # recorded) with takes every later value.
    metrics = FerryMetrics(hostname="h")
    model = metrics.for_model("m", "1")
    model.handler_metric("Calls", 1, "count", "counter", {})
    model.handler_metric("Calls", 2, "count", "gauge", {})  # added, not set
    model.handler_metric("Calls", -5, "count", "gauge", {})  # a counter never goes down
    model.handler_metric("Spread", 4, "ms", "histogram", {})
    model.handler_metric("Spread", 6, "ms", "gauge", {})  # observed
    text = _page(metrics)
    assert '# TYPE Calls counter\nCalls{Hostname="h",} 3.0\n' in text
    assert "# TYPE Spread histogram\n" in text
    assert 'Spread_count{Hostname="h",} 2.0\nSpread_sum{Hostname="h",} 10.0\n' in text


def test_models_writing_the_same_series_share_it_until_both_are_unloaded() -> None:
    # No model label: as on TorchServe, a counter two models write with the same dimension
    # values is one series, their sum.
    metrics = FerryMetrics(hostname="h")
    first, second = metrics.for_model("a", "1"), metrics.for_model("b", "1")
    first.handler_metric("Hits", 1, "count", "counter", {})
    second.handler_metric("Hits", 2, "count", "counter", {})
    first.handler_metric("Own", 1, "count", "counter", {"ModelName": "a"})
    assert 'Hits{Hostname="h",} 3.0\n' in _page(metrics)
    metrics.forget_model("a", "1")
    text = _page(metrics)
    assert 'Hits{Hostname="h",} 3.0\n' in text  # b still writes it
    assert "Own{" not in text
    metrics.forget_model("b", "1")
    assert "Hits{" not in _page(metrics)
