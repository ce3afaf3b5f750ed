"""``Tracing`` on: spans recorded as tuples on the serving path, exported by a thread.

``Recorder`` follows OpenTelemetry's conventions (W3C trace context in, the ``OTEL_*``
sampler, OTLP span kinds, statuses and links) without its SDK on the serving path: a
request's two spans cost a few microseconds instead of 35. ``BoundedExport`` queues the
ended spans (at most ``max_queue``; beyond, dropped and counted) and a background thread
hands them in batches to a destination: OpenTelemetry's exporters in an exporter process
of their own (``ferry.tracing.export_process``), or in this one. Serving never waits on
the exporter.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from ferry.tracing import BatchTrace, RequestTrace, Tracing
from ferry.tracing.records import (
    KIND_INTERNAL,
    KIND_SERVER,
    Attributes,
    AttributeValue,
    Parent,
    Sampler,
    SpanLink,
    SpanRecord,
    new_span_id,
    new_trace_id,
    parent_from_headers,
    traceparent,
)
from ferry.wire.messages import StageWindow

log = logging.getLogger("ferry.tracing")


class SpanDestination(Protocol):
    """Where batches of ended spans go: an exporter in this process, or the exporter
    process (``ferry.tracing.export_process``)."""

    def send(self, spans: list[SpanRecord]) -> bool:
        """Take a batch; False (or an exception) when it was lost."""
        ...

    @property
    def lost(self) -> int:
        """Spans it took and lost later (an exporter process that failed to export)."""
        ...

    def close(self) -> None:
        """Send what it holds and stop."""
        ...


_BATCH_LINK: tuple[tuple[str, AttributeValue], ...] = (("ferry.link", "batch"),)


class BoundedExport:
    """Ended spans queued (at most ``max_queue``; beyond, dropped and counted) and sent to
    ``destination`` in batches of up to ``batch_size`` by one thread, every ``interval``
    seconds or as soon as a batch is full. Spans are added from one thread (the server's
    event loop)."""

    def __init__(
        self,
        destination: SpanDestination,
        max_queue: int = 2048,
        batch_size: int = 512,
        interval: float = 1.0,
    ) -> None:
        self._destination = destination
        self._max_queue, self._batch_size, self._interval = max_queue, batch_size, interval
        self._queue: deque[SpanRecord] = deque()
        self._full = threading.Event()
        self._stopping = False
        # Two counters, each written by one thread: no lock on the serving path.
        self._dropped_full = 0
        self._dropped_failed = 0
        self.exported = 0
        self._thread = threading.Thread(target=self._run, name="ferry-span-export", daemon=True)
        self._thread.start()

    def add(self, span: SpanRecord) -> None:
        queued = len(self._queue)
        if queued >= self._max_queue:
            self._dropped_full += 1
            return
        self._queue.append(span)
        if queued + 1 == self._batch_size:
            self._full.set()

    @property
    def dropped(self) -> int:
        return self._dropped_full + self._dropped_failed + self._destination.lost

    def _run(self) -> None:
        while True:
            if len(self._queue) < self._batch_size and not self._stopping:
                self._full.wait(self._interval)
            self._full.clear()
            stopping = self._stopping
            while self._queue:
                taken = min(len(self._queue), self._batch_size)
                self._send_batch([self._queue.popleft() for _ in range(taken)])
                if not stopping and len(self._queue) < self._batch_size:
                    break
            if stopping and not self._queue:
                return

    def _send_batch(self, batch: list[SpanRecord]) -> None:
        try:
            sent = self._destination.send(batch)
        except Exception as error:  # an exporter's own failure must not end the thread
            log.warning("exporting %d spans failed: %s", len(batch), error)
            sent = False
        if sent:
            self.exported += len(batch)
        else:
            self._dropped_failed += len(batch)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until the queue is empty (True) or ``timeout`` passes (False)."""
        deadline = time.monotonic() + timeout
        while self._queue and time.monotonic() < deadline:
            self._full.set()
            time.sleep(0.01)  # polling the export thread's progress; only tests and exit
        return not self._queue

    def shutdown(self) -> None:
        """Send what is queued, then stop the thread and the destination."""
        self._stopping = True
        self._full.set()
        self._thread.join(timeout=30)
        self._destination.close()


