"""Span records, the W3C trace context, the ``OTEL_TRACES_SAMPLER`` rules, and Ferry's own
OTLP encoding: parsed back with OpenTelemetry's generated message classes, every span
equals what OpenTelemetry's SDK encodes for the same span."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource

from ferry.errors import ConfigError
from ferry.tracing import records
from ferry.tracing.otel import otel_tracing, readable_span
from ferry.tracing.otlp_wire import RequestEncoder
from ferry.tracing.records import (
    BATCH,
    BATCH_LINK,
    KIND_INTERNAL,
    KIND_SERVER,
    REQUEST,
    BatchRecord,
    Parent,
    Record,
    RequestRecord,
    SpanRecord,
    parent_from_headers,
    sampler_from_environment,
    span_count,
    spans_of,
    traceparent,
)

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"


def test_a_request_record_is_its_span_and_its_queue_span() -> None:
    batches = ((7, 70), (7, 71))  # a retry: served by a second batch
    record: RequestRecord = (
        REQUEST,
        7,
        10,
        5,
        "predict m",
        100,
        130,
        200,
        (("ferry.model", "m"),),
        "r1",
        (("a", 1),),
        batches,
        "",
        "k=v",
        True,
    )
    queue, request = map(SpanRecord._make, spans_of([record]))
    assert request == SpanRecord(
        7,
        10,
        5,
        "predict m",
        KIND_SERVER,
        100,
        200,
        (("ferry.model", "m"), ("ferry.request_id", "r1"), ("a", 1)),
        ((7, 70, BATCH_LINK), (7, 71, BATCH_LINK)),
        "",
        "k=v",
        True,
    )
    assert (queue.trace_id, queue.parent_id, queue.name, queue.kind) == (
        7,
        10,
        "queue",
        KIND_INTERNAL,
    )
    assert (queue.start_ns, queue.end_ns, queue.trace_state) == (100, 130, "k=v")
    assert queue.span_id not in (0, 10) and not queue.remote_parent
    assert span_count(record) == 2


def test_a_request_answered_from_the_queue_waited_there_until_its_end() -> None:
    record: RequestRecord = (
        REQUEST,
        7,
        10,
        0,
        "predict m",
        100,
        0,
        250,
        (),
        "r",
        (),
        (),
        "Shed",
        "",
        False,
    )
    queue, request = map(SpanRecord._make, spans_of([record]))
    assert (queue.start_ns, queue.end_ns) == (100, 250) and request.error == "Shed"
    assert request.attributes == (("ferry.request_id", "r"), ("error.type", "Shed"))


def test_a_batch_record_is_its_stage_spans_and_its_span_linking_its_requests() -> None:
    stages = (("preprocess", 1, 2), ("inference", 2, 5), ("postprocess", 5, 6))
    record: BatchRecord = (
        BATCH,
        7,
        70,
        10,
        "batch m",
        0,
        9,
        (("n", 2),),
        ((7, 10), (8, 11)),
        "",
        "",
        stages,
    )
    *stage_spans, batch = map(SpanRecord._make, spans_of([record]))
    assert batch == SpanRecord(
        7, 70, 10, "batch m", KIND_INTERNAL, 0, 9, (("n", 2),), ((7, 10, ()), (8, 11, ())), "", ""
    )
    assert [(s.name, s.start_ns, s.end_ns, s.parent_id) for s in stage_spans] == [
        (name, start, end, 70) for name, start, end in stages
    ]
    assert span_count(record) == 4 and len({s.span_id for s in stage_spans}) == 3


RECORDS: list[Record] = [
    (
        REQUEST,
        7,
        10,
        0,
        "predict m",
        100,
        130,
        200,
        (("ferry.model", "m"), ("ferry.model_version", "1")),
        "r1",
        (("ferry.queue_ms", 1.5), ("ferry.batch.size", 2), ("ferry.status", 200)),
        ((7, 70),),
        "",
        "",
        False,
    ),
    (
        REQUEST,
        2**128 - 1,
        2**64 - 1,
        5,
        "predict é",
        0,
        0,
        2**64 - 1,
        (("ferry.model", "é"),),
        "r2 é",
        (("q", 0.5), ("n", -3), ("b", True)),
        ((1, 2), (3, 4)),
        "WorkerDied",
        "k=v,a=b",
        True,
    ),
    (REQUEST, 8, 11, 0, "predict m", 1, 2, 3, (), "", (), (), "", "", False),
    (
        BATCH,
        7,
        70,
        10,
        "batch m",
        120,
        190,
        (("ferry.batch.size", 2),),
        ((7, 10), (8, 11)),
        "",
        "",
        (("preprocess", 120, 130), ("inference", 130, 180), ("postprocess", 180, 190)),
    ),
    (BATCH, 9, 90, 12, "batch m", 1, 2, (), ((9, 12),), "HandlerFailed", "k=v", ()),
    (3, 4, 0, "workflow w", KIND_SERVER, 5, 6, (("a", "b"),), ((3, 9, ()),), "", "", False),
]


def test_records_encode_as_the_spans_they_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    def counting() -> Callable[[], int]:
        ids = itertools.count(0x1000)
        return lambda: next(ids)

    monkeypatch.setattr(records, "new_span_id", counting())
    spans = spans_of(RECORDS)
    monkeypatch.setattr(records, "new_span_id", counting())  # the same ids, in turn
    encoder = RequestEncoder({"service.name": "ferry"})
    assert encoder.encode_records(RECORDS) == encoder.encode(spans)
    parsed = ExportTraceServiceRequest.FromString(encoder.encode_records(RECORDS))
    assert len(parsed.resource_spans[0].scope_spans[0].spans) == sum(map(span_count, RECORDS))


def test_a_spans_fields_are_that_span() -> None:
    span = SpanRecord(1, 2, 0, "root", KIND_SERVER, 3, 4)
    assert spans_of([tuple(span)]) == [span]  # type: ignore[list-item]
    assert span_count(span) == 1


def test_a_valid_traceparent_is_the_parent_with_its_sampled_flag_and_tracestate() -> None:
    headers = {"traceparent": f"00-{TRACE}-{SPAN}-01", "tracestate": "congo=t61rcWkgMzE, ro=1"}
    assert parent_from_headers(headers) == Parent(
        int(TRACE, 16), int(SPAN, 16), True, "congo=t61rcWkgMzE,ro=1"
    )
    unsampled = parent_from_headers({"traceparent": f"00-{TRACE}-{SPAN}-00"})
    assert unsampled is not None and not unsampled.sampled
    # A later version may add fields after the flags; this one is read as version 00.
    assert parent_from_headers({"traceparent": f"01-{TRACE}-{SPAN}-01-extra"}) is not None


@pytest.mark.parametrize(
    "header",
    [
        f"ff-{TRACE}-{SPAN}-01",  # version ff is invalid
        f"00-{TRACE}-{SPAN}-01-extra",  # version 00 has exactly four fields
        f"00-{'0' * 32}-{SPAN}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero span id
        f"00-{TRACE.upper()}-{SPAN}-01",  # hex is lower case
        f"00-{TRACE[:-1]}-{SPAN}-01",
        "garbage",
        "",
    ],
)
def test_an_invalid_traceparent_starts_a_new_trace(header: str) -> None:
    assert parent_from_headers({"traceparent": header}) is None


def test_a_malformed_tracestate_is_dropped_and_the_traceparent_kept() -> None:
    parent = parent_from_headers({"traceparent": f"00-{TRACE}-{SPAN}-01", "tracestate": "a=b,=c"})
    assert parent is not None and parent.trace_state == ""
    many = ",".join(f"k{i}=v" for i in range(33))  # W3C: at most 32 members
    parent = parent_from_headers({"traceparent": f"00-{TRACE}-{SPAN}-01", "tracestate": many})
    assert parent is not None and parent.trace_state == ""


def test_traceparent_formats_ids_as_the_w3c_header() -> None:
    assert traceparent(int(TRACE, 16), int(SPAN, 16)) == f"00-{TRACE}-{SPAN}-01"


SAMPLED_PARENT = Parent(1, 1, True)
UNSAMPLED_PARENT = Parent(1, 1, False)
LOW = 2**64 // 10  # trace ids whose low 64 bits are a tenth of the range
HIGH = 2**64 - 1


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        # no parent with a low and a high trace id; a sampled parent with a high one; an
        # unsampled parent with a low one
        ({}, (True, True, True, False)),
        ({"OTEL_TRACES_SAMPLER": "always_on"}, (True, True, True, True)),
        ({"OTEL_TRACES_SAMPLER": "always_off"}, (False, False, False, False)),
        ({"OTEL_TRACES_SAMPLER": "parentbased_always_off"}, (False, False, True, False)),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"},
            (True, False, False, True),  # the parent does not count
        ),
        (
            {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"},
            (True, False, True, False),
        ),
    ],
)
def test_samplers_follow_opentelemetrys_rules(
    environment: dict[str, str], expected: tuple[bool, ...]
) -> None:
    sample = sampler_from_environment(environment)
    low, high = (1 << 100) + LOW, (1 << 100) + HIGH  # only the low 64 bits count
    assert (
        sample(None, low),
        sample(None, high),
        sample(SAMPLED_PARENT, high),
        sample(UNSAMPLED_PARENT, low),
    ) == expected


def test_a_ratio_samples_its_share_of_trace_ids() -> None:
    sample = sampler_from_environment(
        {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"}
    )
    ids = [i * (2**64 // 1000) + 2**64 // 2000 for i in range(1000)]  # evenly spread
    assert sum(sample(None, trace_id) for trace_id in ids) == 100


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        ({"OTEL_TRACES_SAMPLER": "jaeger_remote"}, "one of always_on"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, "0 to 1"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "x"}, "0 to 1"),
    ],
)
def test_an_unknown_sampler_or_bad_ratio_is_a_config_error(
    environment: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        otel_tracing(None, environ=environment)


RESOURCE = Resource.create({"service.name": "ferry-test", "deployment": "ci"})

SPANS = [
    SpanRecord(  # a request's span: a remote parent, a tracestate, a link back, attributes
        int(TRACE, 16),
        0x1111,
        int(SPAN, 16),
        "predict resnet",
        KIND_SERVER,
        1_700_000_000_000_000_000,
        1_700_000_000_004_000_000,
        (("ferry.model", "resnet"), ("ferry.batch.size", 8), ("http.ok", True)),
        ((int(TRACE, 16), 0x2222, (("ferry.link", "batch"),)),),
        "",
        "congo=t61rcWkgMzE",
        True,
    ),
    SpanRecord(  # a batch's span: many links, a failure, negative and float attributes
        int(TRACE, 16),
        0x2222,
        0x1111,
        "batch resnet",
        KIND_INTERNAL,
        1_700_000_000_001_000_000,
        1_700_000_000_003_000_000,
        (("ferry.worker.pid", 4242), ("offset", -5), ("ratio", 0.25), ("error.type", "Boom")),
        tuple((0xABC + i, 0x100 + i, ()) for i in range(8)),
        "Boom",
    ),
    SpanRecord(2**128 - 1, 2**64 - 1, 0, "root é", KIND_INTERNAL, 0, 2**64 - 1),  # edges
]


def _normalised(request: ExportTraceServiceRequest) -> list[dict[str, Any]]:
    """The spans, in a form where an absent and an empty status are the same, and the
    flags' trace-flag byte (which Ferry sets, as OTLP says, and the SDK leaves 0) is not
    compared."""
    spans = []
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                fields = MessageToDict(span)
                if fields.get("status") == {}:
                    del fields["status"]
                fields["flags"] = span.flags & ~0xFF
                for link in fields.get("links", []):
                    link["flags"] = link.get("flags", 0) & ~0xFF
                spans.append(fields)
    return spans


def test_ferrys_encoding_equals_the_sdks_for_the_same_spans() -> None:
    ours = ExportTraceServiceRequest.FromString(
        RequestEncoder(dict(RESOURCE.attributes)).encode(SPANS)  # type: ignore[arg-type]
    )
    theirs = encode_spans([readable_span(span, RESOURCE) for span in SPANS])
    assert _normalised(ours) == _normalised(theirs)
    (resource_spans,) = ours.resource_spans
    assert MessageToDict(resource_spans.resource) == MessageToDict(
        theirs.resource_spans[0].resource
    )
    assert resource_spans.scope_spans[0].scope.name == "ferry"
    assert [span.flags & 0xFF for span in resource_spans.scope_spans[0].spans] == [1, 1, 1]
    assert resource_spans.scope_spans[0].spans[0].flags == 0x301  # sampled, remote parent


def test_an_empty_batch_encodes_to_a_request_without_spans() -> None:
    request = ExportTraceServiceRequest.FromString(RequestEncoder({}).encode([]))
    assert [len(s.spans) for r in request.resource_spans for s in r.scope_spans] == [0]
