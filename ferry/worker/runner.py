"""Run one batch through a handler and turn every outcome into an ``ItemResult``.

A batch whose requests name different request envelopes (``RequestItem.envelope``: a
KServe V1, an Open Inference Protocol and a TorchServe request queued together) calls the
handler once per envelope, each group through its own, and its answers go back in the
order of the requests."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from ferry.errors import InvalidInput
from ferry.handlers.contract.context import Context, IntermediateResponse
from ferry.handlers.contract.exceptions import PredictionException, RequestCancelled
from ferry.handlers.contract.loader import EntryPoint
from ferry.wire.log_forward import request_ids, trace
from ferry.wire.messages import (
    BatchResult,
    ErrorKind,
    HandlerMetricValue,
    ItemResult,
    PartialResult,
    PredictBatch,
    RequestItem,
    StageWindow,
)
from ferry.worker.device_failure import unrecoverable_device_error
from ferry.worker.payloads import encode_output, request_row

log = logging.getLogger("ferry.worker")


def _error(item: RequestItem, exc: BaseException) -> ItemResult:
    if isinstance(exc, InvalidInput):
        return ItemResult(item.request_id, b"", "", 0, {}, ErrorKind.INVALID_INPUT, str(exc))
    if isinstance(exc, PredictionException):
        code = exc.error_code
        return ItemResult(item.request_id, b"", "", code, {}, ErrorKind.HANDLER, exc.message)
    message = f"{type(exc).__name__}: {exc}"
    return ItemResult(item.request_id, b"", "", 0, {}, ErrorKind.HANDLER, message)


class BatchRunner:
    """Calls the handler's entry point; isolates a failing request from the rest of its batch."""

    def __init__(
        self,
        entry_point: EntryPoint,
        context: Context,
        send_partial: Callable[[PartialResult], None] | None = None,
        *,
        envelopes: Callable[[str], EntryPoint] | None = None,
    ) -> None:
        """``envelopes``: the entry point for the requests that name each request envelope
        (``ferry.worker.loading.ReadyHandler.request_envelopes``); without it every
        request goes to ``entry_point``."""
        self.entry_point = entry_point
        self.context = context
        self.send_partial = send_partial
        self.envelopes = envelopes
        self.device_failed: str | None = None
        """The sticky GPU error a batch met (``device_failure``): the worker must go."""
        self._streamed: set[str] = set()
        """Requests of the current batch that have sent a part: never run twice."""
        self._stage_ms: dict[str, float] = {}
        """The handler's stage times over every call of the current batch."""
        self._windows: list[StageWindow] = []
        """When each of those stage calls ran."""
        self._traceparent = ""
        """The current batch's span, when it is traced."""

    def run(
        self, batch: PredictBatch, is_cancelled: Callable[[int, str], bool] | None = None
    ) -> BatchResult:
        """Every request of ``batch`` answered; ``is_cancelled(batch_id, request_id)``
        tells which lost their client meanwhile (``Context.send_intermediate``)."""
        started_ns, start = time.time_ns(), time.perf_counter()
        self._streamed, self._stage_ms, self._windows = set(), {}, []
        self._traceparent = batch.traceparent
        if self.send_partial is not None:
            send, batch_id = self.send_partial, batch.batch_id
            cancelled = None
            if is_cancelled is not None:
                cancelled = functools.partial(is_cancelled, batch_id)
            self.context.stream_to(lambda part: send(self._partial(batch_id, part)), cancelled)
        results = self._answer_every_item(batch)
        elapsed_ms = (time.perf_counter() - start) * 1000
        # Drained every batch: the frontend aggregates them, the worker keeps nothing.
        metrics = [
            HandlerMetricValue(m.name, m.value, m.unit, m.kind, dict(m.dimensions))
            for m in self.context.metrics.drain()
        ]
        stages = self._stage_ms or {"handle": elapsed_ms}
        return BatchResult(
            batch.batch_id,
            results,
            elapsed_ms,
            metrics,
            stages,
            self._traced_windows(started_ns, elapsed_ms),
        )

    def _traced_windows(self, started_ns: int, elapsed_ms: float) -> list[StageWindow]:
        """When the stages ran, for a traced batch's spans (none sent for an untraced one);
        the whole batch as ``handle`` for a handler without stages."""
        if not self._traceparent:
            return []
        end_ns = started_ns + int(elapsed_ms * 1_000_000)
        return self._windows or [StageWindow("handle", started_ns, end_ns)]

    def failed(self, batch: PredictBatch, exc: Exception) -> BatchResult:
        """The answer for a batch whose own answer could not be sent: every request
        failed with ``exc``."""
        return BatchResult(batch.batch_id, [_error(item, exc) for item in batch.items], 0.0)

    def _answer_every_item(self, batch: PredictBatch) -> list[ItemResult]:
        """Every request answered, whatever it made the handler or our own decoding
        raise: one request's exception never ends the worker that holds its batch-mates."""
        try:
            return self._run_items(batch.items, isolate_on_error=True)
        except Exception as exc:
            log.exception("batch %d failed outside the handler", batch.batch_id)
            return [_error(item, exc) for item in batch.items]

    def _partial(self, batch_id: int, part: IntermediateResponse) -> PartialResult:
        index = next(i for i, rid in self.context.request_ids.items() if rid == part.request_id)
        content_type = self.context.get_response_content_type(index)
        body, content_type = encode_output(part.output, content_type)
        self._streamed.add(part.request_id)
        return PartialResult(batch_id, part.request_id, body, content_type, part.status)

    def _run_items(self, items: list[RequestItem], *, isolate_on_error: bool) -> list[ItemResult]:
        rows: list[Any] = []
        runnable: list[RequestItem] = []
        early: dict[str, ItemResult] = {}
        for item in items:
            try:
                rows.append(request_row(item))
                runnable.append(item)
            except InvalidInput as exc:
                early[item.request_id] = _error(item, exc)
        outcomes: list[ItemResult] = []
        for envelope, group_rows, group in self._by_envelope(rows, runnable):
            try:
                entry = self.entry_point if self.envelopes is None else self.envelopes(envelope)
            except ValueError as exc:  # an envelope of no such name
                outcomes += [_error(item, exc) for item in group]
                continue
            outcomes += self._call_handler(entry, group_rows, group, isolate_on_error)
        by_id = {result.request_id: result for result in outcomes}
        return [early.get(item.request_id) or by_id[item.request_id] for item in items]

    def _by_envelope(
        self, rows: list[Any], items: list[RequestItem]
    ) -> list[tuple[str, list[Any], list[RequestItem]]]:
        """The requests grouped by the envelope they name, in order of first appearance:
        one group for a batch that names one (always, without ``envelopes``)."""
        if not items:
            return []
        if self.envelopes is None:
            return [("", rows, items)]
        first = items[0].envelope
        if all(item.envelope == first for item in items):
            return [(first, rows, items)]
        groups: dict[str, tuple[list[Any], list[RequestItem]]] = {}
        for row, item in zip(rows, items, strict=True):
            group_rows, group = groups.setdefault(item.envelope, ([], []))
            group_rows.append(row)
            group.append(item)
        return [(envelope, *group) for envelope, group in groups.items()]

    def _invoke(self, entry: EntryPoint, rows: list[Any]) -> Any:
        """``entry`` over ``rows``; the handler's stage times add to the batch's."""
        try:
            return entry(rows, self.context)
        finally:
            for stage, ms in self.context.stage_ms.items():
                self._stage_ms[stage] = self._stage_ms.get(stage, 0.0) + ms
            if self._traceparent:
                self._windows += [StageWindow(*window) for window in self.context.stage_windows]

    def _call_handler(
        self, entry: EntryPoint, rows: list[Any], items: list[RequestItem], isolate_on_error: bool
    ) -> list[ItemResult]:
        """``entry`` over the rows of ``items``, requests that name the same envelope."""
        ids = [i.request_id for i in items]
        self.context.start_batch(ids, [i.headers for i in items])
        # The handler's log records, and ours, name these requests (and the batch's span).
        with request_ids(ids), trace(self._traceparent):
            try:
                outputs = self._invoke(entry, rows)
            except RequestCancelled as exc:
                log.info("batch of %d stopped: %s", len(items), exc)
                return [_error(item, exc) for item in items]
            except Exception as exc:
                return self._after_failure(exc, items, isolate_on_error)
        if not isinstance(outputs, list) or len(outputs) != len(items):
            count = len(outputs) if isinstance(outputs, list) else type(outputs).__name__
            message = f"handler returned {count} results for a batch of {len(items)} requests"
            return [_error(item, RuntimeError(message)) for item in items]
        return [
            self._encode(index, item, out)
            for index, (item, out) in enumerate(zip(items, outputs, strict=True))
        ]

    def _after_failure(
        self, exc: Exception, items: list[RequestItem], isolate_on_error: bool
    ) -> list[ItemResult]:
        """The results of a batch whose handler raised ``exc``."""
        if self._device_failed(exc):  # every call would fail now: no retries
            return [_error(item, self._replaced(exc)) for item in items]
        if isolate_on_error and len(items) > 1:
            # One bad request must not fail its neighbours: retry each alone (but not one
            # that already streamed parts: its client has them).
            log.warning("batch of %d failed (%s); retrying requests one by one", len(items), exc)
            return [
                _error(item, exc)
                if item.request_id in self._streamed
                else self._run_items([item], isolate_on_error=False)[0]
                for item in items
            ]
        log.exception("handler failed")
        return [_error(item, exc) for item in items]

    def _device_failed(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a sticky GPU error; the first one is kept for the worker."""
        reason = unrecoverable_device_error(exc)
        if reason is not None and self.device_failed is None:
            log.error("the GPU failed: %s; this worker will be replaced", reason)
            self.device_failed = reason
        return reason is not None

    @staticmethod
    def _replaced(exc: BaseException) -> RuntimeError:
        reason = unrecoverable_device_error(exc) or str(exc)
        return RuntimeError(f"the GPU failed ({reason}); the worker is replaced")

    def _encode(self, index: int, item: RequestItem, output: Any) -> ItemResult:
        if isinstance(output, BaseException):
            if self._device_failed(output):  # a micro-batch's failure, in the pipeline
                return _error(item, self._replaced(output))
            return _error(item, output)
        headers = dict(self.context.get_response_headers(index))
        content_type = headers.pop("content-type", None)
        status, _ = self.context.get_response_status(index)
        try:
            body, content_type = encode_output(output, content_type)
        except (TypeError, ValueError) as exc:
            return _error(item, exc)
        return ItemResult(item.request_id, body, content_type, status, headers)
