"""The stage pipeline: a batch split into micro-batches whose preprocess and postprocess run
in thread pools while inference runs, reassembled in order.

Configured in model-config.yaml with TorchServe's keys::

    micro_batching:
      micro_batch_size: 4
      parallelism: {preprocess: 2, inference: 1, postprocess: 1}
      pool: thread               # Ferry's key: ``process`` for GIL-bound preprocessing

Any handler with ``preprocess / inference / postprocess`` (a ``BaseHandler`` subclass) gets
it without code changes. Decoding and resizing in PIL release the GIL, so threads overlap
them with each other and with inference. At most ``preprocess`` + 1 micro-batches are
prepared ahead of inference, so memory stays flat. An error in one micro-batch fails only
its own requests. ``pool: process`` runs preprocess in spawned processes instead
(``preprocess_processes.py``), for preprocessing written in pure Python.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextvars import copy_context
from dataclasses import dataclass
from typing import Any

from ferry.config.sections import MicroBatchingConfig, parse_micro_batching
from ferry.handlers.contract.context import Context
from ferry.worker.helper_threads import handler_thread_work, seeking_helpers
from ferry.worker.pinned_cores import spread_over_worker_cores
from ferry.worker.preprocess_processes import PreprocessProcesses

log = logging.getLogger("ferry.worker")

Prepared = tuple[Any, dict[int, Exception], float]
"""A preprocessed micro-batch: its tensor, its rows that failed (by offset), and the
milliseconds preprocessing took."""
Processed = tuple[list[Any], float]
"""A postprocessed micro-batch: its answers, and the milliseconds postprocessing took."""
Posted = tuple[int, int, dict[int, Exception], Future[Processed] | Exception]
"""A micro-batch after inference: its first row, its row count, the rows that failed
preprocessing, and its postprocessing (or the error that failed the micro-batch)."""


@dataclass(frozen=True)
class PipelineSettings:
    micro_batch_size: int
    preprocess_threads: int
    postprocess_threads: int
    preprocess_in_processes: bool = False

    @classmethod
    def from_model_config(cls, config: dict[str, Any]) -> PipelineSettings | None:
        """The document's ``micro_batching`` section, read by ``ferry.config``'s rules."""
        section = parse_micro_batching(config.get("micro_batching"))
        return None if section is None else cls.from_section(section)

    @classmethod
    def from_section(cls, section: MicroBatchingConfig) -> PipelineSettings:
        if section.inference > 1:
            log.warning(
                "micro_batching: parallelism.inference %d: inference runs one "
                "micro-batch at a time",
                section.inference,
            )
        return cls(
            section.micro_batch_size,
            section.preprocess,
            section.postprocess,
            preprocess_in_processes=section.pool == "process",
        )


def staged_handler(entry: Callable[..., Any]) -> Any | None:
    """The handler instance behind ``entry`` if it has the three stages, else None."""
    service = getattr(entry, "__self__", None)
    stages = ("preprocess", "inference", "postprocess")
    return service if service is not None and all(hasattr(service, s) for s in stages) else None


_NOTHING: Any = object()
"""The output of a micro-batch none of whose rows could be preprocessed."""


class StagePipeline:
    """Runs one batch of handler rows through the three stages, micro-batch by micro-batch."""

    def __init__(self, handler: Any, settings: PipelineSettings) -> None:
        self.handler = handler
        self.settings = settings
        # Stage threads run beside the model's: with cpu_pinning, on all the worker's cores.
        self._pre = ThreadPoolExecutor(
            settings.preprocess_threads, "pre", initializer=spread_over_worker_cores
        )
        self._post = ThreadPoolExecutor(
            settings.postprocess_threads, "post", initializer=spread_over_worker_cores
        )
        self._processes = (
            _start_processes(handler, settings.preprocess_threads)
            if settings.preprocess_in_processes
            else None
        )

    def _preprocess(self, rows: list[Any], context: Context) -> Prepared:
        if self._processes is not None:
            batch, failures, elapsed_ms = self._processes.preprocess(rows)
            to_device = getattr(self.handler, "to_device", None)
            if to_device is not None and getattr(batch, "device", None) is not None:
                start = time.perf_counter()
                batch = to_device(batch)  # the children never touch the GPU
                elapsed_ms += (time.perf_counter() - start) * 1000
            return batch, failures, elapsed_ms
        start = time.perf_counter()
        forget_failures = getattr(self.handler, "forget_failures", None)
        if forget_failures is not None:  # a subclass's preprocess may not set them
            forget_failures()
        tensor = self.handler.preprocess(rows)
        failures = dict(getattr(self.handler, "failures", {}) or {})
        return tensor, failures, (time.perf_counter() - start) * 1000

    def _postprocess(self, output: Any) -> Processed:
        start = time.perf_counter()
        results = self.handler.postprocess(output)
        return list(results), (time.perf_counter() - start) * 1000

    def handle(self, rows: list[Any], context: Context) -> list[Any]:
        """One entry per row: an answer, or an exception for rows whose micro-batch failed."""
        # Torch's helpers are never sought over the whole batch: stage threads start
        # teams of their own.
        with handler_thread_work(search=False):
            return self._handle(rows, context)

    def _handle(self, rows: list[Any], context: Context) -> list[Any]:
        self.handler.context = context
        size = self.settings.micro_batch_size
        chunks = [rows[i : i + size] for i in range(0, len(rows), size)]
        # While the helpers are sought, each inference runs with the stage threads idle.
        seeking = seeking_helpers()
        ahead = 1 if seeking else self.settings.preprocess_threads + 1
        pending: deque[Future[Prepared]] = deque()
        submitted = 0
        posts: list[Posted] = []
        for index in range(len(chunks)):
            submitted = self._preprocess_ahead(chunks, submitted, pending, ahead, context)
            first = index * size
            try:
                tensor, failures, pre_ms = pending.popleft().result()
                context.add_stage_time("preprocess", pre_ms)
                if seeking:
                    wait([post[3] for post in posts if isinstance(post[3], Future)])
                # Nothing decoded: nothing to infer. Otherwise, as TorchServe, inference and
                # postprocess run even on a None batch (a subclass's preprocess may return one).
                decoded = tensor is not None or not failures
                output = self._inference(tensor, context) if decoded else _NOTHING
            except Exception as exc:
                log.exception("micro-batch %d failed", index)
                posts.append((first, len(chunks[index]), {}, exc))
                continue
            posts.append((first, len(chunks[index]), failures, self._start_postprocess(output)))
        return self._reassemble(posts, len(rows), context)

    def _preprocess_ahead(
        self,
        chunks: list[list[Any]],
        submitted: int,
        pending: deque[Future[Prepared]],
        ahead: int,
        context: Context,
    ) -> int:
        """Submit the micro-batches from ``submitted`` on to the preprocess pool until
        ``ahead`` wait in ``pending`` (or none is left); how many are submitted now."""
        while submitted < len(chunks) and len(pending) < ahead:
            run = copy_context().run  # so pool threads' log records carry the request ids
            pending.append(self._pre.submit(run, self._preprocess, chunks[submitted], context))
            submitted += 1
        return submitted

    def _inference(self, tensor: Any, context: Context) -> Any:
        """The handler's output for one preprocessed micro-batch, its time added to
        ``context``."""
        started_ns, start = time.time_ns(), time.perf_counter()
        # Woken by a preprocess thread, perhaps on another core. While seeking,
        # no stage thread works now: the inference's new threads are the helpers.
        with handler_thread_work():
            output = self.handler.inference(tensor)
        context.add_stage_time("inference", (time.perf_counter() - start) * 1000, started_ns)
        return output

    def _start_postprocess(self, output: Any) -> Future[Processed]:
        """Postprocess ``output`` in the pool; a micro-batch with nothing decoded has
        nothing to postprocess."""
        if output is _NOTHING:
            future: Future[Processed] = Future()
            future.set_result(([], 0.0))
            return future
        return self._post.submit(copy_context().run, self._postprocess, output)

    def _reassemble(self, posts: list[Posted], total: int, context: Context) -> list[Any]:
        results: list[Any] = [None] * total
        for first, count, failures, outcome in posts:
            if isinstance(outcome, Exception):
                results[first : first + count] = [outcome] * count
                continue
            try:
                answers, post_ms = outcome.result()
                context.add_stage_time("postprocess", post_ms)
            except Exception as exc:
                results[first : first + count] = [exc] * count
                continue
            answers_iter = iter(answers)
            for offset in range(count):
                results[first + offset] = failures.get(offset) or next(answers_iter, None)
            if any(results[first + o] is None for o in range(count)):
                error = RuntimeError("postprocess returned fewer results than its micro-batch")
                results[first : first + count] = [error] * count
        return results

    def close(self) -> None:
        self._pre.shutdown(wait=False, cancel_futures=True)
        self._post.shutdown(wait=False, cancel_futures=True)
        if self._processes is not None:
            self._processes.close()


def _start_processes(handler: Any, count: int) -> PreprocessProcesses | None:
    """Preprocess processes for ``handler``, or None (threads, with a warning) when the
    handler cannot be copied into a process or the processes cannot start."""
    try:
        processes = PreprocessProcesses(handler, count)
    except Exception as exc:
        log.warning("micro_batching pool: process unavailable (%s); using threads", exc)
        return None
    log.info("preprocess runs in %d processes", count)
    return processes
