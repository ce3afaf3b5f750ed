"""Traces through the service and the scheduler, with fake workers and OpenTelemetry's
in-memory exporter: a client's traceparent is the request span's parent; the request's
queue wait is its child; a batch's span links every request it served and each of them
links it back; the batch's stages are its children with the worker's times; failures
end the spans with the error; sampling off records nothing; tracing off touches no
request. The bounded export queue drops (and counts) spans when the exporter stalls,
and never blocks the caller."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from ferry.config.settings import ServerSettings
from ferry.config.sources import load_settings
from ferry.errors import ConfigError
from ferry.service import FerryService
from ferry.service.types import InputPart, Prediction, PredictionRequest
from ferry.tracing import NO_TRACING, tracing_for
from ferry.tracing.otel import exporter_from_environment, otel_tracing
from ferry.tracing.recorder import BoundedExport, Recorder
from ferry.tracing.records import BATCH, KIND_INTERNAL, REQUEST, Record
from ferry.wire.messages import BatchResult, PredictBatch, StageWindow
from ferry.wire.spec import WorkerSpec
from ferry.workflows.manager import RegisteredWorkflow, WorkflowManager
from ferry.workflows.spec import parse_spec
from tests.fixtures.fake_worker import Behaviour, FakeWorker
from tests.fixtures.models import digest_archive

BOUND = 30
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"
HTTP_EXPORTER = "opentelemetry.exporter.otlp.proto.http"
TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"


class StagedWorker(FakeWorker):
    """An echoing worker that reports its three stages, as the built-in handlers do."""

    async def receive(self) -> BatchResult:
        answer = await super().receive()
        assert isinstance(answer, BatchResult)
        start = 1_000_000_000_000
        windows = [
            StageWindow(stage, start + i * 1_000_000, start + (i + 1) * 1_000_000)
            for i, stage in enumerate(("preprocess", "inference", "postprocess"))
        ]
        stages = {window.stage: 1.0 for window in windows}
        return BatchResult(answer.batch_id, answer.results, 3.0, [], stages, windows)


class Workers:
    def __init__(self, behaviour: Behaviour = Behaviour.ECHO) -> None:
        self.behaviour = behaviour
        self.started: list[FakeWorker] = []

    async def __call__(self, spec: WorkerSpec, startup_timeout: float) -> FakeWorker:
        worker = StagedWorker(self.behaviour)
        self.started.append(worker)
        return worker


class Exported:
    """The spans a tracer exported to OpenTelemetry's in-memory exporter, once it is
    shut down (which sends what its queue holds)."""

    def __init__(self, tracing: Recorder, exporter: InMemorySpanExporter) -> None:
        self._tracing, self._exporter = tracing, exporter

    def get_finished_spans(self) -> tuple[ReadableSpan, ...]:
        self._tracing.shutdown()
        return self._exporter.get_finished_spans()


def _otel(sampler: str = "parentbased_always_on") -> tuple[Recorder, Exported]:
    exporter = InMemorySpanExporter()
    tracing = otel_tracing(exporter, environ={"OTEL_TRACES_SAMPLER": sampler})
    return tracing, Exported(tracing, exporter)


async def _service(store: Path, tracing: Any, workers: Workers) -> FerryService:
    settings = ServerSettings(model_store=store, models=("digest=digest.mar",))
    service = FerryService(settings, workers, tracing=tracing)
    await service.load_startup_models()
    return service


async def _predict_together(
    service: FerryService, count: int, headers: dict[str, str]
) -> list[Any]:
    """``count`` requests submitted before the dispatcher runs: one batch. Their answers,
    or the errors they failed with."""
    pendings = [
        service.submit(
            service.admit("digest"),
            PredictionRequest([InputPart("body", "text/plain", b"%d" % i)], headers),
        )
        for i in range(count)
    ]
    await asyncio.wait([p.future for p in pendings], timeout=BOUND)
    return [p.future.exception() or p.result() for p in pendings]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    store.mkdir()
    digest_archive(store, "digest", batchSize=4, maxBatchDelay=5000)
    return store


def _by_name(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def test_a_batch_of_four_is_traced_through_its_queue_its_batch_and_its_stages(
    store: Path,
) -> None:
    tracing, exported = _otel()

    async def scenario() -> list[Any]:
        service = await _service(store, tracing, Workers())
        answers = await _predict_together(service, 4, {"traceparent": PARENT})
        await service.close()
        return answers

    answers = asyncio.run(asyncio.wait_for(scenario(), BOUND))
    spans = exported.get_finished_spans()
    requests = _by_name(spans, "predict digest")
    (batch,) = _by_name(spans, "batch digest")
    assert len(requests) == 4
    for request in requests:  # the client's trace, under the client's span
        assert request.context is not None and request.parent is not None
        assert f"{request.context.trace_id:032x}" == TRACE_ID
        assert f"{request.parent.span_id:016x}" == "b7ad6b7169203331"
        assert request.attributes is not None and request.attributes["ferry.batch.size"] == 4
        assert [link.context.span_id for link in request.links] == [batch.context.span_id]
    linked = {link.context.span_id for link in batch.links}
    assert linked == {request.context.span_id for request in requests if request.context}
    assert batch.attributes is not None and batch.attributes["ferry.batch.size"] == 4
    queues = _by_name(spans, "queue")
    assert sorted(q.parent.span_id for q in queues if q.parent) == sorted(
        r.context.span_id for r in requests if r.context
    )
    stages = [
        s for s in spans if s.parent is not None and s.parent.span_id == batch.context.span_id
    ]
    assert [(s.name, s.start_time, s.end_time) for s in stages] == [
        ("preprocess", 1_000_000_000_000, 1_000_001_000_000),
        ("inference", 1_000_001_000_000, 1_000_002_000_000),
        ("postprocess", 1_000_002_000_000, 1_000_003_000_000),
    ]
    # The access log line gets the request's own ids.
    ids = {answer.trace_ids for answer in answers}
    assert ids == {
        (TRACE_ID, f"{r.context.span_id:016x}") for r in requests if r.context is not None
    }


def test_without_a_traceparent_each_request_starts_a_trace_of_its_own(store: Path) -> None:
    tracing, exported = _otel()

    async def scenario() -> None:
        service = await _service(store, tracing, Workers())
        await _predict_together(service, 2, {})
        await service.close()

    asyncio.run(asyncio.wait_for(scenario(), BOUND))
    requests = _by_name(exported.get_finished_spans(), "predict digest")
    assert len({r.context.trace_id for r in requests if r.context}) == 2
    assert all(r.parent is None for r in requests)


def test_a_request_whose_worker_dies_ends_its_spans_with_the_error(store: Path) -> None:
    tracing, exported = _otel()

    async def scenario() -> None:
        service = await _service(store, tracing, Workers(Behaviour.EXIT))
        await _predict_together(service, 1, {"traceparent": PARENT})
        await service.close()

    asyncio.run(asyncio.wait_for(scenario(), BOUND))
    spans = exported.get_finished_spans()
    (request,) = _by_name(spans, "predict digest")
    assert request.status.status_code is StatusCode.ERROR
    assert request.attributes is not None and request.attributes["error.type"] == "WorkerDied"
    batches = _by_name(spans, "batch digest")
    assert batches and all(b.status.status_code is StatusCode.ERROR for b in batches)
    assert {s.name for s in spans} <= {"predict digest", "queue", "batch digest"}


def test_sampling_off_records_no_span_and_sends_no_context(store: Path) -> None:
    tracing, exported = _otel(sampler="always_off")
    workers = Workers()

    async def scenario() -> None:
        service = await _service(store, tracing, workers)
        await _predict_together(service, 2, {})
        await service.close()

    asyncio.run(asyncio.wait_for(scenario(), BOUND))
    assert exported.get_finished_spans() == ()
    batches: list[PredictBatch] = [b for w in workers.started for b in w.batches]
    assert batches and all(b.traceparent == "" for b in batches)


def test_tracing_off_gives_no_request_a_trace(store: Path) -> None:
    workers = Workers()

    async def scenario() -> list[Any]:
        service = await _service(store, NO_TRACING, workers)
        answers = await _predict_together(service, 2, {"traceparent": PARENT})
        await service.close()
        return answers

    answers = asyncio.run(asyncio.wait_for(scenario(), BOUND))
    assert all(answer.trace_ids is None for answer in answers)
    assert all(b.traceparent == "" for w in workers.started for b in w.batches)


def test_the_worker_gets_the_batch_spans_context(store: Path) -> None:
    tracing, exported = _otel()
    workers = Workers()

    async def scenario() -> None:
        service = await _service(store, tracing, workers)
        await _predict_together(service, 1, {})
        await service.close()

    asyncio.run(asyncio.wait_for(scenario(), BOUND))
    (batch,) = _by_name(exported.get_finished_spans(), "batch digest")
    (sent,) = [b for w in workers.started for b in w.batches]
    assert batch.context is not None
    version, trace_id, span_id, flags = sent.traceparent.split("-")
    assert (trace_id, span_id) == (
        f"{batch.context.trace_id:032x}",
        f"{batch.context.span_id:016x}",
    )
    assert version == "00" and int(flags, 16) & 1  # sampled


class Destination:
    """Takes batches, as ``send`` says; ``blocked``: waits until released first (an
    unreachable collector)."""

    lost = 0
    never_blocks = False
    loss_reason = "the test's destination refused it"

    def __init__(self, send: Callable[[list[Record]], bool], blocked: bool = False) -> None:
        self._send = send
        self.entered = threading.Event()
        self.release = threading.Event()
        if not blocked:
            self.release.set()
        self.batches: list[int] = []
        self.senders: list[int] = []  # the threads that sent each batch
        self.pending_sends = 0
        self.upkeep: threading.Event | None = None
        self.in_upkeep = threading.Event()
        self.closed = False

    def send(self, records: list[Record]) -> bool:
        self.entered.set()
        self.release.wait(BOUND)
        self.batches.append(len(records))
        self.senders.append(threading.get_ident())
        return self._send(records)

    def send_pending(self) -> None:
        self.pending_sends += 1
        if self.upkeep is not None:  # as long as starting a new exporter takes
            self.in_upkeep.set()
            self.upkeep.wait(BOUND)

    def close(self) -> None:
        self.closed = True


def _spans(export: BoundedExport, count: int) -> None:
    for index in range(count):
        export.add((1, index + 1, 0, f"span {index}", KIND_INTERNAL, 1, 2, (), (), "", "", False))


def test_a_stalled_exporter_makes_the_queue_drop_spans_and_count_them() -> None:
    destination = Destination(lambda spans: True, blocked=True)
    export = BoundedExport(destination, max_queue=4, batch_size=1, interval=BOUND)
    _spans(export, 1)
    assert destination.entered.wait(BOUND)  # the export thread holds that span, stalled
    _spans(export, 6)  # never waits: 4 queued, 2 dropped
    assert export.dropped == 2
    destination.release.set()
    assert export.flush(BOUND)
    export.shutdown()
    assert sum(destination.batches) == 5 and export.exported == 5 and destination.closed


def test_dropped_and_exported_records_count_the_spans_they_hold() -> None:
    destination = Destination(lambda records: True, blocked=True)
    export = BoundedExport(destination, max_queue=1, batch_size=1, interval=BOUND)
    request: Record = (REQUEST, 1, 2, 0, "predict m", 1, 2, 3, (), "r", (), (), "", "", False)
    stages = (("preprocess", 1, 2), ("inference", 2, 3), ("postprocess", 3, 4))
    batch: Record = (BATCH, 1, 3, 2, "batch m", 1, 4, (), ((1, 2),), "", "", stages)
    export.add(request)
    assert destination.entered.wait(BOUND)  # the export thread holds it, stalled
    export.add(batch)  # queued
    export.add(request)  # dropped: 2 spans
    assert export.dropped == 2
    destination.release.set()
    export.shutdown()
    assert export.exported == 2 + 4


def test_a_destination_that_never_blocks_gets_full_batches_from_the_adding_thread() -> None:
    destination = Destination(lambda records: True)
    destination.never_blocks = True
    export = BoundedExport(destination, max_queue=64, batch_size=4, interval=BOUND)
    _spans(export, 9)  # two full batches, sent as they fill; one span left for the thread
    assert destination.batches == [4, 4]
    assert destination.senders == [threading.get_ident()] * 2
    export.shutdown()  # the export thread sends the last one, and what the destination kept
    assert destination.batches == [4, 4, 1] and destination.senders[2] != threading.get_ident()
    assert destination.pending_sends >= 1 and export.exported == 9


def test_the_adding_thread_never_waits_for_the_export_threads_upkeep() -> None:
    destination = Destination(lambda records: True)
    destination.never_blocks = True
    destination.upkeep = threading.Event()
    export = BoundedExport(destination, max_queue=64, batch_size=4, interval=0.001)
    assert destination.in_upkeep.wait(BOUND)  # the export thread is busy, holding its lock
    _spans(export, 8)  # two full batches: left for the thread, not waited for
    assert destination.batches == []
    destination.upkeep.set()
    export.shutdown()
    assert sum(destination.batches) == 8 and threading.get_ident() not in destination.senders


def test_a_destination_that_may_block_gets_every_batch_from_the_export_thread() -> None:
    destination = Destination(lambda records: True)
    export = BoundedExport(destination, max_queue=64, batch_size=4, interval=BOUND)
    _spans(export, 8)
    export.shutdown()
    assert sum(destination.batches) == 8 and threading.get_ident() not in destination.senders


def test_a_failing_exporter_counts_its_spans_as_dropped() -> None:
    def failing(records: list[Record]) -> bool:
        raise ConnectionError("collector unreachable")

    export = BoundedExport(Destination(failing), max_queue=8, batch_size=2, interval=BOUND)
    _spans(export, 2)
    export.shutdown()
    assert export.dropped == 2 and export.exported == 0


def test_a_refusing_exporter_is_logged_once_for_many_batches(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 47, item 8: a batch the destination refused was counted, never logged."""
    caplog.set_level(logging.WARNING, "ferry.tracing")
    export = BoundedExport(Destination(lambda records: False), 64, 2, BOUND)
    _spans(export, 10)
    export.shutdown()
    assert export.dropped == 10
    lines = [r.getMessage() for r in caplog.records if r.name == "ferry.tracing"]
    assert lines == [
        "trace export: 2 spans lost: the test's destination refused it "
        "(such losses are logged at most every 30 s)"
    ]


