"""A handler metric holds at most ``max_handler_metric_series`` series; the rest is
dropped, counted and warned about once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ferry.cli.main import build_parser
from ferry.cli.serve import flags_from_args
from ferry.config.sources import load_settings
from ferry.errors import ConfigError
from ferry.metrics.definitions import FerryMetrics
from tests.unit.test_prometheus import assert_parseable

DROPPED = "ferry_handler_metric_values_dropped_total"


def _samples(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def test_series_beyond_the_limit_are_dropped_counted_and_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = FerryMetrics(hostname="h", max_handler_series=100)
    model = metrics.for_model("m", "1.0")
    with caplog.at_level(logging.WARNING, logger="ferry.metrics"):
        for i in range(250):
            model.handler_metric("ByUser", 1, "count", "counter", {"user": f"u{i}"})
        model.handler_metric("ByUser", 1, "count", "counter", {"user": "u0"})  # an old series
        model.handler_metric("Other", 2, "ms", "gauge", {"d": "x"})  # another metric: room
    text = metrics.exposition()
    assert_parseable(text)
    assert len(_samples(text, "ByUser")) == 100
    assert 'ByUser{user="u0",Hostname="h",} 2.0' in text
    assert 'user="u100"' not in text
    assert _samples(text, "Other") == ['Other{d="x",Hostname="h",} 2.0']
    dropped = f'{DROPPED}{{model_name="m",model_version="1.0",reason="series_limit"}} 150'
    assert dropped in text
    warnings = [r.getMessage() for r in caplog.records if "max_handler_metric_series" in r.msg]
    assert warnings == [
        "handler metric ByUser: 100 series (max_handler_metric_series); values with new "
        f"dimension values are dropped ({DROPPED})"
    ]


def test_the_limit_is_per_metric_across_models_and_freed_by_unloading() -> None:
    metrics = FerryMetrics(hostname="h", max_handler_series=2)
    first, second = metrics.for_model("a", "1"), metrics.for_model("b", "1")
    first.handler_metric("Hits", 1, "count", "counter", {"k": "1"})
    first.handler_metric("Hits", 1, "count", "counter", {"k": "2"})
    second.handler_metric("Hits", 1, "count", "counter", {"k": "3"})  # dropped: full
    assert len(_samples(metrics.exposition(), "Hits")) == 2
    assert f'{DROPPED}{{model_name="b",model_version="1",reason="series_limit"}} 1' in (
        metrics.exposition()
    )
    metrics.forget_model("a", "1")
    second.handler_metric("Hits", 1, "count", "counter", {"k": "3"})
    assert _samples(metrics.exposition(), "Hits") == ['Hits{k="3",Hostname="h",} 1.0']


def test_values_with_other_dimensions_are_counted_as_dropped_too() -> None:
    metrics = FerryMetrics(hostname="h")
    model = metrics.for_model("m", "1.0")
    model.handler_metric("Dims", 1, "ms", "gauge", {"a": "x"})
    model.handler_metric("Dims", 1, "ms", "gauge", {"b": "y"})
    model.handler_metric("Dims", 1, "ms", "gauge", {"b": "z"})
    assert f'{DROPPED}{{model_name="m",model_version="1.0",reason="dimensions"}} 2' in (
        metrics.exposition()
    )


def test_the_limit_is_a_setting_of_every_source(tmp_path: Path) -> None:
    assert load_settings({}, {}, None).max_handler_metric_series == 2000
    config = tmp_path / "config.properties"
    config.write_text("max_handler_metric_series=50\n")
    assert load_settings({}, {}, config).max_handler_metric_series == 50
    env = {"FERRY_MAX_HANDLER_METRIC_SERIES": "60"}
    assert load_settings({}, env, None).max_handler_metric_series == 60
    args = build_parser().parse_args(["serve", "--max-handler-metric-series", "70"])
    assert load_settings(flags_from_args(args), {}, None).max_handler_metric_series == 70
    config.write_text("max_handler_metric_series=0\n")
    with pytest.raises(ConfigError, match="max_handler_metric_series"):
        load_settings({}, {}, config)
