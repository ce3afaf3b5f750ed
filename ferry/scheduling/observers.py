"""The request path's one hook point: an ``Observer`` told of every request a model's
runner takes and every batch it sends a worker, and told how each ended.

Tracing (``ferry.tracing``) is the observer Ferry ships. On the request path only the
scheduler calls it (a workflow's own span, around its nodes' requests, is the workflow
manager's; the export is the server's), at the three moments it owns:
``ModelRunner.enqueue`` takes a request (``watch_request``), the dispatcher sends a
batch (``Observer.batch``) and hears how it went (``BatchWatch.ended``). A request's end
is its future's: whoever answers it, the observer hears of it through the future, so the
service, the transports and the retry paths never know anything watches. With no
observer (the default) a request costs one ``is None`` check. Ferry's own requests
(describe's) are not shown to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Protocol

from ferry.scheduling.jobs import Job, Prediction, RequestWatch
from ferry.wire.messages import StageWindow


class BatchWatch(Protocol):
    """What an observer keeps of one batch, from its sending to a worker to its end."""

    @property
    def traceparent(self) -> str:
        """The W3C ``traceparent`` the worker's log records of the batch carry."""
        ...

    def ended(self, windows: Sequence[StageWindow], error: BaseException | None = None) -> None:
        """Its result came back, with when the worker ran each stage; or it failed."""
        ...


class Observer(Protocol):
    """Watches requests and batches (``ferry.tracing.Tracing``); None for one it leaves."""

    def request(
        self, model: str, version: str, request_id: str, headers: Mapping[str, str]
    ) -> RequestWatch | None: ...

    def batch(
        self,
        model: str,
        batch_id: int,
        size: int,
        requests: Sequence[RequestWatch],
        worker: Mapping[str, str | int],
    ) -> BatchWatch | None:
        """A batch of ``size`` requests, among them ``requests`` it watches (one at
        least), leaves their queue: their wait ends."""
        ...


def watch_request(observer: Observer, model: str, version: str, job: Job) -> None:
    """Let ``observer`` watch a job the runner takes, to the end of its future."""
    item = job.item
    watch = observer.request(model, version, item.request_id, item.headers)
    if watch is None:
        return
    job.watch = watch
    job.future.add_done_callback(lambda future: watch.ended(_outcome(future), job.queued_seconds))


def refused(job: Job, error: BaseException) -> None:
    """The runner did not queue ``job`` after all (it raised ``error``): its watch ends."""
    if job.watch is not None:
        job.watch.ended(error, 0.0)


def _outcome(future: asyncio.Future[Prediction]) -> Prediction | BaseException:
    if future.cancelled():
        return asyncio.CancelledError()
    return future.exception() or future.result()
