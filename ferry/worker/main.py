"""Worker process entry point: load the handler, then answer batches until the socket closes.

Started by the frontend as ``python -P -m ferry.worker.main --fd N`` (a fresh interpreter,
never a fork, so CUDA state is never inherited); its first frame is its ``WorkerSpec``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

from ferry.handlers.builtin import kept_weights
from ferry.wire import codec, log_forward
from ferry.wire.environment import BOUND_GPU, handler_gpu, user_pins_threads
from ferry.wire.messages import (
    DEVICE_FAILED_EXIT,
    BatchResult,
    Message,
    PredictBatch,
    SpecTaken,
    StartWorker,
    WorkerLoadFailed,
    WorkerReady,
)
from ferry.wire.spec import WorkerSpec
from ferry.worker.footprint import Footprint, FootprintMeter
from ferry.worker.helper_threads import (
    handler_thread_work,
    helper_placement,
    install,
    threads_before_load,
)
from ferry.worker.inbox import Inbox
from ferry.worker.lifetime import die_with_parent, ignore_interrupts
from ferry.worker.loading import ReadyHandler, load_handler
from ferry.worker.pinned_cores import forget_pinning
from ferry.worker.runner import BatchRunner
from ferry.worker.torch_setup import (
    SPARE_READY,
    configure_torch,
    preload_compiler,
    return_freed_memory,
)

log = logging.getLogger("ferry.worker")
T = TypeVar("T")

WEIGHTS_WRITTEN_EXIT = 71
"""A worker's exit status after its handler wrote into a keeper's shared weights: it
left the batch unanswered, as a crash would."""


class FrameSender:
    """Writes whole frames to the frontend; a lock keeps frames whole when a pipelined
    handler streams parts from its stage threads."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()

    def __call__(self, message: Message) -> None:
        frame = codec.encode(message)
        with self._lock:
            self._sock.sendall(frame)


def _load(spec: WorkerSpec, send: FrameSender) -> tuple[ReadyHandler, BatchRunner, str]:
    """The loaded handler, the batch runner over it, and the device the handler chose."""
    ready = load_handler(spec.model, gpu_id=handler_gpu(spec.gpu_id, os.environ))
    return_freed_memory()
    runner = BatchRunner(ready.entry, ready.context, send, envelopes=ready.request_envelopes)
    return ready, runner, _chosen_device(ready.instance, spec)


def _chosen_device(handler: object, spec: WorkerSpec) -> str:
    """Where the handler put its model: its own ``device`` attribute when it set one
    (TorchServe handlers choose it in ``initialize``), else the GPU it was given; a GPU
    by the server's index (a worker bound to its GPU sees it as ``cuda:0``)."""
    device = str(getattr(handler, "device", None) or "")
    if not device:
        return "cpu" if spec.gpu_id is None else f"cuda:{spec.gpu_id}"
    if spec.gpu_id is not None and BOUND_GPU in os.environ and device in ("cuda", "cuda:0"):
        return f"cuda:{spec.gpu_id}"
    return device


class HandlerThread(Protocol):
    """Where a worker runs its handler's code (loads, batches): ``work()`` there, its
    result or exception back."""

    def __call__(self, work: Callable[[], T]) -> T: ...


def in_this_thread(work: Callable[[], T]) -> T:
    return work()


def serve(
    sock: socket.socket,
    inbox: Inbox,
    spec: WorkerSpec,
    place_helpers: bool = False,
    *,
    loading: contextlib.AbstractContextManager[object] | None = None,
    unload: bool = False,
    handler_thread: HandlerThread = in_this_thread,
) -> int:
    """Load the handler, then answer batches until the frontend closes the socket.
    ``loading``: held around the load (a process hosting several models loads one at a
    time); ``unload``: stop the handler's stage pipeline at the end (the process lives on);
    ``handler_thread``: where the handler's code runs (a process hosting several models
    runs all of theirs on one thread: ``ferry.worker.host``)."""
    send = FrameSender(sock)
    loaded = _load_and_report(spec, send, place_helpers, loading, handler_thread)
    if loaded is None:
        return 1
    ready, runner = loaded
    try:
        return _answer_batches(inbox, runner, send, handler_thread)
    finally:
        if unload:
            handler_thread(ready.close)


