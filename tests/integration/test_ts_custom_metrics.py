"""TorchServe's custom_metrics example on Ferry: with its config.properties naming a
metrics.yaml (``metrics_config``), its handler's calls answer 200 and its eight metrics
reach the metrics page with their declared units and dimensions (issue 31), typed and
labelled as TorchServe's prometheus mode shows them (issue 50)."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.custom_metrics import custom_metrics_archive, write_metrics_yaml
from tests.fixtures.server import RunningServer, ferry_server
from tests.fixtures.vision_compat import digit_png
from tests.unit.test_prometheus import assert_parseable

HOST = {"Hostname": socket.gethostname()}
TS_MODEL = {"ModelName": "mnist", "Level": "Model", **HOST}
REQUESTS = 3


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, str]]:
    """The server after REQUESTS predictions, and its metrics page then."""
    tmp = tmp_path_factory.mktemp("custom_metrics")
    store = tmp / "store"
    store.mkdir()
    archive = custom_metrics_archive(store)
    config = tmp / "config.properties"
    config.write_text(
        "metrics_mode=prometheus\n"
        f"metrics_config={write_metrics_yaml(tmp)}\n"
        "model_metrics_auto_detect=true\n"
    )
    with ferry_server(store, [archive], Path(tmp), "--ts-config", str(config)) as server:
        with server.client() as client:
            for seed in range(REQUESTS):
                response = client.post("/predictions/mnist", content=digit_png(seed))
                assert response.status_code == 200, response.text
                assert response.json() in range(10)
        yield server, server.metrics()


def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Each sample of ``name``: its labels, its value."""
    found = []
    for line in text.splitlines():
        match = re.fullmatch(r"([A-Za-z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if match is not None and match.group(1) == name:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
            found.append((labels, float(match.group(3))))
    return found


def _only(text: str, name: str, kind: str) -> tuple[dict[str, str], float]:
    assert f"# TYPE {name} {kind}" in text
    samples = _samples(text, name)
    assert len(samples) == 1, samples
    return samples[0]


def test_the_eight_metrics_with_their_units_and_dimensions(
    served: tuple[RunningServer, str],
) -> None:
    _, text = served
    assert_parseable(text)
    # Declared with no dimensions, recorded through add_metric_to_cache's metric.
    assert _only(text, "InferenceRequestCount", "counter") == (HOST, REQUESTS)
    # add_metric in initialize: the default dimensions; one worker, loaded once.
    assert _only(text, "InitializeCallCount", "counter") == (TS_MODEL, 1)
    # Fetched with get_metric, its one dimension given by add_or_update.
    assert _only(text, "PreprocessCallCount", "counter") == (
        {"ModelName": "mnist", **HOST},
        REQUESTS,
    )
    # Declared in metrics.yaml only: the call that answered 500 before.
    assert _only(text, "RequestBatchSize", "gauge") == ({"ModelName": "mnist", **HOST}, 1)
    # add_size of a declared metric: its declared dimensions, the last image's size.
    labels, size = _only(text, "SizeOfImage", "gauge")
    assert labels == TS_MODEL
    assert size == pytest.approx(len(digit_png(REQUESTS - 1)) / 1024)
    # add_counter of a declared metric: the declared unit, not add_counter's "count".
    assert _only(text, "PostprocessCallCount", "counter") == (TS_MODEL, REQUESTS)
    assert "# HELP PostprocessCallCount Handler counter metric PostprocessCallCount, unit: " in (
        text
    )
    assert "unit: CallCount." in text
    # Not declared: made by the first call, its dimension then the default ones.
    labels, took_ms = _only(text, "HandlerMethodTime", "gauge")
    assert labels == {"MethodName": "preprocess", **TS_MODEL}
    assert 0 < took_ms < 60_000
    # A histogram, as in TorchServe: every request's 50 observed.
    assert "# TYPE ExamplePercentMetric histogram" in text
    assert _samples(text, "ExamplePercentMetric_count") == [(TS_MODEL, REQUESTS)]
    assert _samples(text, "ExamplePercentMetric_sum") == [(TS_MODEL, 50 * REQUESTS)]
    assert len(_samples(text, "ExamplePercentMetric_bucket")) == 15


def test_nothing_was_dropped_and_torchserve_names_stay(served: tuple[RunningServer, str]) -> None:
    server, text = served
    log = server.log()
    assert "dropped" not in log
    assert "metrics_config is a TorchServe setting" not in log  # read now, not ignored
    assert "unknown setting" not in log
    assert "model_metrics_auto_detect is a TorchServe setting Ferry does not use" in log
    # The base handler's HandlerTime is still TorchServe's own metric.
    handler_time = [s for s in text.splitlines() if s.startswith("HandlerTime{")]
    assert len(handler_time) == 1 and 'ModelName="mnist",Level="Model"' in handler_time[0]
    assert "handler_HandlerTime" not in text
