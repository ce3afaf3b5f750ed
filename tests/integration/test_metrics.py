"""Prometheus metrics move as requests are served; handler metrics appear, within their
limit."""

from __future__ import annotations

import re
from pathlib import Path

from ferry.store.writer import ArchiveSpec, write_archive
from tests.fixtures.models import HANDLERS
from tests.fixtures.server import RunningServer, ferry_server


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
    # The handler's own metric, recorded through context.metrics, with TorchServe's labels:
    # its dimensions (add_counter's defaults among them), then Hostname.
    digest = {"kind": "digest", "ModelName": "digest", "Level": "Model"}
    served = _value(after, "DigestsServed", **digest)
    assert served >= _value(before, "DigestsServed", **digest) + 5
    assert 'DigestsServed{Level="Model",ModelName="digest",kind="digest",Hostname="' in after


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


def test_a_handler_metric_stops_at_max_handler_metric_series(tmp_path: Path) -> None:
    """Issue 29, defect 8: a dimension value per request made a series per request."""
    store = tmp_path / "store"
    store.mkdir()
    handler = str(HANDLERS / "labelled_metrics_handler.py")
    archive = write_archive(ArchiveSpec(model_name="labelled", handler=handler), store).name
    limit = ("--max-handler-metric-series", "3")
    with ferry_server(store, [archive], tmp_path, *limit) as server:
        with server.client() as client:
            for i in range(7):
                assert client.post("/predictions/labelled", content=b"b%d" % i).status_code == 200
        text = server.metrics()
        log = server.log()
    series = [line for line in text.splitlines() if line.startswith("RequestsByBody{")]
    assert len(series) == 3
    model = {"model_name": "labelled", "model_version": "1.0"}
    assert _value(text, "ferry_handler_metric_values_dropped_total", **model) == 4
    assert log.count("handler metric RequestsByBody: 3 series") == 1