def _load_and_report(
    spec: WorkerSpec,
    send: FrameSender,
    place_helpers: bool,
    loading: contextlib.AbstractContextManager[object] | None,
    handler_thread: HandlerThread,
) -> tuple[ReadyHandler, BatchRunner] | None:
    """Load the handler and tell the frontend: ``WorkerReady`` with what the load
    measured, or ``WorkerLoadFailed`` (then None)."""

    def load() -> tuple[ReadyHandler, BatchRunner, str, Footprint]:
        threads_before = threads_before_load() if place_helpers else None
        meter = FootprintMeter()
        ready, runner, device = _load(spec, send)
        footprint = meter.measured()
        if place_helpers:
            install(helper_placement(threads_before))
        return ready, runner, device, footprint

    try:
        with loading or contextlib.nullcontext():
            ready, runner, device, footprint = handler_thread(load)
    except Exception as exc:
        log.exception("handler failed to load")
        send(WorkerLoadFailed(f"{type(exc).__name__}: {exc}", out_of_memory(exc)))
        return None
    if (written := _wrote_shared_weights()) is not None:
        message = (
            f"the handler wrote into the weights its model's workers share ({written}): "
            "set optimization.weights_keeper off for it"
        )
        send(WorkerLoadFailed(message))
        return None
    measured = (footprint.resident_bytes, footprint.gpu_bytes)
    shared = (footprint.shared_bytes, footprint.shared_key)
    send(WorkerReady(os.getpid(), device, *measured, *shared))
    return ready, runner


def _answer_batches(
    inbox: Inbox, runner: BatchRunner, send: FrameSender, handler_thread: HandlerThread
) -> int:
    while (message := inbox.next_batch()) is not None:
        answer = handler_thread(functools.partial(_run_batch, runner, message, inbox))
        if runner.device_failed is not None:
            # Unanswered, as if the worker had crashed: the frontend answers a lone request
            # and retries batch-mates one by one on fresh workers (poison isolation).
            log.error("exiting: the GPU context is unusable (%s)", runner.device_failed)
            return DEVICE_FAILED_EXIT
        if _wrote_shared_weights() is not None:  # unanswered too: the batch is the culprit
            return WEIGHTS_WRITTEN_EXIT
        try:
            send(answer)
        except (TypeError, ValueError, OverflowError) as exc:
            # An answer msgpack cannot frame (a handler's header of no plain type, say)
            # fails its batch, not the worker.
            log.exception("batch %d's answer cannot be sent", message.batch_id)
            send(runner.failed(message, exc))
    return 0


def _wrote_shared_weights() -> str | None:
    """The weights file whose keeper's copy the handler wrote into, reported to the keeper
    (which exits, so every worker on the copy is replaced); None when untouched."""
    written = kept_weights.written_weights()
    if written is not None:
        log.error(
            "the handler wrote into the weights its model's workers share (%s); weights "
            "are read-only with a weights keeper: the keeper and its workers are replaced",
            written,
        )
        kept_weights.report_written(written)
    return written


def _run_batch(runner: BatchRunner, message: PredictBatch, inbox: Inbox) -> BatchResult:
    with handler_thread_work():
        return runner.run(message, inbox.is_cancelled)


def read_spec(inbox: Inbox) -> WorkerSpec | None:
    """The first frame: the worker's spec (None when the frontend went away first)."""
    message = inbox.next_message()
    if message is None:
        return None
    if not isinstance(message, StartWorker):
        raise codec.ProtocolError(f"expected the worker spec first, got {type(message).__name__}")
    return message.spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ferry-worker")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument(
        "--preload-compiler",
        action="store_true",
        help="a spare: import torch's compiler before the spec arrives",
    )
    args = parser.parse_args(argv)
    die_with_parent()
    ignore_interrupts()
    # One structured line per record: the frontend re-emits it at its level, with its
    # traceback and request ids, prefixed with the model, worker and time.
    log_forward.install(logging.INFO)
    if args.preload_compiler:  # its environment is any unpinned worker's: fixed at spawn
        preload_compiler()
        log.info(SPARE_READY)
    with socket.socket(fileno=args.fd) as sock:
        inbox = Inbox(sock)
        spec = read_spec(inbox)
        if spec is None:
            return 1
        if args.preload_compiler:  # alive and reading: the frontend bounds its wait for this
            FrameSender(sock)(SpecTaken(os.getpid()))
        configure_torch(spec.torch_threads)  # OpenMP has read its variables by now
        kept_weights.use_keeper(spec.weights_keeper, "cpu" if spec.gpu_id is None else "cuda")
        # Threads pinned, by Ferry or by the user's own OpenMP binding, stay where they are.
        leave_threads = forget_pinning() is not None or user_pins_threads(os.environ)
        status = serve(sock, inbox, spec, place_helpers=not leave_threads)
    if status in (DEVICE_FAILED_EXIT, WEIGHTS_WRITTEN_EXIT):
        # Straight out: tearing down a process whose CUDA context faulted may abort in
        # native destructors, and the frontend must see this status to say why.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def out_of_memory(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from, is running out of host or GPU
    memory (``MemoryError``; torch's ``OutOfMemoryError``, CUDA's included)."""
    import torch

    kinds = (MemoryError, *([torch.OutOfMemoryError] if hasattr(torch, "OutOfMemoryError") else []))
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, kinds):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


if __name__ == "__main__":
    raise SystemExit(main())
