"""TorchServe's custom_metrics example on TorchServe 0.12 and on Ferry, side by side: the
same archive, metrics.yaml and requests, then both metrics pages. A dashboard built on
TorchServe's series must find Ferry's: every family TorchServe shows has Ferry's same
``# TYPE`` and the same label names, and where the values are not times, the same samples
(issue 50, item 4; docs/metrics.md, "Handler metrics and ``metrics_config``").

Needs TorchServe in its own virtual environment and Java, as tests/compat's other file;
skipped without.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.fixtures.custom_metrics import (
    Exposed,
    custom_metrics_archive,
    handler_metric_names,
    parse_exposition,
    write_metrics_yaml,
)
from tests.fixtures.polling import wait_until
from tests.fixtures.server import RunningServer, ferry_server
from tests.fixtures.torchserve import VENV_VARIABLE, torchserve_available, torchserve_server
from tests.fixtures.vision_compat import digit_png

pytestmark = [
    pytest.mark.compat,
    pytest.mark.skipif(
        torchserve_available() is None,
        reason=f"no TorchServe 0.12 environment (run scripts/torchserve-venv.sh or set "
        f"{VENV_VARIABLE}) or no java",
    ),
]

REQUESTS = 3
TIMES = {"HandlerTime", "PredictionTime", "HandlerMethodTime"}
"""Gauges of how long something took: the same series on both, not the same value."""


@dataclass
class Pages:
    torchserve: dict[str, Exposed]
    ferry: dict[str, Exposed]


def _counted_every_request(server: RunningServer) -> bool:
    family = parse_exposition(server.metrics()).get("InferenceRequestCount")
    return family is not None and sum(value for _, _, value in family.samples) == REQUESTS


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pages]:
    """Both metrics pages after REQUESTS predictions of the custom-metrics handler."""
    tmp = tmp_path_factory.mktemp("compat_metrics")
    store = tmp / "store"
    store.mkdir()
    models = [f"mnist={custom_metrics_archive(store)}"]
    metrics_yaml = write_metrics_yaml(tmp)
    (tmp / "ts").mkdir()
    (tmp / "ferry").mkdir()
    # The example's config.properties: prometheus mode (the fixture's), its metrics.yaml,
    # and auto-detection for the two metrics it leaves undeclared.
    properties = {"metrics_config": str(metrics_yaml), "model_metrics_auto_detect": "true"}
    with (
        torchserve_server(store, models, tmp / "ts", properties=properties) as torchserve,
        ferry_server(store, models, tmp / "ferry", "--metrics-config", str(metrics_yaml)) as ferry,
    ):
        for server in (torchserve, ferry):
            with server.client() as client:
                for seed in range(REQUESTS):
                    response = client.post("/predictions/mnist", content=digit_png(seed))
                    assert response.status_code == 200, response.text
            # TorchServe reads its workers' metric lines from their log, after the answer.
            wait_until(
                "the handler's metrics of every request",
                functools.partial(_counted_every_request, server),
                timeout=60,
            )
        yield Pages(parse_exposition(torchserve.metrics()), parse_exposition(ferry.metrics()))


def test_torchserve_shows_every_handler_metric(pages: Pages) -> None:
    # What the comparisons below rest on: TorchServe recorded all of them.
    for name in handler_metric_names():
        assert pages.torchserve[name].samples, name
    assert pages.torchserve["ExamplePercentMetric"].kind == "histogram"


@pytest.mark.parametrize("name", handler_metric_names())
def test_a_handler_metric_has_torchserves_type_and_labels(pages: Pages, name: str) -> None:
    torchserve, ferry = pages.torchserve[name], pages.ferry.get(name)
    assert ferry is not None, f"{name} is not on Ferry's page"
    assert ferry.kind == torchserve.kind
    assert ferry.label_names() == torchserve.label_names()
    if name in TIMES:
        return
    # Counts, sizes and the percent histogram's buckets: the same samples, values included.
    assert sorted(ferry.samples, key=repr) == sorted(torchserve.samples, key=repr)


def test_every_family_torchserve_shows_ferry_shows_alike(pages: Pages) -> None:
    # Requests2XX (the frontend metric this metrics.yaml keeps) as well as the handler's.
    differing = {
        name: (family.kind, family.label_names())
        for name, family in pages.torchserve.items()
        if name not in pages.ferry
        or (pages.ferry[name].kind, pages.ferry[name].label_names())
        != (family.kind, family.label_names())
    }
    assert differing == {}
