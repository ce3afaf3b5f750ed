"""Where Ferry's spans go: OpenTelemetry's SDK exporters and resource (the ``otel`` extra).

The exporter follows OpenTelemetry's environment variables, as any of its SDKs does:
``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` (the service is ``ferry`` unless
named), ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` (default: parent-based,
always on), ``OTEL_TRACES_EXPORTER`` (``otlp``, the default, ``console`` or ``none``),
``OTEL_EXPORTER_OTLP_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` (``grpc``, the
default, or ``http/protobuf``) and the OTLP exporter's own ``OTEL_EXPORTER_OTLP_*``
(endpoint, headers, timeout, compression, certificates).

Spans reach an OTLP exporter already encoded (``ferry.tracing.otlp_wire``): the SDK's
exporter only sends them, with its retries and settings. Any other exporter (the
console's, a test's in-memory one) gets the SDK's ``ReadableSpan`` objects.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from ferry.errors import ConfigError
from ferry.tracing import INSTALL_HINT
from ferry.tracing.otlp_wire import RequestEncoder
from ferry.tracing.recorder import BoundedExport, Recorder
from ferry.tracing.records import (
    Record,
    Sampler,
    SpanRecord,
    sampler_from_environment,
    span_count,
    spans_of,
)

log = logging.getLogger("ferry.tracing")

SCOPE = InstrumentationScope("ferry")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def otel_tracing(
    exporter: SpanExporter | None,
    max_queue: int = 2048,
    environ: Mapping[str, str] | None = None,
) -> Recorder:
    """Ferry's tracing: the sampler and resource from the environment, spans to
    ``exporter`` through a bounded queue (none recorded without an exporter)."""
    env = os.environ if environ is None else environ
    sampler = configured_sampler(env)
    if exporter is None:
        return Recorder(sampler, None)
    export = BoundedExport(InProcessExport(exporter, resource_from(env)), max_queue)
    return Recorder(sampler, export)


def configured_sampler(environ: Mapping[str, str]) -> Sampler:
    """The sampler ``OTEL_TRACES_SAMPLER`` names; a ``ConfigError`` naming the variable."""
    try:
        return sampler_from_environment(environ)
    except ValueError as error:
        raise ConfigError(str(error)) from error


def exports(environ: Mapping[str, str]) -> bool:
    """Whether ``OTEL_TRACES_EXPORTER`` asks for an exporter at all (not ``none``)."""
    return environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() != "none"


def resource_from(environ: Mapping[str, str]) -> Resource:
    """The SDK's resource (``OTEL_RESOURCE_ATTRIBUTES``, the SDK's own attributes), the
    service ``OTEL_SERVICE_NAME`` or ``ferry``."""
    return Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME", "ferry")})


class InProcessExport:
    """Batches of records' spans through ``exporter``: encoded by Ferry for OTLP, as the
    SDK's spans for any other."""

    lost = 0  # the exporter answers each batch at once
    never_blocks = False  # it waits for the collector: the export thread sends
    loss_reason = "the exporter failed to send it (the collector refused it or is unreachable)"

    def send_pending(self) -> None:
        """Nothing kept: each batch is sent whole."""

    def __init__(self, exporter: SpanExporter, resource: Resource) -> None:
        self._exporter, self._resource = exporter, resource
        self._encoder: RequestEncoder | None = None
        if isinstance(exporter, _EncodedOtlp) and exporter.encodes:
            scalars = (str, bool, int, float)
            attributes = {k: v for k, v in resource.attributes.items() if isinstance(v, scalars)}
            self._encoder = RequestEncoder(attributes, SCOPE.name)

    def send(self, records: list[Record]) -> bool:
        exporter = self._exporter
        if self._encoder is not None and isinstance(exporter, _EncodedOtlp):
            payload = self._encoder.encode_records(records)
            return exporter.send_encoded(payload, sum(map(span_count, records)))
        spans = spans_of(records)
        readable = [readable_span(SpanRecord._make(span), self._resource) for span in spans]
        return exporter.export(readable) == SpanExportResult.SUCCESS

    def close(self) -> None:
        self._exporter.shutdown()


def readable_span(span: SpanRecord, resource: Resource) -> ReadableSpan:
    """``span`` as OpenTelemetry's SDK would have recorded it."""
    state = TraceState.from_header([span.trace_state]) if span.trace_state else None
    context = SpanContext(span.trace_id, span.span_id, False, _SAMPLED, state)
    parent = None
    if span.parent_id:
        parent = SpanContext(span.trace_id, span.parent_id, span.remote_parent, _SAMPLED, state)
    links = [
        Link(SpanContext(trace_id, span_id, False, _SAMPLED), dict(attributes))
        for trace_id, span_id, attributes in span.links
    ]
    status = Status(StatusCode.ERROR, span.error) if span.error else Status(StatusCode.UNSET)
    return ReadableSpan(
        name=span.name,
        context=context,
        parent=parent,
        resource=resource,
        attributes=dict(span.attributes),
        links=links,
        kind=SpanKind(span.kind - 1),  # the SDK counts kinds from INTERNAL = 0, OTLP from 1
        status=status,
        start_time=span.start_ns,
        end_time=span.end_ns,
        instrumentation_scope=SCOPE,
    )


