"""Traces from a real server over the wire: ``enable_tracing`` with OTLP over HTTP to a
receiver this test runs (it decodes OpenTelemetry's protobuf export requests). Eight
requests in one batch of a TorchServe-style handler each show their client's parent,
their queue wait, the batch they joined and, through it, their seven siblings and the
batch's three stages; the client's traceparent is taken from KServe V1 and V2 and from
gRPC metadata alike; the access line names the trace. The exporter process sends over
OTLP/gRPC too, counts what an unreachable collector loses, is replaced when it dies, and
refuses an exporter it cannot build."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from ferry.errors import ConfigError
from ferry.grpc.generated import ferry_torchserve_inference_pb2 as inference
from ferry.grpc.generated import ferry_torchserve_inference_pb2_grpc as inference_grpc
from ferry.tracing.export_process import ExporterProcess
from ferry.tracing.records import KIND_INTERNAL, Record
from tests.fixtures.models import ts_style_archive
from tests.fixtures.otlp_receiver import Receiver
from tests.fixtures.polling import HANG_GUARD, wait_until
from tests.fixtures.server import RunningServer, ferry_server

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


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


class GrpcReceiver:
    """An OTLP/gRPC traces endpoint (the trace service's one method, registered by
    name): every span it was sent, by span id (hex)."""

    def __init__(self) -> None:
        self.spans: dict[str, Any] = {}
        self._server = grpc.server(ThreadPoolExecutor(2))
        parse = trace_service_pb2.ExportTraceServiceRequest.FromString
        handler = grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.trace.v1.TraceService",
            {
                "Export": grpc.unary_unary_rpc_method_handler(
                    self._export,
                    request_deserializer=parse,
                    response_serializer=lambda answer: answer.SerializeToString(),
                )
            },
        )
        self._server.add_generic_rpc_handlers((handler,))
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.url = f"http://127.0.0.1:{port}"
        self._server.start()

    def _export(self, request: Any, context: Any) -> Any:
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans[span.span_id.hex()] = span
        return trace_service_pb2.ExportTraceServiceResponse()

    def close(self) -> None:
        self._server.stop(grace=None)


def _records(count: int, first: int = 1) -> list[Record]:
    """Spans' fields as the exporter process takes them: plain tuples."""
    start = time.time_ns()
    return [
        (
            0xAB,
            first + i,
            0,
            f"span {i}",
            KIND_INTERNAL,
            start,
            start + 1,
            (("i", i),),
            (),
            "",
            "",
            False,
        )
        for i in range(count)
    ]


def _otlp(protocol: str, url: str) -> dict[str, str]:
    return {
        **os.environ,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2",
    }


def test_the_exporter_process_sends_ferrys_encoding_over_grpc() -> None:
    receiver = GrpcReceiver()
    try:
        process = ExporterProcess(_otlp("grpc", receiver.url))
        assert process.send(_records(600))
        process.close()  # it sends what it holds before it exits
        assert len(receiver.spans) == 600 and process.lost == 0
        span = receiver.spans[f"{1:016x}"]
        assert (span.name, span.trace_id.hex(), span.attributes[0].value.int_value) == (
            "span 0",
            f"{0xAB:032x}",
            0,
        )
    finally:
        receiver.close()


def test_an_unreachable_collector_is_counted_as_lost_spans(receiver: Receiver) -> None:
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{unused.getsockname()[1]}"
    process = ExporterProcess(_otlp("http/protobuf", url))
    try:
        assert process.send(_records(5))
        wait_until("the lost spans to be counted", lambda: process.lost == 5)
    finally:
        process.close()


def test_a_dead_exporter_process_is_replaced(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ExporterProcess, "RESTART_INTERVAL", 0.0)
    process = ExporterProcess(_otlp("http/protobuf", receiver.url))
    try:
        process._process.kill()
        process._process.wait()
        assert not process.send(_records(3, first=0x6000))  # lost: the event loop never waits
        process.send_pending()  # the export thread's turn: it starts another
        assert process.send(_records(3, first=0x7000))
        process.close()
        assert {f"{0x7000 + i:016x}" for i in range(3)} <= set(receiver.spans)
    finally:
        process.close()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's idle scheduling class")
def test_the_exporter_process_runs_only_on_idle_cpu(receiver: Receiver) -> None:
    process = ExporterProcess(_otlp("http/protobuf", receiver.url))
    try:  # ready: it has set its class before it answered
        assert os.sched_getscheduler(process._process.pid) == os.SCHED_IDLE
        assert process.send(_records(2, first=0x5000))
    finally:
        process.close()
    assert {f"{0x5000:016x}", f"{0x5001:016x}"} <= set(receiver.spans)


def test_a_stalled_exporter_process_never_blocks_the_sender(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ExporterProcess, "MAX_UNWRITTEN", 256 << 10)
    BASE = 0x10_0000  # span ids no other test sends to the module's receiver
    process = ExporterProcess(_otlp("http/protobuf", receiver.url))
    os.kill(process._process.pid, signal.SIGSTOP)  # reads nothing: the pipe fills
    sender = ThreadPoolExecutor(1)
    try:
        sends = sender.submit(
            lambda: [process.send(_records(500, first=BASE + i * 1000)) for i in range(20)]
        )
        accepted = sends.result(timeout=HANG_GUARD)  # a send waiting for the reader fails here
    finally:
        os.kill(process._process.pid, signal.SIGCONT)
        sender.shutdown()
    assert accepted[0] and not accepted[-1]  # kept up to the bound, then lost
    process.close()  # what it kept is written before the input closes
    ids = [{f"{BASE + i * 1000 + n:016x}" for n in range(500)} for i in range(20)]
    received = set(receiver.spans)  # the receiver's spans from this module's other tests too
    for batch_ids, ok in zip(ids, accepted, strict=True):
        assert batch_ids <= received if ok else not batch_ids & received


def test_an_exporter_the_process_cannot_build_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="zipkin"):
        ExporterProcess({**os.environ, "OTEL_TRACES_EXPORTER": "zipkin"})


def test_the_console_exporter_prints_to_the_servers_stdout(
    capfd: pytest.CaptureFixture[str],
) -> None:
    process = ExporterProcess({**os.environ, "OTEL_TRACES_EXPORTER": "console"})
    assert process.send(_records(2, first=0x9000))
    process.close()
    printed = capfd.readouterr().out
    assert '"name": "span 0"' in printed and '"name": "span 1"' in printed
