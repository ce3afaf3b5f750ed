"""``Tracing`` on: spans recorded as tuples on the serving path, exported by a thread.

``Recorder`` follows OpenTelemetry's conventions (W3C trace context in, the ``OTEL_*``
sampler, OTLP span kinds, statuses and links) without its SDK on the serving path: a
request's two spans cost a few microseconds instead of 35. It records one plain tuple per
request and one per batch (``ferry.tracing.records.Record``); their spans are made where
they are exported. ``BoundedExport`` queues the records (at most ``max_queue``; beyond,
dropped and their spans counted) and a background thread hands them in batches to a
destination: OpenTelemetry's exporters in an exporter process of their own
(``ferry.tracing.export_process``), or in this one. Serving never waits on the exporter.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol

from ferry.scheduling.jobs import Prediction, RequestWatch
from ferry.scheduling.observers import BatchWatch
from ferry.tracing import Tracing
from ferry.tracing.losses import LossLog
from ferry.tracing.records import (
    BATCH,
    KIND_SERVER,
    REQUEST,
    Attributes,
    AttributeValue,
    Parent,
    Record,
    Sampler,
    error_attributes,
    new_span_id,
    new_trace_id,
    parent_from_headers,
    span_count,
    traceparent,
)
from ferry.wire.messages import StageWindow

log = logging.getLogger("ferry.tracing")


class SpanDestination(Protocol):
    """Where batches of records go: an exporter in this process, or the exporter process
    (``ferry.tracing.export_process``)."""

    def send(self, records: list[Record]) -> bool:
        """Take a batch; False (or an exception) when it was lost."""
        ...

    @property
    def loss_reason(self) -> str:
        """Why a batch ``send`` answered False for was lost, in the log's words."""
        ...

    @property
    def never_blocks(self) -> bool:
        """Whether ``send`` returns at once whatever happens downstream (it keeps what it
        could not pass on yet for ``send_pending``): then the serving thread sends full
        batches itself."""
        ...

    def send_pending(self) -> None:
        """From the export thread, every interval: pass on what earlier sends kept, and do
        what may take time (start a new exporter in place of one that ended)."""
        ...

    @property
    def lost(self) -> int:
        """Spans it took and lost later (an exporter process that failed to export)."""
        ...

    def close(self) -> None:
        """Send what it holds and stop."""
        ...


QUEUE_FULL = "the export queue was full (the exporter is behind)"