def test_shutdown_sends_every_queued_span_in_batches() -> None:
    destination = Destination(lambda spans: True)
    export = BoundedExport(destination, 2048, 512, BOUND)
    _spans(export, 1100)
    export.shutdown()
    assert sum(destination.batches) == 1100 and max(destination.batches) <= 512
    assert export.dropped == 0


@pytest.mark.parametrize(
    ("environment", "kind"),
    [
        ({}, "opentelemetry.exporter.otlp.proto.grpc"),
        (
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            "opentelemetry.exporter.otlp.proto.http",
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            },
            "opentelemetry.exporter.otlp.proto.http",
        ),
        ({"OTEL_TRACES_EXPORTER": "console"}, "opentelemetry.sdk.trace.export"),
    ],
)
def test_the_exporter_follows_opentelemetrys_variables(
    environment: dict[str, str], kind: str
) -> None:
    exporter = exporter_from_environment(environment)
    assert exporter is not None
    assert any(t.__module__.startswith(kind) for t in type(exporter).__mro__)
    if kind != "opentelemetry.sdk.trace.export":  # OTLP: sent as Ferry encoded it
        assert getattr(exporter, "encodes", False)
    if kind == "opentelemetry.exporter.otlp.proto.grpc":  # its bytes, not parsed back first
        assert getattr(exporter, "sends_bytes", False)
    exporter.shutdown()


