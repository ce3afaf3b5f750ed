"""``Tracing`` with OpenTelemetry's SDK (the ``otel`` extra).

The tracer provider follows OpenTelemetry's environment variables, as any of its SDKs
does: ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` (the service is ``ferry``
unless named), ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` (default: parent-based,
always on), ``OTEL_TRACES_EXPORTER`` (``otlp``, the default, ``console`` or ``none``),
``OTEL_EXPORTER_OTLP_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` (``grpc``, the
default, or ``http/protobuf``) and the OTLP exporter's own ``OTEL_EXPORTER_OTLP_*``
(endpoint, headers, timeout).

Spans go to the exporter through ``BoundedExport``: a queue of ``max_queue`` spans that a
background thread exports in batches. When the exporter is slow or unreachable the queue
fills and later spans are dropped and counted (``ferry_trace_spans_dropped_total``), so
serving never waits on it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ferry.errors import ConfigError
from ferry.tracing import INSTALL_HINT, BatchTrace, RequestTrace, Tracing
from ferry.wire.messages import StageWindow

log = logging.getLogger("ferry.tracing")

PROPAGATOR = TraceContextTextMapPropagator()


class OtelTracing(Tracing):
    enabled = True

    def __init__(self, provider: TracerProvider, export: BoundedExport | None = None) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("ferry")
        self._export = export

    def request(
        self, model: str, version: str, request_id: str, headers: dict[str, str]
    ) -> RequestTrace | None:
        parent = PROPAGATOR.extract(headers)  # traceparent / tracestate, lower-cased keys
        attributes = {"ferry.model": model, "ferry.model_version": version}
        attributes["ferry.request_id"] = request_id
        span = self._tracer.start_span(
            f"predict {model}", context=parent, kind=SpanKind.SERVER, attributes=attributes
        )
        if not span.is_recording():  # not sampled: nothing to record or link
            return None
        return _Request(self, self._tracer, span)

    def batch(
        self,
        model: str,
        batch_id: int,
        requests: Sequence[RequestTrace],
        worker: dict[str, str | int],
    ) -> BatchTrace | None:
        spans = [r.span for r in requests if isinstance(r, _Request)]
        if not spans:
            return None
        attributes: dict[str, str | int] = {"ferry.model": model, "ferry.batch.id": batch_id}
        attributes["ferry.batch.size"] = len(requests)
        attributes.update({f"ferry.worker.{key}": value for key, value in worker.items()})
        span = self._tracer.start_span(
            f"batch {model}",
            context=trace.set_span_in_context(spans[0]),
            links=[Link(s.get_span_context()) for s in spans],
            attributes=attributes,
        )
        for request in spans:
            request.add_link(span.get_span_context(), {"ferry.link": "batch"})
        return _Batch(self._tracer, span)

    @contextlib.contextmanager
    def span(self, name: str, headers: dict[str, str]) -> Iterator[dict[str, str]]:
        parent = PROPAGATOR.extract(headers)
        span = self._tracer.start_span(name, context=parent, kind=SpanKind.SERVER)
        carrier = {k: v for k, v in headers.items() if k not in ("traceparent", "tracestate")}
        PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
        try:
            yield carrier
        except BaseException as error:
            _failed(span, error)
            raise
        finally:
            span.end()

    def shutdown(self) -> None:
        self._provider.shutdown()

    @property
    def dropped_spans(self) -> int:
        return self._export.dropped if self._export is not None else 0


class _Request:
    def __init__(self, tracing: OtelTracing, tracer: trace.Tracer, span: trace.Span) -> None:
        self.tracing = tracing
        self.span = span
        self._queue: trace.Span | None = tracer.start_span(
            "queue", context=trace.set_span_in_context(span)
        )

    @property
    def ids(self) -> tuple[str, str]:
        context = self.span.get_span_context()
        return trace.format_trace_id(context.trace_id), trace.format_span_id(context.span_id)

    def dispatched(self) -> None:
        if self._queue is not None:
            self._queue.end()
            self._queue = None

    def end(self, error: BaseException | None, attributes: dict[str, str | int | float]) -> None:
        self.dispatched()  # a request answered from the queue (shed, hung up) ends it too
        self.span.set_attributes(attributes)
        if error is not None:
            _failed(self.span, error)
        self.span.end()


class _Batch:
    def __init__(self, tracer: trace.Tracer, span: trace.Span) -> None:
        self._tracer = tracer
        self.span = span

    @property
    def traceparent(self) -> str:
        carrier: dict[str, str] = {}
        PROPAGATOR.inject(carrier, trace.set_span_in_context(self.span))
        return carrier.get("traceparent", "")

    def finish(self, windows: Sequence[StageWindow], error: BaseException | None = None) -> None:
        parent = trace.set_span_in_context(self.span)
        for window in windows:
            start = window.start_ns
            stage = self._tracer.start_span(window.stage, context=parent, start_time=start)
            stage.end(end_time=window.end_ns)
        if error is not None:
            _failed(self.span, error)
        self.span.end()


def _failed(span: trace.Span, error: BaseException) -> None:
    """An error status naming ``error``'s type, and OpenTelemetry's ``error.type``."""
    span.set_status(Status(StatusCode.ERROR, type(error).__name__))
    span.set_attribute("error.type", type(error).__name__)


class BoundedExport(SpanProcessor):
    """Ended spans queued (at most ``max_queue``; beyond, dropped and counted) and
    exported in batches of up to ``batch_size`` by one thread, every ``interval`` seconds
    or as soon as a batch is full."""

    def __init__(
        self,
        exporter: SpanExporter,
        max_queue: int = 2048,
        batch_size: int = 512,
        interval: float = 1.0,
    ) -> None:
        self._exporter = exporter
        self._max_queue, self._batch_size, self._interval = max_queue, batch_size, interval
        self._queue: deque[ReadableSpan] = deque()
        self._wake = threading.Condition()
        self._stopping = False
        self.dropped = 0
        self.exported = 0
        self._thread = threading.Thread(target=self._run, name="ferry-span-export", daemon=True)
        self._thread.start()

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled:
            return
        with self._wake:
            if len(self._queue) >= self._max_queue:
                self.dropped += 1
                return
            self._queue.append(span)
            if len(self._queue) >= self._batch_size:
                self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                if not self._queue and not self._stopping:
                    self._wake.wait(self._interval)
                taken = min(len(self._queue), self._batch_size)
                batch = [self._queue.popleft() for _ in range(taken)]
                stopping = self._stopping and not self._queue
            if batch:
                self._send(batch)
            if stopping:
                return

    def _send(self, batch: list[ReadableSpan]) -> None:
        try:
            result = self._exporter.export(batch)
        except Exception as error:  # an exporter's own failure must not end the thread
            log.warning("exporting %d spans failed: %s", len(batch), error)
            result = None
        if result is not None and result.name == "SUCCESS":
            self.exported += len(batch)
        else:
            self.dropped += len(batch)

    def shutdown(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=30)
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        while time.monotonic() < deadline:
            with self._wake:
                if not self._queue:
                    return True
                self._wake.notify()
            time.sleep(0.01)  # waiting for the export thread to drain the queue
        return False


def exporter_from_environment(environ: dict[str, str] | None = None) -> SpanExporter | None:
    """The exporter ``OTEL_TRACES_EXPORTER`` names (``otlp`` by default; None for
    ``none``); OTLP over the protocol its variables name."""
    env = os.environ if environ is None else environ
    name = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if name == "none":
        return None
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


def _grpc_exporter() -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    exporter: SpanExporter = OTLPSpanExporter()
    return exporter


def _http_exporter() -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    exporter: SpanExporter = OTLPSpanExporter()
    return exporter


def otel_tracing(exporter: SpanExporter | None, max_queue: int = 2048) -> OtelTracing:
    """Ferry's tracer: the SDK's sampler and resource from the environment, spans to
    ``exporter`` through a bounded queue (none recorded without an exporter)."""
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "ferry")})
    provider = TracerProvider(resource=resource)
    export = BoundedExport(exporter, max_queue=max_queue) if exporter is not None else None
    if export is not None:
        provider.add_span_processor(export)
    return OtelTracing(provider, export)