class BoundedExport:
    """Records queued (at most ``max_queue``; beyond, dropped and their spans counted) and
    sent to ``destination`` in batches of up to ``batch_size``: by one thread every
    ``interval`` seconds, and as soon as a batch is full. Lost spans are also logged, at a
    bounded rate (``losses``, ``ferry.tracing.losses``). Records are added from one
    thread (the server's event loop), which sends a full batch itself when the destination
    never blocks: handing it to the export thread instead made the event loop wait for
    the GIL's hand-back behind the other processes on a busy machine (the no-op traced
    at 0.86x of untraced against 0.88x inline, 8 rounds of new servers, ahead in 7)."""

    def __init__(
        self,
        destination: SpanDestination,
        max_queue: int = 2048,
        batch_size: int = 512,
        interval: float = 1.0,
        losses: LossLog | None = None,
    ) -> None:
        self._destination = destination
        self._losses = losses or LossLog(log)
        self._max_queue, self._batch_size, self._interval = max_queue, batch_size, interval
        self._queue: deque[Record] = deque()
        self._inline = destination.never_blocks
        self._sending = threading.Lock()  # the event loop's sends and the thread's
        self._full = threading.Event()
        self._stopping = False
        # Two counters, each written by one thread: no lock on the serving path.
        self._dropped_full = 0
        self._dropped_failed = 0
        self.exported = 0
        self._thread = threading.Thread(target=self._run, name="ferry-span-export", daemon=True)
        self._thread.start()

    def add(self, record: Record) -> None:
        queued = len(self._queue)
        if queued >= self._max_queue:
            spans = span_count(record)
            self._dropped_full += spans
            self._losses.lost(QUEUE_FULL, spans)
            return
        self._queue.append(record)
        if queued + 1 == self._batch_size:
            # Inline unless the export thread is sending (or starting a new exporter):
            # then it takes this batch too, and the event loop does not wait for it.
            if self._inline and self._sending.acquire(blocking=False):
                try:
                    self._send_queued(whole_batches_only=True)
                finally:
                    self._sending.release()
            else:
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
            with self._sending:
                self._send_queued(whole_batches_only=False, everything=stopping)
                self._destination.send_pending()
            self._losses.report_due()
            if stopping and not self._queue:
                return

    def _send_queued(self, whole_batches_only: bool, everything: bool = False) -> None:
        """Send full batches, then (unless ``whole_batches_only``) one partial batch, or
        (``everything``) all that is queued."""
        queue, size = self._queue, self._batch_size
        while len(queue) >= size or (queue and not whole_batches_only):
            self._send_batch([queue.popleft() for _ in range(min(len(queue), size))])
            if not everything and len(queue) < size:
                whole_batches_only = True

    def _send_batch(self, batch: list[Record]) -> None:
        spans = sum(map(span_count, batch))
        try:
            sent = self._destination.send(batch)
        except Exception as error:  # an exporter's own failure must not end the thread
            self._dropped_failed += spans
            self._losses.lost(type(error).__name__, spans, str(error))
            return
        if sent:
            self.exported += spans
        else:
            self._dropped_failed += spans
            self._losses.lost(self._destination.loss_reason, spans)

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
        self._add: Callable[[Record], None] = export.add if export else lambda record: None
        self._models: dict[tuple[str, str], tuple[str, Attributes]] = {}
        self._workers: dict[tuple[object, ...], tuple[str, Attributes]] = {}

    def request(
        self, model: str, version: str, request_id: str, headers: Mapping[str, str]
    ) -> RequestWatch | None:
        parent = parent_from_headers(headers)
        trace_id = parent.trace_id if parent is not None else new_trace_id()
        if not self._sampler(parent, trace_id):
            return None
        named = self._models.get((model, version))
        if named is None:  # one name and attribute tuple per model: the encoder caches them
            of_model: Attributes = (("ferry.model", model), ("ferry.model_version", version))
            named = self._models[model, version] = (f"predict {model}", of_model)
        name, of_model = named
        return _Request(name, trace_id, parent, of_model, request_id, self._add)

    def batch(
        self,
        model: str,
        batch_id: int,
        size: int,
        requests: Sequence[RequestWatch],
        worker: Mapping[str, str | int],
    ) -> BatchWatch | None:
        traced = [r for r in requests if isinstance(r, _Request)]
        if not traced:
            return None
        for request in traced:
            request.dispatched()
        first = traced[0]
        of_worker = self._workers.get((model, *worker.items()))
        if of_worker is None:  # one name and attribute tuple per model and worker
            if len(self._workers) >= 1024:  # workers come and go: forget the old ones
                self._workers.clear()
            named = tuple((f"ferry.worker.{key}", value) for key, value in worker.items())
            of_worker = (f"batch {model}", (("ferry.model", model), *named))
            self._workers[(model, *worker.items())] = of_worker
        name, attributes = of_worker
        of_batch = (("ferry.batch.id", batch_id), ("ferry.batch.size", size))
        served = tuple((r.trace_id, r.span_id) for r in traced)
        batch = _Batch(name, first, attributes + of_batch, served, self._add)
        back = ((batch.trace_id, batch.span_id),)
        for request in traced:
            request.batches += back
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
            message = _error_name(error)
            end = time.time_ns()
            remote = parent is not None
            self._add(
                (
                    trace_id,
                    span_id,
                    parent_id,
                    name,
                    KIND_SERVER,
                    start,
                    end,
                    error_attributes(message),
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


def _error_name(error: BaseException | None) -> str:
    """A failed span's status message (and ``error.type``): its error's type."""
    return "" if error is None else type(error).__name__


class _Request:
    """A request's span and its queue span: one record, made when the request ends."""

    __slots__ = (
        "_add",
        "batches",
        "dispatched_ns",
        "name",
        "of_model",
        "parent_id",
        "remote_parent",
        "request_id",
        "span_id",
        "start_ns",
        "trace_id",
        "trace_state",
    )

    def __init__(
        self,
        name: str,
        trace_id: int,
        parent: Parent | None,
        of_model: Attributes,
        request_id: str,
        add: Callable[[Record], None],
    ) -> None:
        self.name = name
        self.of_model, self.request_id = of_model, request_id
        self.trace_id, self.span_id = trace_id, new_span_id()
        self.parent_id = parent.span_id if parent is not None else 0
        self.trace_state = parent.trace_state if parent is not None else ""
        self.remote_parent = parent is not None
        self.batches: tuple[tuple[int, int], ...] = ()
        self.start_ns = time.time_ns()
        self.dispatched_ns = 0
        self._add = add

    @property
    def ids(self) -> tuple[str, str]:
        # On every traced request: %-formatting is twice an f-string's speed here.
        return "%032x" % self.trace_id, "%016x" % self.span_id  # noqa: UP031

    def dispatched(self) -> None:
        if not self.dispatched_ns:  # its first batch ends its wait (a retry's is in its span)
            self.dispatched_ns = time.time_ns()

    def ended(self, outcome: Prediction | BaseException, queued_seconds: float) -> None:
        queue_ms = ("ferry.queue_ms", queued_seconds * 1000)
        if isinstance(outcome, BaseException):
            self.end(outcome, (queue_ms,))
        else:
            size, status = (
                ("ferry.batch.size", outcome.batch_size),
                ("ferry.status", outcome.status),
            )
            self.end(None, (queue_ms, size, status))

    def end(self, error: BaseException | None, attributes: Attributes) -> None:
        self._add(
            (
                REQUEST,
                self.trace_id,
                self.span_id,
                self.parent_id,
                self.name,
                self.start_ns,
                self.dispatched_ns,
                time.time_ns(),
                self.of_model,
                self.request_id,
                attributes,
                self.batches,
                _error_name(error),
                self.trace_state,
                self.remote_parent,
            )
        )


class _Batch:
    """A batch's span (the child of its first traced request's) and its stage spans: one
    record, made when the batch ends."""

    def __init__(
        self,
        name: str,
        parent: _Request,
        attributes: tuple[tuple[str, AttributeValue], ...],
        served: tuple[tuple[int, int], ...],
        add: Callable[[Record], None],
    ) -> None:
        self.name, self.attributes, self.served, self.add = name, attributes, served, add
        self.trace_id, self.span_id, self.parent_id = parent.trace_id, new_span_id(), parent.span_id
        self.trace_state = parent.trace_state
        self.start_ns = time.time_ns()

    @property
    def traceparent(self) -> str:
        return traceparent(self.trace_id, self.span_id)

    def ended(self, windows: Sequence[StageWindow], error: BaseException | None = None) -> None:
        stages = tuple((window.stage, window.start_ns, window.end_ns) for window in windows)
        self.add(
            (
                BATCH,
                self.trace_id,
                self.span_id,
                self.parent_id,
                self.name,
                self.start_ns,
                time.time_ns(),
                self.attributes,
                self.served,
                _error_name(error),
                self.trace_state,
                stages,
            )
        )
