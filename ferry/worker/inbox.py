"""What the frontend sends a worker while its handler runs, read on a thread of its own.

The handler runs on the worker's main thread, often for a long stream of parts. A client
that hangs up meanwhile must reach it: so frames are read here as they come, batches are
queued for the main thread in order, and ``CancelRequests`` are noted at once, for the
running handler's next ``send_intermediate`` to see.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import BinaryIO

from ferry.worker import codec
from ferry.worker.messages import CancelRequests, Message, PredictBatch

ReadMessage = Callable[[BinaryIO], Message | None]


class Inbox:
    """Batches in order, and which requests of which batch lost their client."""

    def __init__(self, reader: BinaryIO, read_message: ReadMessage) -> None:
        self._reader = reader
        self._read_message = read_message
        self._batches: queue.SimpleQueue[PredictBatch | BaseException | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._cancelled: dict[int, set[str]] = {}
        self._thread = threading.Thread(target=self._read, name="ferry-inbox", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def next_batch(self) -> PredictBatch | None:
        """The next batch; None once the frontend has gone. Raises what broke the
        exchange (``codec.ProtocolError``): the worker then exits, to be replaced."""
        item = self._batches.get()
        if isinstance(item, BaseException):
            raise item
        if item is not None:
            self._forget_before(item.batch_id)
        return item

    def is_cancelled(self, batch_id: int, request_id: str) -> bool:
        with self._lock:
            return request_id in self._cancelled.get(batch_id, ())

    def _forget_before(self, batch_id: int) -> None:
        """Cancellations of batches already answered (sent after the answer crossed them)
        are kept no longer."""
        with self._lock:
            for old in [b for b in self._cancelled if b < batch_id]:
                del self._cancelled[old]

    def _read(self) -> None:
        try:
            while (message := self._read_message(self._reader)) is not None:
                if isinstance(message, CancelRequests):
                    with self._lock:
                        self._cancelled.setdefault(message.batch_id, set()).update(
                            message.request_ids
                        )
                elif isinstance(message, PredictBatch):
                    self._batches.put(message)
                else:
                    name = type(message).__name__
                    raise codec.ProtocolError(f"worker got unexpected {name}")
        except BaseException as exc:  # handed to the main thread, which ends the worker
            self._batches.put(exc)
            return
        self._batches.put(None)