class Recorder(Tracing):
    enabled = True

    def __init__(self, sampler: Sampler, export: BoundedExport | None) -> None:
        self._sampler = sampler
        self._export = export
        self._add: Callable[[SpanRecord], None] = export.add if export else lambda span: None
        self._models: dict[tuple[str, str], tuple[str, Attributes]] = {}

    def request(
        self, model: str, version: str, request_id: str, headers: dict[str, str]
    ) -> RequestTrace | None:
        parent = parent_from_headers(headers)
        trace_id = parent.trace_id if parent is not None else new_trace_id()
        if not self._sampler(parent, trace_id):
            return None
        named = self._models.get((model, version))
        if named is None:  # one name and attribute tuple per model: the encoder caches them
            of_model: Attributes = (("ferry.model", model), ("ferry.model_version", version))
            named = self._models[model, version] = (f"predict {model}", of_model)
        name, of_model = named
        attributes = (*of_model, ("ferry.request_id", request_id))
        return _Request(self, name, trace_id, parent, attributes, self._add)

    def batch(
        self,
        model: str,
        batch_id: int,
        requests: Sequence[RequestTrace],
        worker: dict[str, str | int],
    ) -> BatchTrace | None:
        traced = [r for r in requests if isinstance(r, _Request)]
        if not traced:
            return None
        first = traced[0]
        attributes: list[tuple[str, AttributeValue]] = [
            ("ferry.model", model),
            ("ferry.batch.id", batch_id),
            ("ferry.batch.size", len(requests)),
        ]
        attributes.extend((f"ferry.worker.{key}", value) for key, value in worker.items())
        links: tuple[SpanLink, ...] = tuple((r.trace_id, r.span_id, ()) for r in traced)
        batch = _Batch(f"batch {model}", first, tuple(attributes), links, self._add)
        back: tuple[SpanLink, ...] = ((batch.trace_id, batch.span_id, _BATCH_LINK),)
        for request in traced:
            request.links += back
        return batch

    @contextlib.contextmanager
    def span(self, name: str, headers: dict[str, str]) -> Iterator[dict[str, str]]:
        parent = parent_from_headers(headers)
        trace_id = parent.trace_id if parent is not None else new_trace_id()
        sampled = self._sampler(parent, trace_id)
        span_id, start = new_span_id(), time.time_ns()
        carrier = {k: v for k, v in headers.items() if k not in ("traceparent", "tracestate")}
        # Not sampled, its parts still get its trace, flagged unsampled: each decides as
        # its parent did, rather than sampling again as a trace of its own.
        carrier["traceparent"] = traceparent(trace_id, span_id, sampled)
        state = parent.trace_state if parent is not None else ""
        if state:
            carrier["tracestate"] = state
        if not sampled:
            yield carrier
            return
        error: BaseException | None = None
        try:
            yield carrier
        except BaseException as failure:
            error = failure
            raise
        finally:
            parent_id = parent.span_id if parent is not None else 0
            message, attributes = _failure(error)
            end = time.time_ns()
            remote = parent is not None
            self._add(
                SpanRecord(
                    trace_id,
                    span_id,
                    parent_id,
                    name,
                    KIND_SERVER,
                    start,
                    end,
                    attributes,
                    (),
                    message,
                    state,
                    remote,
                )
            )

    def shutdown(self) -> None:
        if self._export is not None:
            self._export.shutdown()

    @property
    def dropped_spans(self) -> int:
        return self._export.dropped if self._export is not None else 0


def _failure(error: BaseException | None) -> tuple[str, Attributes]:
    """A failed span's status message and ``error.type`` attribute: the error's type."""
    if error is None:
        return "", ()
    name = type(error).__name__
    return name, (("error.type", name),)


class _Request:
    """A request's span and its queue span, recorded when each ends."""

    __slots__ = (
        "_add",
        "_queued_ns",
        "attributes",
        "links",
        "name",
        "parent_id",
        "remote_parent",
        "span_id",
        "start_ns",
        "trace_id",
        "trace_state",
        "tracing",
    )

    def __init__(
        self,
        tracing: Recorder,
        name: str,
        trace_id: int,
        parent: Parent | None,
        attributes: tuple[tuple[str, AttributeValue], ...],
        add: Callable[[SpanRecord], None],
    ) -> None:
        self.tracing, self.name = tracing, name
        self.trace_id, self.span_id = trace_id, new_span_id()
        self.parent_id = parent.span_id if parent is not None else 0
        self.trace_state = parent.trace_state if parent is not None else ""
        self.remote_parent = parent is not None
        self.attributes = attributes
        self.links: tuple[SpanLink, ...] = ()
        self.start_ns = self._queued_ns = time.time_ns()
        self._add = add

    @property
    def ids(self) -> tuple[str, str]:
        return f"{self.trace_id:032x}", f"{self.span_id:016x}"

    def dispatched(self) -> None:
        if self._queued_ns:
            queue = SpanRecord(
                self.trace_id,
                new_span_id(),
                self.span_id,
                "queue",
                KIND_INTERNAL,
                self._queued_ns,
                time.time_ns(),
                trace_state=self.trace_state,
            )
            self._add(queue)
            self._queued_ns = 0

    def end(self, error: BaseException | None, attributes: dict[str, str | int | float]) -> None:
        self.dispatched()  # a request answered from the queue (shed, hung up) ends it too
        message, failed = _failure(error)
        record = SpanRecord(
            self.trace_id,
            self.span_id,
            self.parent_id,
            self.name,
            KIND_SERVER,
            self.start_ns,
            time.time_ns(),
            self.attributes + tuple(attributes.items()) + failed,
            self.links,
            message,
            self.trace_state,
            self.remote_parent,
        )
        self._add(record)


class _Batch:
    """A batch's span (the child of its first traced request's) and its stage spans."""

    def __init__(
        self,
        name: str,
        parent: _Request,
        attributes: tuple[tuple[str, AttributeValue], ...],
        links: tuple[SpanLink, ...],
        add: Callable[[SpanRecord], None],
    ) -> None:
        self.name, self.attributes, self.links, self.add = name, attributes, links, add
        self.trace_id, self.span_id, self.parent_id = parent.trace_id, new_span_id(), parent.span_id
        self.trace_state = parent.trace_state
        self.start_ns = time.time_ns()

    @property
    def traceparent(self) -> str:
        return traceparent(self.trace_id, self.span_id)

    def finish(self, windows: Sequence[StageWindow], error: BaseException | None = None) -> None:
        for window in windows:
            stage = SpanRecord(
                self.trace_id,
                new_span_id(),
                self.span_id,
                window.stage,
                KIND_INTERNAL,
                window.start_ns,
                window.end_ns,
                trace_state=self.trace_state,
            )
            self.add(stage)
        message, failed = _failure(error)
        record = SpanRecord(
            self.trace_id,
            self.span_id,
            self.parent_id,
            self.name,
            KIND_INTERNAL,
            self.start_ns,
            time.time_ns(),
            self.attributes + failed,
            self.links,
            message,
            self.trace_state,
        )
        self.add(record)
