"""TorchServe's metric names on Ferry's metrics page, as TorchServe's own checks read them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.models import ts_style_archive
from tests.fixtures.server import RunningServer, ferry_server
from tests.unit.test_prometheus import assert_parseable

HOST = r'\{Level="Host",Hostname="[^"]+",\}'
NUMBER = r"(\d+(?:\.\d+)?(?:e[+-]?\d+)?)"
TS = r'\{model_name="doubler",model_version="1\.0",hostname="[^"]+"\}'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("ts_metrics")
    store = tmp / "store"
    store.mkdir()
    with ferry_server(store, [f"doubler={ts_style_archive(store)}"], Path(tmp)) as running:
        yield running


def _sample(text: str, pattern: str) -> float:
    match = re.search(rf"^{pattern} {NUMBER}$", text, re.MULTILINE)
    assert match is not None, f"no sample matches {pattern}"
    return float(match.group(1))


def test_torchserve_names_after_three_inferences(server: RunningServer) -> None:
    with server.client() as client:
        for _ in range(2):
            assert client.post("/predictions/doubler", content=b"[1]").status_code == 200
        before = server.metrics()
        assert client.post("/predictions/doubler", content=b"[1]").status_code == 200
    text = server.metrics()
    assert_parseable(text)
    assert _sample(text, f"Requests2XX{HOST}") == 3
    assert "# TYPE Requests4XX counter" in text and "# TYPE Requests5XX counter" in text
    assert 0 <= _sample(text, f"CPUUtilization{HOST}") <= 100
    assert _sample(text, f"MemoryUsed{HOST}") > 0
    assert _sample(text, f"MemoryAvailable{HOST}") > 0
    assert 0 < _sample(text, f"MemoryUtilization{HOST}") <= 100
    assert _sample(text, f"DiskUsage{HOST}") > 0
    assert _sample(text, f"DiskAvailable{HOST}") > 0
    assert 0 < _sample(text, f"DiskUtilization{HOST}") <= 100
    # QueueTime is the latest request's wait, in ms: between the two scrapes only the third
    # request ran, so it is exactly what that request added to the cumulative queue time
    # (in µs), and part of what it added to the cumulative latency.
    queued_us = _sample(text, f"ts_queue_latency_microseconds{TS}")
    queued_us -= _sample(before, f"ts_queue_latency_microseconds{TS}")
    took_us = _sample(text, f"ts_inference_latency_microseconds{TS}")
    took_us -= _sample(before, f"ts_inference_latency_microseconds{TS}")
    assert _sample(text, f"QueueTime{HOST}") * 1000 == pytest.approx(queued_us)
    assert queued_us <= took_us
    assert _sample(text, f"WorkerThreadTime{HOST}") > 0  # framing and the socket take time
    model = r'\{ModelName="doubler",Level="Model",Hostname="[^"]+",\}'
    assert _sample(text, f"HandlerTime{model}") > 0  # the base handler's own HandlerTime
    assert _sample(text, f"PredictionTime{model}") > 0
    assert "handler_HandlerTime" not in text
    worker = r'\{WorkerName="doubler/1\.0/w0",Level="Host",Hostname="[^"]+",\}'
    assert _sample(text, f"WorkerLoadTime{worker}") > 0
