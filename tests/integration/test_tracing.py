"""Traces from a real server over the wire: ``enable_tracing`` with OTLP over HTTP to a
receiver this test runs (it decodes OpenTelemetry's protobuf export requests). Eight
requests in one batch of a TorchServe-style handler each show their client's parent,
their queue wait, the batch they joined and, through it, their seven siblings and the
batch's three stages; the client's traceparent is taken from KServe V1 and V2 and from
gRPC metadata alike; the access line names the trace."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from ferry.grpc.generated import ferry_torchserve_inference_pb2 as inference
from ferry.grpc.generated import ferry_torchserve_inference_pb2_grpc as inference_grpc
from tests.fixtures.models import ts_style_archive
from tests.fixtures.polling import HANG_GUARD, wait_until
from tests.fixtures.server import RunningServer, ferry_server

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


class Receiver:
    """An OTLP/HTTP traces endpoint: every span it was sent, by span id (hex)."""

    def __init__(self) -> None:
        self.spans: dict[str, Any] = {}
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._take(request)
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _take(self, request: Any) -> None:
        with self._lock:
            for resource_spans in request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans[span.span_id.hex()] = span

    def named(self, name: str) -> list[Any]:
        with self._lock:
            return [span for span in self.spans.values() if span.name == name]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("tracing")
    store = tmp / "store"
    store.mkdir()
    # Eight requests fill a batch long before its window closes.
    archive = ts_style_archive(store, batchSize=8, maxBatchDelay=30000, batchPolicy="fixed_window")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        patch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        patch.setenv("OTEL_SERVICE_NAME", "ferry-under-test")
        single = ts_style_archive(store, name="single", batchSize=1)  # answers alone, at once
        models = [f"doubler={archive}", f"single={single}"]
        with ferry_server(store, models, tmp, "--enable-tracing", "true") as running:
            yield running


def _parent(index: int) -> str:
    return f"{index + 1:016x}"


def test_a_batch_of_eight_is_traced_through_queue_batch_and_stages(
    server: RunningServer, receiver: Receiver
) -> None:
    def predict(index: int) -> httpx.Response:
        headers = {"traceparent": f"00-{TRACE_ID}-{_parent(index)}-01"}
        with httpx.Client(timeout=HANG_GUARD) as client:
            url = f"{server.url}/predictions/doubler"
            return client.post(url, content=json.dumps([index]), headers=headers)

    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(predict, range(8)))
    assert [r.status_code for r in responses] == [200] * 8, [r.text for r in responses]

    def mine() -> list[Any]:
        return [s for s in receiver.named("predict doubler") if s.trace_id.hex() == TRACE_ID]

    wait_until("the eight request spans", lambda: len(mine()) == 8)
    requests = mine()
    assert sorted(s.parent_span_id.hex() for s in requests) == [_parent(i) for i in range(8)]
    batch_ids = {link.span_id.hex() for s in requests for link in s.links}
    assert len(batch_ids) == 1  # all eight joined one batch
    (batch_id,) = batch_ids
    wait_until("the batch span", lambda: batch_id in receiver.spans)
    batch = receiver.spans[batch_id]
    assert batch.name == "batch doubler"
    assert {link.span_id.hex() for link in batch.links} == {s.span_id.hex() for s in requests}

    def children(name: str, of: set[str]) -> list[Any]:
        return [s for s in receiver.named(name) if s.parent_span_id.hex() in of]

    request_ids = {s.span_id.hex() for s in requests}
    wait_until("the queue spans", lambda: len(children("queue", request_ids)) == 8)
    stages = ("preprocess", "inference", "postprocess")
    wait_until("the stage spans", lambda: all(len(children(s, {batch_id})) == 1 for s in stages))
    timed = sorted(
        (children(s, {batch_id})[0] for s in stages), key=lambda s: s.start_time_unix_nano
    )
    assert [s.name for s in timed] == list(stages)
    assert batch.start_time_unix_nano <= timed[0].start_time_unix_nano
    assert timed[-1].end_time_unix_nano <= batch.end_time_unix_nano


def test_kserve_v1_v2_and_grpc_take_the_clients_traceparent(
    server: RunningServer, receiver: Receiver
) -> None:
    v2_parent, grpc_parent, v1_parent = "00000000000000aa", "00000000000000bb", "00000000000000dd"
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [3.0]}]}
    with httpx.Client(timeout=HANG_GUARD) as client:
        answer = client.post(
            f"{server.url}/v2/models/single/infer",
            json=body,
            headers={"traceparent": f"00-{TRACE_ID}-{v2_parent}-01"},
        )
    assert answer.status_code == 200, answer.text
    with httpx.Client(timeout=HANG_GUARD) as client:
        v1 = client.post(
            f"{server.url}/v1/models/single:predict",
            json={"instances": [{"data": [2.0]}]},
            headers={"traceparent": f"00-{TRACE_ID}-{v1_parent}-01"},
        )
    assert v1.status_code == 200, v1.text
    with grpc.insecure_channel(server.grpc_url.removeprefix("grpc://")) as channel:
        stub = inference_grpc.InferenceAPIsServiceStub(channel)  # type: ignore[no-untyped-call]
        request = inference.PredictionsRequest(model_name="single", input={"data": b"[4]"})
        metadata = (("traceparent", f"00-{TRACE_ID}-{grpc_parent}-01"),)
        stub.Predictions(request, metadata=metadata, timeout=HANG_GUARD)

    def parents() -> set[str]:
        return {s.parent_span_id.hex() for s in receiver.named("predict single")}

    wait_until("the requests' spans", lambda: {v2_parent, grpc_parent, v1_parent} <= parents())


def test_the_access_line_names_the_trace(server: RunningServer) -> None:
    trace_id = "5bf92f3577b34da6a3ce929d0e0e4736"
    with httpx.Client(timeout=HANG_GUARD) as client:
        answer = client.post(
            f"{server.url}/predictions/single",
            content=b"[5]",
            headers={"traceparent": f"00-{trace_id}-00000000000000cc-01"},
        )
    assert answer.status_code == 200

    def access_line() -> bool:
        lines = server.log().splitlines()
        return any("ferry.access" in line and f"trace_id={trace_id}" in line for line in lines)

    wait_until("its access line", access_line)