def test_unknown_exporters_and_protocols_are_refused_naming_the_choices() -> None:
    assert exporter_from_environment({"OTEL_TRACES_EXPORTER": "none"}) is None
    with pytest.raises(ConfigError, match="otlp, console or none"):
        exporter_from_environment({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(ConfigError, match="grpc or http/protobuf"):
        exporter_from_environment({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


def test_tracing_is_off_unless_enabled_and_names_the_extra_when_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert tracing_for(False) is NO_TRACING
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"pip install 'ferry-serve\[otel\]'"):
        tracing_for(True)


def test_enable_tracing_is_a_setting_of_every_source() -> None:
    assert ServerSettings().enable_tracing is False
    assert load_settings({"enable_tracing": "true"}, {}, None).enable_tracing is True
    assert load_settings({}, {"FERRY_ENABLE_TRACING": "true"}, None).enable_tracing is True


class _NodeService:
    """What the workflow manager uses of the service: its tracing, and a predict that
    answers each node and keeps the headers it was sent."""

    def __init__(self, tracing: Recorder) -> None:
        self.tracing = tracing
        self.sent: dict[str, dict[str, str]] = {}

    def admit(self, model: str) -> str:
        return model  # the ticket, as predict gets it back

    async def predict(self, model: str, request: PredictionRequest) -> Prediction:
        self.sent[model] = request.headers
        return Prediction(b"{}", "application/json")


def test_a_workflows_nodes_are_requests_of_one_trace_under_the_workflows_span() -> None:
    tracing, exported = _otel()
    service = _NodeService(tracing)
    manager = WorkflowManager(service)  # type: ignore[arg-type]
    spec = parse_spec("dag:\n  pre: [en, fr]\n")
    workflow = RegisteredWorkflow("wf", "wf.war", None, spec, None)  # type: ignore[arg-type]
    manager._workflows["wf"] = workflow
    headers = {"traceparent": PARENT, "x-a": "1"}
    asyncio.run(manager.predict("wf", [InputPart("body", "text/plain", b"x")], headers))
    (span,) = _by_name(exported.get_finished_spans(), "workflow wf")
    assert span.context is not None and span.parent is not None
    assert (f"{span.context.trace_id:032x}", f"{span.parent.span_id:016x}") == (
        TRACE_ID,
        "b7ad6b7169203331",
    )
    own = f"00-{TRACE_ID}-{span.context.span_id:016x}"
    assert len(service.sent) == 3
    for sent in service.sent.values():  # every node's request: a child of the workflow's span
        assert sent["traceparent"].startswith(own) and sent["x-a"] == "1"


def test_a_failing_workflow_ends_its_span_with_the_error() -> None:
    tracing, exported = _otel()
    with pytest.raises(RuntimeError), tracing.span("workflow wf", {}):
        raise RuntimeError("a node failed")
    (span,) = exported.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    with NO_TRACING.span("workflow wf", {"x-a": "1"}) as untraced:
        assert untraced == {"x-a": "1"}


def test_an_unsampled_workflow_gives_its_nodes_its_trace_flagged_unsampled() -> None:
    tracing, exported = _otel(sampler="parentbased_always_off")
    with tracing.span("workflow wf", {"x-a": "1"}) as sent:
        flags = sent["traceparent"].split("-")[3]
        assert flags == "00" and sent["x-a"] == "1"
        # A node's request under it: parent-based, so not sampled either.
        assert tracing.request("m", "1", "r1", sent) is None
    assert exported.get_finished_spans() == ()