def exporter_from_environment(environ: Mapping[str, str] | None = None) -> SpanExporter | None:
    """The exporter ``OTEL_TRACES_EXPORTER`` names (``otlp`` by default; None for
    ``none``); OTLP over the protocol its variables name."""
    env = os.environ if environ is None else environ
    if not exports(env):
        return None
    name = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if name == "console":
        return ConsoleSpanExporter()
    if name != "otlp":
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER={name!r}: Ferry exports traces with otlp, console or none"
        )
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"
    )
    return _otlp_exporter(protocol.strip().lower())


def _otlp_exporter(protocol: str) -> SpanExporter:
    builders: dict[str, tuple[str, Callable[[], SpanExporter]]] = {
        "grpc": ("opentelemetry-exporter-otlp-proto-grpc", _grpc_exporter),
        "http/protobuf": ("opentelemetry-exporter-otlp-proto-http", _http_exporter),
    }
    if protocol not in builders:
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: Ferry exports OTLP over grpc or "
            "http/protobuf"
        )
    package, build = builders[protocol]
    try:
        return build()
    except ImportError as error:
        raise ConfigError(
            f"tracing over OTLP/{protocol} needs {package}, which is not installed: "
            f"{INSTALL_HINT} ({error})"
        ) from error


class _EncodedOtlp(SpanExporter):
    """An OTLP exporter that also sends requests Ferry encoded (when ``encodes``: the
    SDK's private hook it relies on was found)."""

    encodes = True

    def send_encoded(self, payload: bytes, count: int) -> bool:
        raise NotImplementedError


def _grpc_exporter() -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    class GrpcExporter(OTLPSpanExporter, _EncodedOtlp):
        """The SDK's gRPC exporter is generic in what it translates into its request
        (``_translate_data``, ``_count_data``): an encoded request is sent with the
        exporter's channel, settings and retries. Its stub takes the request's bytes as
        they are (``_initialize_channel_and_stub``, which the exporter calls again to
        reconnect); without that hook, they are parsed back into the SDK's message."""

        sends_bytes = False

        def send_encoded(self, payload: bytes, count: int) -> bool:
            return self._export(_Encoded(payload, count)) == SpanExportResult.SUCCESS  # type: ignore[arg-type]

        def _initialize_channel_and_stub(self) -> None:
            super()._initialize_channel_and_stub()  # type: ignore[no-untyped-call]
            self._client = _BytesStub(self._channel)  # type: ignore[assignment]
            self.sends_bytes = True

        def _translate_data(self, data: Any) -> ExportTraceServiceRequest | bytes:  # type: ignore[override]
            if isinstance(data, _Encoded):
                if self.sends_bytes:
                    return data.payload
                return ExportTraceServiceRequest.FromString(data.payload)
            return super()._translate_data(data)

        def _count_data(self, data: Any) -> int:
            return data.count if isinstance(data, _Encoded) else len(data)

    exporter = GrpcExporter()
    exporter.encodes = hasattr(OTLPSpanExporter, "_translate_data")
    return exporter


class _BytesStub:
    """OTLP's trace service stub whose ``Export`` takes a request's bytes (Ferry's
    encoding, sent as they are) or the SDK's message."""

    def __init__(self, channel: Any) -> None:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        service = trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"]
        self.Export = channel.unary_unary(
            f"/{service.full_name}/Export",
            request_serializer=_request_bytes,
            response_deserializer=trace_service_pb2.ExportTraceServiceResponse.FromString,
        )


def _request_bytes(request: Any) -> bytes:
    return request if isinstance(request, bytes) else bytes(request.SerializeToString())


def _http_exporter() -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    class HttpExporter(OTLPSpanExporter, _EncodedOtlp):
        """The SDK's HTTP exporter sends its serialized request through its client
        (``_client.export``, with the exporter's endpoint, headers, compression and
        timeout): an encoded request goes the same way."""

        def send_encoded(self, payload: bytes, count: int) -> bool:
            if self._shutdown:
                return False
            return bool(self._client.export(payload).success)

    exporter = HttpExporter()
    exporter.encodes = callable(getattr(getattr(exporter, "_client", None), "export", None))
    return exporter


class _Encoded:
    """An encoded ``ExportTraceServiceRequest`` and how many spans it holds."""

    def __init__(self, payload: bytes, count: int) -> None:
        self.payload, self.count = payload, count
