"""Prometheus metrics move as requests are served; handler metrics appear."""

from __future__ import annotations

import re

from tests.fixtures.server import RunningServer


def _value(text: str, name: str, **labels: str) -> float:
    """The sample of ``name`` whose labels include ``labels`` (0 if absent)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        match = re.fullmatch(r"([^{ ]+)(\{.*\})? (\S+)", line)
        if match is None or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match.group(3))
    return 0.0


def test_metrics_move_with_requests(main_server: RunningServer) -> None:
    model = {"model_name": "digest", "model_version": "1.0"}
    before = main_server.metrics()
    with main_server.client() as client:
        for i in range(5):
            assert client.post("/predictions/digest", content=f"m{i}".encode()).status_code == 200
        assert client.post("/predictions/nope", content=b"x").status_code == 404
    after = main_server.metrics()
    assert _value(after, "ts_inference_requests_total", **model) == (
        _value(before, "ts_inference_requests_total", **model) + 5
    )
    assert _value(after, "ts_inference_latency_microseconds", **model) > _value(
        before, "ts_inference_latency_microseconds", **model
    )
    assert _value(after, "ferry_request_duration_seconds_count", **model) >= 5
    assert _value(after, "ferry_queue_wait_seconds_count", **model) >= 5
    assert _value(after, "ferry_batch_size_count", **model) >= 1
    assert _value(after, "ferry_batch_stage_seconds_count", stage="handle", **model) >= 1
    assert _value(after, "ferry_responses_total", api="inference", status_class="4xx") >= 1
    assert _value(after, "ferry_responses_total", api="inference", status_class="2xx") >= 5
    assert _value(after, "ferry_queue_depth", **model) == 0
    assert _value(after, "ferry_workers", state="ready", **model) == 1
    assert _value(after, "ferry_process_resident_memory_bytes", process="frontend") > 0
    assert _value(after, "ferry_process_cpu_seconds_total", process="digest/1.0/w0") > 0
    # The handler's own metric, recorded through context.metrics.
    served = _value(after, "DigestsServed", kind="digest", unit="count", **model)
    assert served >= _value(before, "DigestsServed", kind="digest", unit="count", **model) + 5


def test_stage_metrics_for_base_handler_models(main_server: RunningServer) -> None:
    with main_server.client() as client:
        assert client.post("/predictions/doubler", content=b"[1]").status_code == 200
    text = main_server.metrics()
    model = {"model_name": "doubler", "model_version": "1.0"}
    for stage in ("preprocess", "inference", "postprocess"):
        assert _value(text, "ferry_batch_stage_seconds_count", stage=stage, **model) >= 1
    assert "# TYPE ferry_batch_stage_seconds histogram" in text


def test_worker_restarts_are_counted(main_server: RunningServer) -> None:
    model = {"model_name": "victim", "model_version": "1.0"}
    before = _value(main_server.metrics(), "ferry_worker_restarts_total", **model)
    with main_server.client() as client:
        assert client.post("/predictions/victim", content=b"crash").status_code == 500
        assert client.post("/predictions/victim", content=b"ok").status_code == 200
    # A lone request that kills its worker is not retried: one restart, not two.
    assert _value(main_server.metrics(), "ferry_worker_restarts_total", **model) == before + 1
